// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/ucx_transport_test.cc
// UCX transport: ranks as threads of this process, each with its own UCP worker (open -> blob
// -> exchange blobs -> connect), under UCX_TLS=tcp,self and tcp,sm,self on loopback. Messages of
// many sizes, reducing receives, mismatches, farewells, a wrong secret, peers that go away, and
// sleeping on the worker's event fd.
#include <catch2/catch.hpp>

#if __has_include(<ucp/api/ucp.h>)  // the transport is built whenever UCX is found

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/params.h"
#include "kernels/reduce/reduce.h"
#include "net/auth.h"
#include "transports/registry.h"
#include "transports/ucx/ucx_transport.h"
#include "transports/ucx/ucx_worker.h"

namespace chorus::ucx {
namespace {

constexpr uint64_t kUid = 0x5eedc0ffee;

UcxOptions options_for(const std::string& tls, size_t chunk_bytes = kDefaultChunkBytes) {
  UcxOptions o;
  o.config = {{"TLS", tls}, {"NET_DEVICES", "lo"}};
  o.chunk_bytes = chunk_bytes;
  return o;
}

struct GroupSpec {
  int n = 2;
  int channels = 1;
  UcxOptions options = options_for("tcp,self");
  std::vector<net::Secret> secrets;  // per rank; empty: one random secret for all
  int deadline_ms = 10000;
  bool separate_hosts = false;  // each rank claims a host of its own
};

// Ranks 0..n-1 of this process, each with its UCX instance and connections to all others.
struct Group {
  std::vector<std::string> blobs;
  std::vector<std::unique_ptr<TransportInstance>> inst;
  std::vector<ConnectionTable> conns;  // [rank][peer index][channel]
  std::vector<std::vector<int>> peers;
  std::vector<Status> status;  // of open + connect, per rank

  Connection* get(int from, int to, int channel = 0) {
    for (size_t i = 0; i < peers[from].size(); ++i)
      if (peers[from][i] == to && i < conns[from].size())
        return conns[from][i][static_cast<size_t>(channel)].get();
    return nullptr;
  }
  // The rank goes away: its connections, then its instance (and UCP worker).
  void destroy(int rank) {
    conns[rank].clear();
    inst[rank].reset();
  }
  // All ranks go together, as ranks that destroy a communicator do.
  ~Group() {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < inst.size(); ++r)
      threads.emplace_back([this, r] { destroy(static_cast<int>(r)); });
    for (auto& t : threads) t.join();
  }
  Group() = default;
  Group(Group&&) = default;
};

// Each rank in its own thread: open -> blob -> (all blobs published) -> connect.
Group build_group(const GroupSpec& spec) {
  const int n = spec.n;
  Group g;
  g.blobs.resize(n);
  g.inst.resize(n);
  g.conns.resize(n);
  g.peers.resize(n);
  g.status.resize(n);
  net::Secret shared = net::Secret::random();
  std::barrier sync(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TransportContext ctx;
      ctx.rank = r;
      ctx.nranks = n;
      ctx.comm_uid = kUid;
      ctx.secret = spec.secrets.empty() ? shared : spec.secrets[r];
      ctx.channels = spec.channels;
      ctx.comm_label = "test comm rank " + std::to_string(r);
      auto opened = open_instance(ctx, spec.options);
      if (opened.ok()) {
        g.inst[r] = std::move(opened).value();
        g.blobs[r] = g.inst[r]->blob();
      } else {
        g.status[r] = opened.take_status();
      }
      sync.arrive_and_wait();
      if (!g.status[r].ok()) return;
      std::vector<EndpointInfo> all(n);
      for (int p = 0; p < n; ++p) {
        all[p].rank = p;
        all[p].host_hash = spec.separate_hosts ? 1 + p : 1;
        all[p].hostname = spec.separate_hosts ? "testhost" + std::to_string(p) : "testhost";
        all[p].pid = getpid();
        all[p].open = !g.blobs[p].empty();
        all[p].blob = g.blobs[p];
        if (p != r) g.peers[r].push_back(p);
      }
      auto conns = g.inst[r]->connect(all, g.peers[r], Deadline::after_ms(spec.deadline_ms));
      if (conns.ok()) {
        g.conns[r] = std::move(conns).value();
      } else {
        g.status[r] = conns.take_status();
      }
    });
  }
  for (auto& t : threads) t.join();
  return g;
}

Group make_group(const GroupSpec& spec) {
  Group g = build_group(spec);
  for (const Status& st : g.status) {
    INFO(st.to_string());
    REQUIRE(st.ok());
  }
  return g;
}

struct Plan {
  Connection* conn = nullptr;
  std::vector<SendRequest*> sends;
  std::vector<RecvRequest*> recvs;
};

// Posts every plan's requests and progresses until all are done (or failed) or `timeout_ms`
// pass, sleeping on the connections' poll fds when nothing moves.
bool drive(const std::vector<Plan>& plans, int timeout_ms = 30000) {
  for (const Plan& p : plans) {
    for (auto* s : p.sends) p.conn->post_send(s);
    for (auto* r : p.recvs) p.conn->post_recv(r);
  }
  Deadline deadline = Deadline::after_ms(timeout_ms);
  auto all_done = [&] {
    for (const Plan& p : plans) {
      for (auto* s : p.sends)
        if (!s->done()) return false;
      for (auto* r : p.recvs)
        if (!r->done()) return false;
    }
    return true;
  };
  while (!all_done()) {
    if (deadline.expired()) return false;
    bool moved = false;
    for (const Plan& p : plans) moved |= p.conn->progress();
    if (moved) continue;
    std::vector<pollfd> fds;
    for (const Plan& p : plans) {
      short events = 0;
      int fd = p.conn->poll_fd(&events);
      if (fd >= 0) fds.push_back(pollfd{fd, events, 0});
    }
    if (!fds.empty()) poll(fds.data(), fds.size(), 10);
  }
  return true;
}

bool drive(Connection* conn, const std::vector<SendRequest*>& sends,
           const std::vector<RecvRequest*>& recvs, int timeout_ms = 30000) {
  return drive({Plan{conn, sends, recvs}}, timeout_ms);
}

MsgTag tag_of(CollKind coll, uint32_t seq, uint64_t count, DataType dtype = DataType::kUint8,
              RedOpKind op = RedOpKind::kSum) {
  MsgTag tag;
  tag.seq = seq;
  tag.coll = static_cast<uint8_t>(coll);
  tag.dtype = static_cast<uint8_t>(dtype);
  tag.redop = static_cast<uint8_t>(op);
  tag.count = count;
  return tag;
}

std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 11));
  return v;
}

void init(SendRequest* s, const void* buf, size_t bytes, const MsgTag& tag) {
  s->buf = buf;
  s->bytes = bytes;
  s->tag = tag;
}

void init(RecvRequest* r, void* dst, size_t bytes, const MsgTag& tag) {
  r->dst = dst;
  r->bytes = bytes;
  r->tag = tag;
}

// Ranks 0 and 1 of `g` send each other `bytes` of distinct patterns at once (channel 0), and
// both arrive whole, with the connection idle and healthy afterwards.
void exchange_both_ways(Group& g, size_t bytes) {
  MsgTag tag = tag_of(CollKind::kSendRecv, 1, bytes);
  std::vector<uint8_t> a = pattern(bytes, 1), b = pattern(bytes, 2);
  std::vector<uint8_t> at0(bytes, 0xee), at1(bytes, 0xee);
  SendRequest s0, s1;
  RecvRequest r0, r1;
  init(&s0, a.data(), bytes, tag);
  init(&s1, b.data(), bytes, tag);
  init(&r0, at0.data(), bytes, tag);
  init(&r1, at1.data(), bytes, tag);
  bool ok1 = false;
  std::thread t([&] { ok1 = drive(g.get(1, 0), {&s1}, {&r1}); });
  bool ok0 = drive(g.get(0, 1), {&s0}, {&r0});
  t.join();
  REQUIRE(ok0);
  REQUIRE(ok1);
  CHECK_FALSE(s0.failed());
  CHECK_FALSE(r0.failed());
  CHECK_FALSE(r1.failed());
  CHECK(at0 == b);
  CHECK(at1 == a);
  CHECK(r0.bytes_done.load() == bytes);
  CHECK(s0.bytes_done.load() == bytes);
  CHECK(g.get(0, 1)->idle());
  CHECK(g.get(0, 1)->error().ok());
}

double elapsed_ms(int64_t since_ns) { return static_cast<double>(now_ns() - since_ns) / 1e6; }

}  // namespace

TEST_CASE("ucx: tags keep communicators, kinds, channels and ranks apart", "[unit][ucx]") {
  const uint32_t h = comm_hash(kUid);
  CHECK(h < (1u << 24));
  CHECK(comm_hash(kUid) != comm_hash(kUid + 1));
  CHECK(make_tag(h, Kind::kHeader, 0, 1) != make_tag(h, Kind::kPayload, 0, 1));
  CHECK(make_tag(h, Kind::kHeader, 0, 1) != make_tag(h, Kind::kHeader, 1, 1));
  CHECK(make_tag(h, Kind::kHeader, 0, 1) != make_tag(h, Kind::kHeader, 0, 2));
  CHECK(make_tag(h, Kind::kHeader, 255, kMaxRanks - 1) ==
        ((uint64_t{h} << 40) | (uint64_t{0xff} << 28) | uint64_t{kMaxRanks - 1}));
  CHECK(((make_tag(h, Kind::kHello, 3, 7) >> 36) & 0xf) == 3);

  // The hello proves the secret and names who talks to whom.
  net::Secret secret = net::Secret::random();
  uint8_t hello[kHelloBytes];
  Hello h01{0, 1, 2, kUid};
  encode_hello(h01, secret, hello);
  CHECK(check_hello(hello, sizeof(hello), h01, secret, "rank 0").ok());
  Status wrong = check_hello(hello, sizeof(hello), h01, net::Secret::random(), "rank 0 (x)");
  CHECK(wrong.code() == Code::kRemoteError);
  CHECK_THAT(wrong.message(), Catch::Contains("rejected: wrong secret"));
  CHECK_THAT(wrong.message(), Catch::Contains("rank 0 (x)"));
  Status other_channel = check_hello(hello, sizeof(hello), Hello{0, 1, 3, kUid}, secret, "r0");
  CHECK_THAT(other_channel.message(), Catch::Contains("channel 2"));
  CHECK_FALSE(check_hello(hello, sizeof(hello) - 1, h01, secret, "r0").ok());
  hello[40] ^= 1;  // a bit of the MAC
  CHECK_THAT(check_hello(hello, sizeof(hello), h01, secret, "r0").message(),
             Catch::Contains("wrong secret"));
}

TEST_CASE("ucx: messages of 0, 1, 4 KiB and 1 MiB+3 bytes cross in both directions",
          "[unit][ucx]") {
  // tcp,sm,self: UCX 1.13 cannot detect peer failure over shared memory, so endpoints with
  // error handling (ours) use tcp on loopback even between ranks of one host.
  const std::string tls = GENERATE(as<std::string>{}, "tcp,self", "tcp,sm,self");
  INFO("UCX_TLS=" << tls);
  GroupSpec spec;
  spec.options = options_for(tls);
  Group g = make_group(spec);
  CHECK_THAT(describe_lanes(g.inst[0].get(), 1), Catch::Contains("tcp/lo"));
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, size_t{kMaxInlineBytes},
                       size_t{kMaxInlineBytes + 1}, (size_t{1} << 20) + 3}) {
    INFO("bytes " << bytes);
    exchange_both_ways(g, bytes);
  }
}

TEST_CASE("ucx: three ranks, two channels: every pair, in posting order", "[unit][ucx]") {
  GroupSpec spec;
  spec.n = 3;
  spec.channels = 2;
  spec.options = options_for("tcp,self", 64 << 10);  // many chunks per large message
  Group g = make_group(spec);
  const int kMessages = 10;
  auto size_of = [](int i) { return static_cast<size_t>(i * i * 26399) % 700001; };
  // payload[from][to][channel][i]
  auto seed = [](int from, int to, int c, int i) {
    return static_cast<uint8_t>(from * 64 + to * 16 + c * 8 + i);
  };
  struct RankWork {
    std::vector<std::vector<uint8_t>> out, in, expect;
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    std::vector<Plan> plans;
  };
  std::vector<RankWork> work(3);
  for (int r = 0; r < 3; ++r) {
    RankWork& w = work[r];
    w.sends = std::vector<SendRequest>(2 * 2 * kMessages);
    w.recvs = std::vector<RecvRequest>(2 * 2 * kMessages);
    size_t k = 0;
    for (int p : g.peers[r]) {
      for (int c = 0; c < 2; ++c) {
        Plan plan;
        plan.conn = g.get(r, p, c);
        for (int i = 0; i < kMessages; ++i, ++k) {
          size_t bytes = size_of(i + c);
          MsgTag tag = tag_of(CollKind::kAllGather, static_cast<uint32_t>(i), bytes);
          w.out.push_back(pattern(bytes, seed(r, p, c, i)));
          w.expect.push_back(pattern(bytes, seed(p, r, c, i)));
          w.in.emplace_back(bytes);
          init(&w.sends[k], w.out.back().data(), bytes, tag);
          init(&w.recvs[k], w.in.back().data(), bytes, tag);
          plan.sends.push_back(&w.sends[k]);
          plan.recvs.push_back(&w.recvs[k]);
        }
        w.plans.push_back(plan);
      }
    }
  }
  std::vector<int> ok(3, 0);
  std::vector<std::thread> threads;
  int64_t start = now_ns();
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { ok[r] = drive(work[r].plans); });
  for (auto& t : threads) t.join();
  INFO("took " << elapsed_ms(start) << " ms");
  for (int r = 0; r < 3; ++r) {
    REQUIRE(ok[r]);
    for (size_t k = 0; k < work[r].in.size(); ++k) {
      INFO("rank " << r << " message " << k);
      CHECK_FALSE(work[r].recvs[k].failed());
      CHECK(work[r].in[k] == work[r].expect[k]);
    }
  }
}

TEST_CASE("ucx: reducing receives: float sum of non-integer data equals the scalar sum",
          "[unit][ucx]") {
  GroupSpec spec;
  spec.options = options_for("tcp,self", 64 << 10);  // double-buffered through 64 KiB chunks
  Group g = make_group(spec);
  auto sum = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  for (size_t count : {size_t{1}, size_t{100}, size_t{2036}, size_t{300001}}) {
    for (bool in_place : {false, true}) {
      INFO("count " << count << (in_place ? " in place" : " out of place"));
      std::vector<float> incoming(count), mine(count), out(count, -1.0f), expected(count);
      for (size_t i = 0; i < count; ++i) {
        incoming[i] = static_cast<float>(i % 1013) * 0.37f - 100.25f;
        mine[i] = static_cast<float>((i * 7) % 997) * 0.113f + 1.0f / 3.0f;
        float e = mine[i];
        e += incoming[i];
        expected[i] = e;
      }
      if (in_place) out = mine;
      size_t bytes = count * sizeof(float);
      MsgTag tag = tag_of(CollKind::kAllReduce, 3, count, DataType::kFloat32, RedOpKind::kSum);
      SendRequest s;
      init(&s, incoming.data(), bytes, tag);
      RecvRequest r;
      init(&r, out.data(), bytes, tag);
      r.src = in_place ? out.data() : mine.data();
      r.reduce = sum;
      r.elem_size = sizeof(float);
      bool ok_send = false;
      std::thread t([&] { ok_send = drive(g.get(0, 1), {&s}, {}); });
      bool ok_recv = drive(g.get(1, 0), {}, {&r});
      t.join();
      REQUIRE(ok_send);
      REQUIRE(ok_recv);
      REQUIRE_FALSE(r.failed());
      CHECK(std::memcmp(out.data(), expected.data(), bytes) == 0);
    }
  }
}

TEST_CASE("ucx: a tag mismatch names both operations, and the sender learns why",
          "[unit][ucx]") {
  Group g = make_group(GroupSpec{});
  std::vector<float> data(8, 1.5f), dst(8);
  SendRequest s;
  init(&s, data.data(), 32, tag_of(CollKind::kAllGather, 5, 8, DataType::kFloat32));
  RecvRequest r;
  init(&r, dst.data(), 32, tag_of(CollKind::kAllReduce, 5, 8, DataType::kFloat32, RedOpKind::kSum));
  REQUIRE(drive(g.get(1, 0), {&s}, {}));
  CHECK_FALSE(s.failed());
  REQUIRE(drive(g.get(0, 1), {}, {&r}));
  CHECK(r.failed());
  Status st = g.get(0, 1)->error();
  CHECK(st.code() == Code::kInvalidUsage);
  CHECK_THAT(st.message(), Catch::Contains("rank 1 sent AllGather #5"));
  CHECK_THAT(st.message(), Catch::Contains("rank 0 expects AllReduce #5"));
  // The connection is unusable afterwards: new requests fail at once.
  RecvRequest again;
  init(&again, dst.data(), 32, r.tag);
  g.get(0, 1)->post_recv(&again);
  CHECK(again.failed());
  // Rank 0's farewell reaches rank 1: its next receive fails with the same code and reason.
  RecvRequest next;
  init(&next, dst.data(), 32, tag_of(CollKind::kAllGather, 6, 8, DataType::kFloat32));
  REQUIRE(drive(g.get(1, 0), {}, {&next}, 10000));
  CHECK(next.failed());
  Status told = g.get(1, 0)->error();
  CHECK(told.code() == Code::kInvalidUsage);
  CHECK_THAT(told.message(), Catch::Contains("rank 0 (host testhost, pid"));
  CHECK_THAT(told.message(), Catch::Contains("gave up"));
  CHECK_THAT(told.message(), Catch::Contains("rank 0 expects AllReduce #5"));
}

TEST_CASE("ucx: a size mismatch is a clear error, not a truncation", "[unit][ucx]") {
  GroupSpec spec;
  spec.options = options_for("tcp,self", 64 << 10);
  struct Case {
    size_t sent, expected;
  };
  for (Case c : {Case{100, 64}, Case{64, 100}, Case{(size_t{1} << 20) + 3, size_t{1} << 20}}) {
    INFO("sent " << c.sent << ", expected " << c.expected);
    Group fresh = make_group(spec);
    std::vector<uint8_t> src = pattern(c.sent, 9), dst(c.expected);
    MsgTag tag = tag_of(CollKind::kBroadcast, 2, 0);  // the same operation, other sizes
    SendRequest s;
    init(&s, src.data(), c.sent, tag);
    RecvRequest r;
    init(&r, dst.data(), c.expected, tag);
    bool ok_send = false;
    std::thread t([&] { ok_send = drive(fresh.get(1, 0), {&s}, {}, 10000); });
    REQUIRE(drive(fresh.get(0, 1), {}, {&r}));
    t.join();
    CHECK(r.failed());
    Status st = fresh.get(0, 1)->error();
    CHECK(st.code() == Code::kInvalidUsage);
    CHECK_THAT(st.message(), Catch::Contains(std::to_string(c.sent) + " bytes but rank 0"));
    CHECK_THAT(st.message(),
               Catch::Contains("in a message of " + std::to_string(c.expected) + " bytes from it"));
    // A large sender waits for a receive that never comes: rank 0's farewell fails it.
    if (c.sent > kMaxInlineBytes) {
      CHECK(ok_send);
      CHECK(s.failed());
      CHECK(fresh.get(1, 0)->error().code() == Code::kInvalidUsage);
    }
  }
}

TEST_CASE("ucx: a farewell delivers the reason to a receiver and to a sender", "[unit][ucx]") {
  Group g = make_group(GroupSpec{});
  // Rank 1 waits for a message; rank 0 gives up instead of sending it.
  std::vector<uint8_t> dst(1000);
  RecvRequest r;
  init(&r, dst.data(), dst.size(), tag_of(CollKind::kBroadcast, 9, 1000));
  g.get(0, 1)->farewell(invalid_usage("custom reason 42"));
  REQUIRE(drive(g.get(1, 0), {}, {&r}, 10000));
  CHECK(r.failed());
  Status st = g.get(1, 0)->error();
  CHECK(st.code() == Code::kInvalidUsage);
  CHECK_THAT(st.message(), Catch::Contains("rank 0 (host testhost, pid"));
  CHECK_THAT(st.message(), Catch::Contains("Broadcast #9"));
  CHECK_THAT(st.message(), Catch::Contains("custom reason 42"));

  // Rank 1 of another pair streams 4 MiB (rendezvous: it waits for rank 0's receive), and rank
  // 0 gives up: the sender fails with rank 0's reason.
  Group h = make_group(GroupSpec{});
  std::vector<uint8_t> big(4 << 20, 0x11);
  SendRequest s;
  init(&s, big.data(), big.size(), tag_of(CollKind::kSend, 1, big.size()));
  h.get(1, 0)->post_send(&s);
  for (int i = 0; i < 20; ++i) h.get(1, 0)->progress();
  h.get(0, 1)->farewell(remote_error("rank 0 lost its GPU"));
  Deadline d = Deadline::after_ms(10000);
  while (!s.done() && !d.expired()) {
    h.get(1, 0)->progress();
    usleep(1000);
  }
  CHECK(s.failed());
  CHECK(h.get(1, 0)->error().code() == Code::kRemoteError);
  CHECK_THAT(h.get(1, 0)->error().message(), Catch::Contains("rank 0 lost its GPU"));
  CHECK_THAT(h.get(1, 0)->error().message(), Catch::Contains("sending Send #1"));
}

TEST_CASE("ucx: a wrong secret is refused with an error naming the peer", "[unit][ucx]") {
  GroupSpec spec;
  spec.secrets = {net::Secret::random(), net::Secret::random()};
  spec.deadline_ms = 5000;
  int64_t start = now_ns();
  Group g = build_group(spec);
  double ms = elapsed_ms(start);
  CHECK(ms < 5000);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << g.status[r].to_string());
    CHECK(g.status[r].code() == Code::kRemoteError);
    CHECK_THAT(g.status[r].message(), Catch::Contains("rejected: wrong secret"));
    CHECK_THAT(g.status[r].message(),
               Catch::Contains("rank " + std::to_string(1 - r) + " (host testhost, pid"));
  }
}

TEST_CASE("ucx: a peer that goes away mid-transfer fails the pending receive, naming it",
          "[unit][ucx]") {
  GroupSpec spec;
  spec.options = options_for("tcp,self", 64 << 10);
  Group g = make_group(spec);
  std::vector<uint8_t> big(32 << 20, 0x5a), dst(big.size());
  MsgTag tag = tag_of(CollKind::kBroadcast, 4, big.size());
  SendRequest s;
  init(&s, big.data(), big.size(), tag);
  RecvRequest r;
  init(&r, dst.data(), dst.size(), tag);
  std::atomic<int> phase{0};  // 1: rank 0 saw data arrive; 2: rank 1 is gone
  std::thread sender([&] {
    Connection* c = g.get(1, 0);
    c->post_send(&s);
    while (phase.load() == 0 && !s.done()) c->progress();
    g.destroy(1);
    phase.store(2);
  });
  Connection* c = g.get(0, 1);
  c->post_recv(&r);
  Deadline d = Deadline::after_ms(20000);
  while (r.bytes_done.load() == 0 && !r.done() && !d.expired()) c->progress();
  REQUIRE(r.bytes_done.load() > 0);
  REQUIRE(r.bytes_done.load() < r.bytes);  // (or the test proves nothing)
  phase.store(1);  // rank 0 pauses while rank 1 goes away
  while (phase.load() != 2) std::this_thread::yield();
  sender.join();
  int64_t start = now_ns();
  while (!r.done() && !d.expired()) {
    if (!c->progress()) {
      short events = 0;
      int fd = c->poll_fd(&events);
      pollfd p{fd, events, 0};
      poll(&p, fd >= 0 ? 1 : 0, 10);
    }
  }
  double ms = elapsed_ms(start);
  INFO("failed after " << ms << " ms: " << c->error().to_string());
  CHECK(r.failed());
  CHECK(ms < 10000);
  CHECK(c->error().code() == Code::kRemoteError);
  CHECK_THAT(c->error().message(), Catch::Contains("rank 1 (host testhost, pid"));
  CHECK_THAT(c->error().message(), Catch::Contains("Broadcast #4"));
}

TEST_CASE("ucx: a rank that goes away fails waiting peers, and the others carry on", "[unit][ucx]") {
  GroupSpec spec;
  spec.n = 3;
  Group g = make_group(spec);
  std::vector<uint8_t> dst(5000);
  RecvRequest r;
  init(&r, dst.data(), dst.size(), tag_of(CollKind::kReduce, 7, 5000));
  g.get(0, 2)->post_recv(&r);
  g.get(0, 2)->progress();
  g.destroy(2);
  int64_t start = now_ns();
  Deadline d = Deadline::after_ms(20000);
  while (!r.done() && !d.expired()) {
    if (!g.get(0, 2)->progress()) {
      short events = 0;
      int fd = g.get(0, 2)->poll_fd(&events);
      pollfd p{fd, events, 0};
      poll(&p, fd >= 0 ? 1 : 0, 100);
    }
  }
  double ms = elapsed_ms(start);
  Status st = g.get(0, 2)->error();
  INFO("failed after " << ms << " ms: " << st.to_string());
  CHECK(r.failed());
  CHECK(ms < 10000);
  CHECK(st.code() == Code::kRemoteError);
  CHECK_THAT(st.message(), Catch::Contains("rank 2 (host testhost, pid"));
  CHECK_THAT(st.message(), Catch::Contains("Reduce #7"));

  // Ranks 0 and 1 still talk.
  std::vector<uint8_t> a = pattern(70000, 3), b(70000);
  SendRequest s;
  RecvRequest r1;
  init(&s, a.data(), a.size(), tag_of(CollKind::kSend, 1, a.size()));
  init(&r1, b.data(), b.size(), tag_of(CollKind::kSend, 1, a.size()));
  std::thread t([&] { drive(g.get(1, 0), {}, {&r1}); });
  REQUIRE(drive(g.get(0, 1), {&s}, {}));
  t.join();
  CHECK_FALSE(r1.failed());
  CHECK(a == b);
}

TEST_CASE("ucx: a sleeping rank wakes on its worker's event fd", "[unit][ucx]") {
  Group g = make_group(GroupSpec{});
  for (size_t bytes : {size_t{64}, size_t{3} << 20}) {
    INFO("bytes " << bytes);
    std::vector<uint8_t> a = pattern(bytes, 4), b(bytes);
    MsgTag tag = tag_of(CollKind::kSend, 2, bytes);
    SendRequest s;
    RecvRequest r;
    init(&s, a.data(), bytes, tag);
    init(&r, b.data(), bytes, tag);
    std::thread t([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      drive(g.get(1, 0), {&s}, {});
    });
    Connection* c = g.get(0, 1);
    c->post_recv(&r);
    int64_t start = now_ns();
    int sleeps = 0, busy = 0;
    while (!r.done() && elapsed_ms(start) < 20000) {
      if (c->progress()) continue;
      short events = 0;
      int fd = c->poll_fd(&events);
      REQUIRE(fd >= 0);
      pollfd p{fd, events, 0};
      int64_t before = now_ns();
      poll(&p, 1, 5000);  // a missed wake-up costs 5 s
      if (elapsed_ms(before) < 1) {
        ++busy;
      } else {
        ++sleeps;
      }
    }
    t.join();
    double ms = elapsed_ms(start);
    INFO("done after " << ms << " ms, " << sleeps << " sleeps, " << busy << " short waits");
    CHECK_FALSE(r.failed());
    CHECK(a == b);
    CHECK(ms < 2500);
    CHECK(busy < 2000);  // UCS_ERR_BUSY must not turn into a spin
  }
}

TEST_CASE("ucx: UCX_TLS=sm,self between ranks of one host: endpoints without failure handling",
          "[unit][ucx]") {
  // UCX 1.13's shared-memory transports have no peer failure handler: for a same-host peer the
  // endpoint is made without one (core's liveness watch covers such peers) and carries data.
  GroupSpec spec;
  spec.options = options_for("sm,self");
  Group g = make_group(spec);
  CHECK_THAT(describe_lanes(g.inst[0].get(), 1), Catch::Contains("/memory"));
  CHECK_THAT(describe_lanes(g.inst[0].get(), 1), !Catch::Contains("tcp"));
  for (size_t bytes : {size_t{0}, size_t{5}, (size_t{1} << 20) + 3}) {
    INFO("bytes " << bytes);
    exchange_both_ways(g, bytes);
  }
}

TEST_CASE("ucx: registered memory goes with its UCP memory handle", "[unit][ucx][reg]") {
  // The handle is what UCX's rendezvous protocols would otherwise look up (or register) per
  // message; over tcp and sm it must at least be accepted and leave the data intact.
  const std::string tls = GENERATE(as<std::string>{}, "tcp,self", "sm,self");
  INFO("UCX_TLS=" << tls);
  GroupSpec spec;
  spec.options = options_for(tls, 64 << 10);  // 17 payload messages per 1 MiB + 3 bytes
  Group g = make_group(spec);
  const size_t bytes = (size_t{1} << 20) + 3;
  const size_t chunks = (bytes + (64 << 10) - 1) / (64 << 10);
  std::vector<uint8_t> a = pattern(bytes, 3), b = pattern(bytes, 4);
  std::vector<uint8_t> at0(bytes + 64, 0xee), at1(bytes + 64, 0xee);
  const MemhStats before = memh_stats();

  // Each rank's factory maps whole ranges; a send or receive inside one passes its handle.
  std::vector<std::unique_ptr<RegistrationKey>> keys;
  auto key_for = [&](int rank, const void* base, size_t n) {
    KeyFactory make = g.inst[rank]->key_factory();
    REQUIRE(make);
    Result<std::unique_ptr<RegistrationKey>> key = make(RegisteredRange{base, n, std::nullopt});
    REQUIRE(key.ok());
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    REQUIRE(ucp_mem_query(static_cast<MemoryKey*>(key->get())->memh(), &attr) == UCS_OK);
    CHECK(attr.address == base);
    CHECK(attr.length >= n);
    keys.push_back(std::move(key).value());
    return keys.back().get();
  };
  MsgTag tag = tag_of(CollKind::kSendRecv, 1, bytes);
  SendRequest s0, s1;
  RecvRequest r0, r1;
  init(&s0, a.data(), bytes, tag);
  init(&s1, b.data(), bytes, tag);
  init(&r0, at0.data() + 64, bytes, tag);  // inside the registered range, not at its start
  init(&r1, at1.data() + 64, bytes, tag);
  s0.key = key_for(0, a.data(), bytes);
  r0.key = key_for(0, at0.data(), at0.size());
  s1.key = key_for(1, b.data(), bytes);
  r1.key = key_for(1, at1.data(), at1.size());
  CHECK(memh_stats().mapped - before.mapped == 4);
  bool ok1 = false;
  std::thread t([&] { ok1 = drive(g.get(1, 0), {&s1}, {&r1}); });
  bool ok0 = drive(g.get(0, 1), {&s0}, {&r0});
  t.join();
  REQUIRE(ok0);
  REQUIRE(ok1);
  CHECK_FALSE(s0.failed());
  CHECK_FALSE(s1.failed());
  CHECK_FALSE(r0.failed());
  CHECK_FALSE(r1.failed());
  CHECK(std::equal(b.begin(), b.end(), at0.begin() + 64));
  CHECK(std::equal(a.begin(), a.end(), at1.begin() + 64));
  const MemhStats after = memh_stats();
  CHECK(after.sends - before.sends == 2 * chunks);
  CHECK(after.recvs - before.recvs == 2 * chunks);

  // A reducing receive lands in the transport's bounce buffer: its key is not used.
  std::vector<float> mine(bytes / 4, 0.25f), incoming(bytes / 4, 1.5f), out(bytes / 4);
  MsgTag ftag = tag_of(CollKind::kAllReduce, 2, mine.size(), DataType::kFloat32);
  SendRequest s;
  init(&s, incoming.data(), mine.size() * 4, ftag);
  s.key = key_for(1, incoming.data(), mine.size() * 4);
  RecvRequest r;
  init(&r, out.data(), mine.size() * 4, ftag);
  r.src = mine.data();
  r.reduce = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  r.elem_size = 4;
  r.key = key_for(0, out.data(), mine.size() * 4);
  bool sent = false;
  std::thread t2([&] { sent = drive(g.get(1, 0), {&s}, {}); });
  bool received = drive(g.get(0, 1), {}, {&r});
  t2.join();
  REQUIRE(sent);
  REQUIRE(received);
  CHECK_FALSE(r.failed());
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 1.75f; }));
  CHECK(memh_stats().sends - after.sends == (mine.size() * 4 + (64 << 10) - 1) / (64 << 10));
  CHECK(memh_stats().recvs == after.recvs);

  // Releasing a key unmaps its handle (no operation was left in flight).
  keys.clear();
  CHECK(memh_stats().unmapped - before.unmapped == 6);
}

TEST_CASE("ucx: UCX_TLS=sm,self cannot reach a peer on another host: connect fails clearly",
          "[unit][ucx]") {
  // Another host needs a transport with peer failure handling: no endpoint, a clear error, no
  // hang.
  GroupSpec spec;
  spec.options = options_for("sm,self");
  spec.separate_hosts = true;
  spec.deadline_ms = 5000;
  int64_t start = now_ns();
  Group g = build_group(spec);
  CHECK(elapsed_ms(start) < 5000);
  for (int r = 0; r < 2; ++r) {
    INFO(g.status[r].to_string());
    REQUIRE_FALSE(g.status[r].ok());
    if (g.inst[r] != nullptr) {  // open worked; the endpoint could not be made
      CHECK(g.status[r].code() == Code::kRemoteError);
      CHECK_THAT(g.status[r].message(), Catch::Contains("cannot create an endpoint"));
      CHECK_THAT(g.status[r].message(), Catch::Contains("UCX_TLS=sm,self"));
      CHECK_THAT(g.status[r].message(), Catch::Contains("another host"));
    }
  }
}

TEST_CASE("ucx: the transport registers as 'ucx' with a cost above tcp's", "[unit][ucx]") {
  const TransportDesc* ucx = find_transport("UCX");
  REQUIRE(ucx != nullptr);
  CHECK(std::string(ucx->name) == "ucx");
  CHECK(ucx->caps.reach == TransportCaps::Reach::kAnyHost);
  const TransportDesc* tcp = find_transport("tcp");
  REQUIRE(tcp != nullptr);
  for (size_t bytes : {size_t{0}, size_t{1} << 10, size_t{1} << 20, size_t{1} << 30})
    CHECK(ucx->cost.time_us(bytes) > tcp->cost.time_us(bytes));
}

// Sets environment variables for one scope (and re-reads Chorus's parameters), then restores
// them.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
      if (value != nullptr) {
        setenv(name, value, 1);
      } else {
        unsetenv(name);
      }
    }
    params::reload_for_testing();
  }
  ~ScopedEnv() {
    for (const Saved& s : saved_) {
      if (s.was_set) {
        setenv(s.name.c_str(), s.value.c_str(), 1);
      } else {
        unsetenv(s.name.c_str());
      }
    }
    params::reload_for_testing();
  }

 private:
  struct Saved {
    std::string name;
    bool was_set;
    std::string value;
  };
  std::vector<Saved> saved_;
};

TEST_CASE("ucx: the probe opens UCX only when forced or measured", "[unit][ucx]") {
  const TransportDesc* desc = find_transport("ucx");
  REQUIRE(desc != nullptr);
  TransportContext ctx;
  ctx.rank = 0;
  ctx.nranks = 2;
  char tuner[] = "/tmp/chorus_ucx_tuner_XXXXXX";
  int fd = mkstemp(tuner);
  REQUIRE(fd >= 0);
  close(fd);
  auto write_tuner = [&](const char* text) {
    FILE* f = std::fopen(tuner, "w");
    REQUIRE(f != nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  // Whatever this process's default UCP context becomes, it stays on loopback.
  ScopedEnv ucx_env({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}});
  {
    ScopedEnv env({{"CHORUS_TRANSPORT", "TCP"}, {"CHORUS_TUNER_FILE", nullptr}});
    auto inst = desc->open(ctx);
    REQUIRE(inst.ok());
    CHECK(inst.value() == nullptr);
  }
  {
    ScopedEnv env({{"CHORUS_TRANSPORT", nullptr}, {"CHORUS_TUNER_FILE", nullptr}});
    auto inst = desc->open(ctx);
    REQUIRE(inst.ok());
    CHECK(inst.value() == nullptr);
  }
  write_tuner("# measured\ntcp 25 1\n  # ucx 1 100\n");
  {
    ScopedEnv env({{"CHORUS_TRANSPORT", "auto"}, {"CHORUS_TUNER_FILE", tuner}});
    auto inst = desc->open(ctx);
    REQUIRE(inst.ok());
    CHECK(inst.value() == nullptr);
  }
  write_tuner("tcp 25 1\nUCX 3.5 12\n");
  {
    ScopedEnv env({{"CHORUS_TRANSPORT", nullptr}, {"CHORUS_TUNER_FILE", tuner}});
    auto inst = desc->open(ctx);
    INFO(inst.status().to_string());
    REQUIRE(inst.ok());
    CHECK(inst.value() != nullptr);
  }
  {
    ScopedEnv env({{"CHORUS_TRANSPORT", "Ucx"}, {"CHORUS_TUNER_FILE", nullptr}});
    auto inst = desc->open(ctx);
    INFO(inst.status().to_string());
    REQUIRE(inst.ok());
    REQUIRE(inst.value() != nullptr);
    CHECK_FALSE(inst.value()->blob().empty());
    CHECK(inst.value()->blob().size() <= kMaxTransportBlob);
  }
  unlink(tuner);
}

TEST_CASE("ucx: options are checked", "[unit][ucx]") {
  TransportContext ctx;
  ctx.rank = 0;
  ctx.nranks = 2;
  UcxOptions o = options_for("tcp,self", 100);  // not a multiple of 64
  CHECK(open_instance(ctx, o).status().code() == Code::kInvalidArgument);
  o = options_for("tcp,self");
  ctx.channels = kMaxChannels + 1;
  CHECK(open_instance(ctx, o).status().code() == Code::kInvalidArgument);
  ctx.channels = 1;
  o.config.push_back({"RNDV_THRESH", "not a size"});
  Status bad = open_instance(ctx, o).status();
  CHECK(bad.code() == Code::kInvalidArgument);
  CHECK_THAT(bad.message(), Catch::Contains("UCX_RNDV_THRESH=not a size"));
}

}  // namespace chorus::ucx

#endif  // __has_include(<ucp/api/ucp.h>)
