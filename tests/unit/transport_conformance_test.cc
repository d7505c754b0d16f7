// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/transport_conformance_test.cc
// What every registered transport must do alike (transports/transport.h, transports/protocol.h),
// checked over each of them through the registry, as core would open and connect them: two
// ranks as threads of this process. A new transport is covered by being registered.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "kernels/reduce/reduce.h"
#include "net/auth.h"
#include "support/scoped_env.h"
#include "transports/chunk.h"
#include "transports/registry.h"

namespace chorus {
namespace {

// Two ranks of one communicator connected over one transport.
struct Pair {
  std::vector<std::string> blobs = std::vector<std::string>(2);
  std::vector<std::unique_ptr<TransportInstance>> inst = std::vector<std::unique_ptr<TransportInstance>>(2);
  std::vector<ConnectionTable> conns = std::vector<ConnectionTable>(2);
  std::vector<Status> status = std::vector<Status>(2);
  // Per rank, written by that rank's thread: false when open gave no instance (the transport is
  // not usable here).
  bool opened[2] = {true, true};

  Connection* conn(int rank) { return conns[rank][0][0].get(); }
};

// The environment a transport needs to be opened in a test: UCX is opt-in and goes over its
// tcp transport on loopback.
struct TransportEnv {
  explicit TransportEnv(const std::string& name) {
    if (name != "ucx") return;
    vars.push_back(std::make_unique<test::ScopedEnv>("CHORUS_TRANSPORT", "UCX"));
    vars.push_back(std::make_unique<test::ScopedEnv>("UCX_TLS", "tcp,self"));
    vars.push_back(std::make_unique<test::ScopedEnv>("UCX_NET_DEVICES", "lo"));
  }
  std::vector<std::unique_ptr<test::ScopedEnv>> vars;
};

void connect_pair(const TransportDesc& desc, Pair* pair, int channels = 1) {
  net::Secret secret = net::Secret::random();
  const uint64_t uid = 0xc0f0 + static_cast<uint64_t>(getpid());
  std::barrier sync(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TransportContext ctx;
      ctx.rank = r;
      ctx.nranks = 2;
      ctx.comm_uid = uid;
      ctx.secret = secret;
      ctx.comm_label = "conformance rank " + std::to_string(r);
      ctx.channels = channels;
      auto opened = desc.open(ctx);
      if (!opened.ok()) {
        pair->status[r] = opened.take_status();
      } else if (opened.value() == nullptr) {
        pair->opened[r] = false;
      } else {
        pair->inst[r] = std::move(opened).value();
        pair->blobs[r] = pair->inst[r]->blob();
      }
      sync.arrive_and_wait();
      if (pair->inst[0] == nullptr || pair->inst[1] == nullptr) return;
      std::vector<EndpointInfo> all(2);
      for (int p = 0; p < 2; ++p) {
        all[p].rank = p;
        all[p].host_hash = 1;
        all[p].hostname = "testhost";
        all[p].pid = getpid();
        all[p].process_token = 7;
        all[p].open = true;
        all[p].blob = pair->blobs[p];
      }
      auto conns = pair->inst[r]->connect(all, {1 - r}, Deadline::after_ms(10000));
      if (conns.ok()) {
        pair->conns[r] = std::move(conns).value();
      } else {
        pair->status[r] = conns.take_status();
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Whether either side made progress; both were called (both arguments are evaluated).
bool progress_both(bool a, bool b) { return a || b; }

// Calls `progress` (both ends, true if anything moved) from this thread until every request is
// done (or failed), at most 20 s.
template <typename Progress>
bool drive_with(Progress progress, const std::vector<Request*>& reqs) {
  Deadline deadline = Deadline::after_ms(20000);
  for (;;) {
    bool all_done = true;
    for (const Request* r : reqs) all_done = all_done && r->done();
    if (all_done) return true;
    if (deadline.expired()) return false;
    if (!progress()) std::this_thread::yield();
  }
}

bool drive(Pair& pair, const std::vector<Request*>& reqs) {
  return drive_with(
      [&] { return progress_both(pair.conn(0)->progress(), pair.conn(1)->progress()); }, reqs);
}

MsgTag tag_of(uint32_t seq, uint64_t count) {
  MsgTag tag;
  tag.seq = seq;
  tag.coll = static_cast<uint8_t>(CollKind::kSend);
  tag.dtype = static_cast<uint8_t>(DataType::kFloat32);
  tag.root = 0;
  tag.count = count;
  return tag;
}

// CHORUS_TEST_TRANSPORTS="verbs,tcp" limits the transports checked (the rdma tests run the
// suite over verbs alone, inside a guest with soft-RoCE); empty: all.
bool selected(const std::string& name) {
  const char* list = std::getenv("CHORUS_TEST_TRANSPORTS");
  if (list == nullptr || *list == '\0') return true;
  const std::string padded = "," + std::string(list) + ",";
  return padded.find("," + name + ",") != std::string::npos;
}

// Runs `body` over every registered transport usable in this process (direct, shm and tcp
// always are), or over those CHORUS_TEST_TRANSPORTS names, each of which must be usable.
template <typename Body>
void for_each_transport(Body body, int channels = 1) {
  int ran = 0;
  const bool all = std::getenv("CHORUS_TEST_TRANSPORTS") == nullptr;
  for (const TransportDesc* desc : transports()) {
    if (!selected(desc->name)) continue;
    TransportEnv env(desc->name);
    Pair pair;
    connect_pair(*desc, &pair, channels);
    if (!pair.opened[0] || !pair.opened[1]) {
      WARN("transport " << desc->name << " is not usable here; skipped");
      CHECK(all);  // named in CHORUS_TEST_TRANSPORTS: it must be usable
      continue;
    }
    INFO("transport " << desc->name << ": " << pair.status[0].to_string() << " / "
                      << pair.status[1].to_string());
    REQUIRE(pair.status[0].ok());
    REQUIRE(pair.status[1].ok());
    body(desc->name, pair);
    ++ran;
  }
  CHECK(ran >= (all ? 3 : 1));
}

}  // namespace

TEST_CASE("every transport: a receive can learn its size from the sender", "[unit][transport]") {
  for_each_transport([](const std::string& name, Pair& pair) {
    constexpr size_t kRoom = (size_t{2} << 20) + 64;  // bytes of room in every receive
    uint32_t seq = 1;
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, (size_t{1} << 18) + 5}) {
      const size_t bytes = count * sizeof(float);
      INFO(name << ": " << count << " floats");
      std::vector<float> sent(count);
      for (size_t i = 0; i < count; ++i) sent[i] = 0.37f * static_cast<float>(i) - 11.5f;
      std::vector<uint8_t> got(kRoom, 0xab);
      SendRequest s;
      s.buf = sent.data();
      s.bytes = bytes;
      s.tag = tag_of(seq, count);
      RecvRequest r;
      r.size_from_sender = true;
      r.dst = got.data();
      r.bytes = kRoom;
      r.tag = tag_of(seq, 0);  // the count is the sender's to say
      ++seq;
      pair.conn(1)->post_recv(&r);
      pair.conn(0)->post_send(&s);
      REQUIRE(drive(pair, {&s, &r}));
      REQUIRE_FALSE(r.failed());
      REQUIRE_FALSE(s.failed());
      CHECK(r.bytes == bytes);
      CHECK(r.tag.count == count);
      CHECK(std::equal(got.begin(), got.begin() + static_cast<ptrdiff_t>(bytes),
                       reinterpret_cast<const uint8_t*>(sent.data())));
      CHECK(got[bytes] == 0xab);  // nothing written past what was sent
      CHECK(got[kRoom - 1] == 0xab);
    }
    // A plain receive of the same kind still works after them (the stream stayed in step).
    std::vector<float> sent = {1.25f, -2.5f};
    std::vector<float> got(2);
    SendRequest s;
    s.buf = sent.data();
    s.bytes = 8;
    s.tag = tag_of(seq, 2);
    RecvRequest r;
    r.dst = got.data();
    r.bytes = 8;
    r.tag = tag_of(seq, 2);
    pair.conn(1)->post_recv(&r);
    pair.conn(0)->post_send(&s);
    REQUIRE(drive(pair, {&s, &r}));
    CHECK_FALSE(r.failed());
    CHECK(got == sent);
  });
}

TEST_CASE("every transport: more than a receive has room for is ncclInvalidUsage",
          "[unit][transport]") {
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    std::vector<float> sent(100, 0.5f);
    std::vector<float> got(50);
    SendRequest s;
    s.buf = sent.data();
    s.bytes = sent.size() * sizeof(float);
    s.tag = tag_of(1, sent.size());
    RecvRequest r;
    r.size_from_sender = true;
    r.dst = got.data();
    r.bytes = got.size() * sizeof(float);
    r.tag = tag_of(1, 0);
    pair.conn(1)->post_recv(&r);
    pair.conn(0)->post_send(&s);
    drive(pair, {&r});
    REQUIRE(r.failed());
    const Status& why = pair.conn(1)->error();
    CHECK(why.code() == Code::kInvalidUsage);
    CHECK_THAT(why.message(), Catch::Contains("400 bytes") && Catch::Contains("room for 200"));
  });
}

TEST_CASE("every transport: a reducing receive must know its size", "[unit][transport]") {
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    std::vector<float> acc(4, 1.0f);
    RecvRequest r;
    r.size_from_sender = true;
    r.dst = acc.data();
    r.src = acc.data();
    r.bytes = acc.size() * sizeof(float);
    r.tag = tag_of(1, 0);
    r.reduce = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
    r.elem_size = sizeof(float);
    pair.conn(1)->post_recv(&r);
    drive(pair, {&r});
    REQUIRE(r.failed());
    CHECK(pair.conn(1)->error().code() == Code::kInvalidUsage);
    CHECK_THAT(pair.conn(1)->error().message(), Catch::Contains("must know its size"));
  });
}

}  // namespace chorus

// ---- The chunk layer (transports/chunk.h) over every transport, three paths per pair ----

namespace chorus {
namespace {

constexpr int kPaths = 3;
constexpr size_t kChunk = 64 << 10;

// Both ends of a pair as the chunk layer sees them.
struct Links {
  explicit Links(Pair& p, size_t chunk0 = kChunk, size_t chunk1 = kChunk, bool adaptive = true)
      : pair(p) {
    for (int r = 0; r < 2; ++r) {
      std::vector<Connection*> paths;
      for (auto& c : pair.conns[r][0]) paths.push_back(c.get());
      link[r] = std::make_unique<PeerLink>(r, 1 - r, std::move(paths), r == 0 ? chunk0 : chunk1,
                                           adaptive);
    }
  }
  // The connections go first: they may hold the links' chunks (as in Comm::close_connections).
  ~Links() {
    for (auto& table : pair.conns) table.clear();
  }
  Pair& pair;
  std::unique_ptr<PeerLink> link[2];
};

bool drive_links(Links& l, const std::vector<Request*>& reqs) {
  return drive_with(
      [&] { return progress_both(l.link[0]->progress(), l.link[1]->progress()); }, reqs);
}

MsgTag message_tag(uint32_t seq, uint64_t count, uint32_t lane, uint32_t ordinal,
                   CollKind coll = CollKind::kAllReduce) {
  MsgTag tag = tag_of(seq, count);
  tag.coll = static_cast<uint8_t>(coll);
  tag.set_message(lane, ordinal);
  return tag;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x >> 8) % 100000) / 997.0f;  // non-integer
  }
  return v;
}

}  // namespace

TEST_CASE("every transport: a message cut into chunks over three paths arrives whole",
          "[unit][transport][chunk]") {
  for (bool adaptive : {false, true}) {
    for_each_transport([adaptive](const std::string& name, Pair& pair) {
      INFO(name << (adaptive ? ", adaptive routing" : ", static striping"));
      Links l(pair, kChunk, kChunk, adaptive);
      const size_t count = (size_t{1} << 18) + 3;  // 16 chunks and a short 17th
      std::vector<float> sent = random_floats(count, 1), got(count, -1.0f);
      SendRequest s;
      s.buf = sent.data();
      s.bytes = count * sizeof(float);
      s.tag = message_tag(7, count, 1, 0);
      RecvRequest r;
      r.dst = got.data();
      r.bytes = s.bytes;
      r.tag = message_tag(7, count, 1, 0);
      l.link[1]->post_recv(&r);
      l.link[0]->post_send(&s);
      REQUIRE(drive_links(l, {&s, &r}));
      REQUIRE_FALSE(s.failed());
      REQUIRE_FALSE(r.failed());
      CHECK(got == sent);
      CHECK(r.bytes_done.load() == r.bytes);
      CHECK(s.bytes_done.load() == s.bytes);
      // Every path carried chunks (striped: a third each; adaptive: as fast as each went, the
      // first round on every path), both ways counted, and the completions carry their times.
      uint64_t bytes = 0;
      for (size_t p = 0; p < kPaths; ++p) {
        CHECK(l.link[0]->path_stats(p).chunks >= (adaptive ? 1u : 5u));
        CHECK(l.link[1]->path_stats(p).chunks == l.link[0]->path_stats(p).chunks);
        CHECK(l.link[0]->path_stats(p).sent_chunks == l.link[0]->path_stats(p).chunks);
        bytes += l.link[1]->path_stats(p).bytes;
      }
      CHECK(bytes == r.bytes);
      CHECK(r.posted_ns > 0);
      CHECK(r.done_ns >= r.posted_ns);
      CHECK(s.done_ns >= s.posted_ns);
      CHECK(l.link[0]->idle());
      CHECK(l.link[1]->idle());
    }, kPaths);
  }
}

TEST_CASE("every transport: receives match by message, not by posting order",
          "[unit][transport][chunk]") {
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    Links l(pair);
    // Two operations in flight: the sender sends A (two messages on lane 0, one of them split)
    // then B; the receiver posts B first, then A's second message, then its first.
    const size_t big = (size_t{1} << 17) + 1, small = 5;
    std::vector<float> a0 = random_floats(big, 2), a1 = random_floats(small, 3),
                       b0 = random_floats(big, 4);
    std::vector<float> ga0(big), ga1(small), gb0(big);
    SendRequest s[3];
    const std::vector<float>* bufs[3] = {&a0, &a1, &b0};
    const MsgTag tags[3] = {message_tag(11, 64, 0, 0), message_tag(11, 64, 0, 1),
                            message_tag(12, 64, 0, 0, CollKind::kAllGather)};
    for (int i = 0; i < 3; ++i) {
      s[i].buf = bufs[i]->data();
      s[i].bytes = bufs[i]->size() * sizeof(float);
      s[i].tag = tags[i];
    }
    RecvRequest r[3];
    std::vector<float>* dsts[3] = {&ga0, &ga1, &gb0};
    for (int i = 0; i < 3; ++i) {
      r[i].dst = dsts[i]->data();
      r[i].bytes = dsts[i]->size() * sizeof(float);
      r[i].tag = tags[i];
    }
    l.link[1]->post_recv(&r[2]);
    l.link[1]->post_recv(&r[1]);
    l.link[1]->post_recv(&r[0]);
    for (auto& x : s) l.link[0]->post_send(&x);
    REQUIRE(drive_links(l, {&s[0], &s[1], &s[2], &r[0], &r[1], &r[2]}));
    for (int i = 0; i < 3; ++i) {
      CHECK_FALSE(r[i].failed());
      CHECK(*dsts[i] == *bufs[i]);
    }
  }, kPaths);
}

TEST_CASE("every transport: chunks reduce on arrival and size themselves from the sender",
          "[unit][transport][chunk]") {
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    Links l(pair);
    const size_t count = (size_t{1} << 17) + 7;
    std::vector<float> mine = random_floats(count, 5), theirs = random_floats(count, 6);
    std::vector<float> acc(count), want(count);
    for (size_t i = 0; i < count; ++i) want[i] = mine[i] + theirs[i];  // what the kernel does
    SendRequest s;
    s.buf = theirs.data();
    s.bytes = count * sizeof(float);
    s.tag = message_tag(3, count, 2, 0);
    RecvRequest r;
    r.dst = acc.data();
    r.src = mine.data();
    r.bytes = s.bytes;
    r.reduce = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
    r.elem_size = sizeof(float);
    r.tag = s.tag;
    l.link[1]->post_recv(&r);
    l.link[0]->post_send(&s);
    REQUIRE(drive_links(l, {&s, &r}));
    REQUIRE_FALSE(r.failed());
    CHECK(acc == want);

    // A receive with room for more learns the size of a message of several chunks.
    std::vector<float> sent = random_floats(count, 8);
    std::vector<float> got(2 * count, 0.0f);
    SendRequest s2;
    s2.buf = sent.data();
    s2.bytes = count * sizeof(float);
    s2.tag = message_tag(4, count, 0, 0, CollKind::kSend);
    RecvRequest r2;
    r2.size_from_sender = true;
    r2.dst = got.data();
    r2.bytes = got.size() * sizeof(float);
    r2.tag = message_tag(4, 0, 0, 0, CollKind::kSend);
    l.link[1]->post_recv(&r2);
    l.link[0]->post_send(&s2);
    REQUIRE(drive_links(l, {&s2, &r2}));
    REQUIRE_FALSE(r2.failed());
    CHECK(r2.bytes == s2.bytes);
    CHECK(r2.tag.count == count);
    CHECK(std::equal(sent.begin(), sent.end(), got.begin()));
    CHECK(got[count] == 0.0f);
  }, kPaths);
}

TEST_CASE("every transport: the chunk layer names both calls of a mismatch, and a chunk size "
          "that differs", "[unit][transport][chunk]") {
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    Links l(pair);
    std::vector<float> sent(8, 0.5f), got(8);
    SendRequest s;
    s.buf = sent.data();
    s.bytes = 32;
    s.tag = message_tag(3, 8, 0, 0, CollKind::kAllGather);
    RecvRequest r;
    r.dst = got.data();
    r.bytes = 32;
    r.tag = message_tag(3, 8, 0, 0, CollKind::kAllReduce);
    l.link[1]->post_recv(&r);
    l.link[0]->post_send(&s);
    drive_links(l, {&r});
    REQUIRE(r.failed());
    l.link[1]->progress();
    const Status& why = l.link[1]->error();
    CHECK(why.code() == Code::kInvalidUsage);
    CHECK_THAT(why.message(), Catch::Contains("AllGather #3") && Catch::Contains("AllReduce #3") &&
                                  Catch::Contains("expects"));
  }, kPaths);
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    Links l(pair, kChunk, 2 * kChunk);
    const size_t count = size_t{1} << 17;
    std::vector<float> sent = random_floats(count, 9), got(count);
    SendRequest s;
    s.buf = sent.data();
    s.bytes = count * sizeof(float);
    s.tag = message_tag(5, count, 0, 0);
    RecvRequest r;
    r.dst = got.data();
    r.bytes = s.bytes;
    r.tag = s.tag;
    l.link[1]->post_recv(&r);
    l.link[0]->post_send(&s);
    drive_links(l, {&r});
    REQUIRE(r.failed());
    CHECK_THAT(l.link[1]->error().message(), Catch::Contains("CHORUS_PATH_CHUNK_BYTES"));
  }, kPaths);
}

TEST_CASE("every transport: a path the peer closed between messages fails no receive while "
          "another path may still bring it; the last one closing does", "[unit][transport][chunk]") {
  // The peer's communicator going away closes its paths one after the other, and what it sent
  // on one path may be seen after another's close (over TCP a FIN on one rail can overtake
  // data on another; CI saw exactly that).
  for_each_transport([](const std::string& name, Pair& pair) {
    INFO(name);
    std::vector<Connection*> paths;
    for (auto& c : pair.conns[1][0]) paths.push_back(c.get());
    PeerLink receiver(1, 0, std::move(paths), kChunk);
    std::vector<float> sent = random_floats(16, 3), got(16, -1.0f), more(16, -1.0f);
    RecvRequest r;
    r.dst = got.data();
    r.bytes = 64;
    r.tag = message_tag(4, 16, 0, 0);
    receiver.post_recv(&r);
    receiver.progress();
    pair.conns[0][0][2].reset();  // the sender closes path 2 first
    Deadline seen = Deadline::after_ms(10000);
    while (pair.conns[1][0][2]->peer_closed().ok() && !seen.expired()) receiver.progress();
    REQUIRE_FALSE(pair.conns[1][0][2]->peer_closed().ok());
    CHECK_THAT(pair.conns[1][0][2]->peer_closed().message(), Catch::Contains("rank 0"));
    CHECK(pair.conns[1][0][2]->error().ok());
    CHECK(receiver.error().ok());
    CHECK_FALSE(r.done());

    // The message on path 0 still arrives.
    SendRequest s;
    s.buf = sent.data();
    s.bytes = 64;
    s.tag = r.tag;
    s.tag.set_chunk(0, true);
    Connection* path0 = pair.conns[0][0][0].get();
    path0->post_send(&s);
    REQUIRE(drive_with([&] { return progress_both(path0->progress(), receiver.progress()); },
                       {&s, &r}));
    REQUIRE_FALSE(r.failed());
    CHECK(got == sent);
    CHECK(receiver.error().ok());

    // Once every path is closed, a receive waiting for the peer fails, naming it.
    RecvRequest r2;
    r2.dst = more.data();
    r2.bytes = 64;
    r2.tag = message_tag(5, 16, 1, 0);
    receiver.post_recv(&r2);
    pair.conns[0][0].clear();
    REQUIRE(drive_with([&] { return receiver.progress(); }, {&r2}));
    CHECK(r2.failed());
    CHECK(receiver.error().code() == Code::kRemoteError);
    CHECK_THAT(receiver.error().message(), Catch::Contains("rank 0"));
    // A receive posted on a closed path fails at once with its reason.
    RecvRequest r3;
    r3.dst = more.data();
    r3.bytes = 64;
    r3.tag = message_tag(6, 16, 2, 0);
    r3.tag.set_chunk(0, true);
    pair.conns[1][0][2]->post_recv(&r3);
    drive_with([&] { return pair.conns[1][0][2]->progress(); }, {&r3});
    CHECK(r3.failed());
    CHECK_FALSE(pair.conns[1][0][2]->error().ok());
    pair.conns[1][0].clear();  // before the link that points at them
  }, kPaths);
}

}  // namespace chorus
