// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/tcp_transport_test.cc
// TCP transport: ranks as threads of this process, each with its own loopback listener,
// connect, exchange messages of many sizes, reduce on receive, and report mismatches, peers
// that go away and intruders.
#include "transports/tcp/tcp_transport.h"

#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <deque>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "net/auth.h"
#include "bootstrap/wire.h"
#include "common/dtype.h"
#include "kernels/reduce/reduce.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_mender.h"

namespace chorus::tcp {
namespace {

constexpr uint64_t kUid = 0xc0ffee;

// Ranks 0..n-1 of this process, each connected to every other one.
struct Group {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<TcpSetup> setups;
  std::vector<TcpConnections> conns;  // [rank][peer index][channel]

  Connection* get(int from, int to, int channel = 0) {
    const auto& peers = setups[from].peers;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].rank == to) return conns[from][i][channel].get();
    }
    return nullptr;
  }
  void close(int from, int to) {
    const auto& peers = setups[from].peers;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].rank == to) conns[from][i].clear();
    }
  }
};

std::unique_ptr<TcpListener> loopback_listener() {
  auto addr = net::SockAddr::parse("127.0.0.1", 0);
  REQUIRE(addr.ok());
  auto listener = TcpListener::create(*addr);
  REQUIRE(listener.ok());
  return std::move(listener).value();
}

std::vector<TcpSetup> make_setups(const std::vector<std::unique_ptr<TcpListener>>& listeners,
                                  const net::Secret& secret, int channels, size_t bounce) {
  int n = static_cast<int>(listeners.size());
  std::vector<TcpSetup> setups(n);
  for (int r = 0; r < n; ++r) {
    TcpSetup& s = setups[r];
    s.rank = r;
    s.comm_uid = kUid;
    s.secret = secret;
    s.channels = channels;
    s.bounce_bytes = bounce;
    s.listener = listeners[r].get();
    s.deadline = Deadline::after_ms(10000);
    for (int p = 0; p < n; ++p) {
      if (p != r) s.peers.push_back(TcpPeer{p, listeners[p]->address()});
    }
  }
  return setups;
}

// Runs connect_all for every rank concurrently; statuses come back to the main thread.
std::vector<Status> run_setups(std::vector<TcpSetup>& setups, std::vector<TcpConnections>* out) {
  size_t n = setups.size();
  std::vector<Status> status(n);
  out->resize(n);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto conns = connect_all(setups[r]);
      if (conns.ok())
        (*out)[r] = std::move(conns).value();
      else
        status[r] = conns.take_status();
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

Group make_group(int n, int channels = 1, size_t bounce = 1 << 20) {
  Group g;
  for (int r = 0; r < n; ++r) g.listeners.push_back(loopback_listener());
  g.setups = make_setups(g.listeners, net::Secret::random(), channels, bounce);
  for (const Status& st : run_setups(g.setups, &g.conns)) {
    INFO(st.to_string());
    REQUIRE(st.ok());
  }
  return g;
}

// Posts the requests on `conn` and progresses it until all are done or 20 s pass.
bool drive(Connection* conn, const std::vector<SendRequest*>& sends,
           const std::vector<RecvRequest*>& recvs) {
  for (auto* s : sends) conn->post_send(s);
  for (auto* r : recvs) conn->post_recv(r);
  Deadline deadline = Deadline::after_ms(20000);
  auto all_done = [&] {
    for (auto* s : sends)
      if (!s->done()) return false;
    for (auto* r : recvs)
      if (!r->done()) return false;
    return true;
  };
  while (!all_done()) {
    if (deadline.expired()) return false;
    if (!conn->progress()) {
      short events = 0;
      int fd = conn->poll_fd(&events);
      if (fd >= 0) {
        pollfd pfd{fd, events, 0};
        poll(&pfd, 1, 10);
      }
    }
  }
  return true;
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

// Requests are not copyable: they are filled in place.
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

}  // namespace

TEST_CASE("tcp: messages of many sizes cross in both directions", "[unit][tcp]") {
  Group g = make_group(2);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, (size_t{3} << 20) + 5}) {
    INFO("bytes " << bytes);
    MsgTag tag = tag_of(CollKind::kSendRecv, 1, bytes);
    std::vector<uint8_t> a = pattern(bytes, 1), b = pattern(bytes, 2);
    std::vector<uint8_t> at0(bytes), at1(bytes);
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
    CHECK(at0 == b);
    CHECK(at1 == a);
    CHECK(r0.bytes_done.load() == bytes);
    CHECK(g.get(0, 1)->idle());
  }
}

TEST_CASE("tcp: queued sends and receives match in posting order", "[unit][tcp]") {
  Group g = make_group(3, 2);
  const int kMessages = 12;
  std::vector<std::vector<uint8_t>> payloads, received(kMessages);
  std::vector<SendRequest> sends(kMessages);
  std::vector<RecvRequest> recvs(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    size_t bytes = static_cast<size_t>(i * i * 997) % 300000;
    payloads.push_back(pattern(bytes, static_cast<uint8_t>(i)));
    received[i].resize(bytes);
    MsgTag tag = tag_of(CollKind::kAllGather, i, bytes);
    init(&sends[i], payloads[i].data(), bytes, tag);
    init(&recvs[i], received[i].data(), bytes, tag);
  }
  std::vector<SendRequest*> sp;
  std::vector<RecvRequest*> rp;
  for (int i = 0; i < kMessages; ++i) {
    sp.push_back(&sends[i]);
    rp.push_back(&recvs[i]);
  }
  // Rank 2 streams to rank 1 on channel 1.
  bool ok_recv = false;
  std::thread t([&] { ok_recv = drive(g.get(1, 2, 1), {}, rp); });
  bool ok_send = drive(g.get(2, 1, 1), sp, {});
  t.join();
  REQUIRE(ok_send);
  REQUIRE(ok_recv);
  for (int i = 0; i < kMessages; ++i) CHECK(received[i] == payloads[i]);
}

TEMPLATE_TEST_CASE("tcp: reducing receives combine through a small bounce buffer", "[unit][tcp]",
                   float, int32_t) {
  constexpr bool kFloat = std::is_same_v<TestType, float>;
  DataType dtype = kFloat ? DataType::kFloat32 : DataType::kInt32;
  auto op = kFloat ? kernels::ReduceOp::kSum : kernels::ReduceOp::kMax;
  // 4099 bytes: not a multiple of the element size, so elements straddle refills.
  Group g = make_group(2, 1, 4099);
  for (bool in_place : {false, true}) {
    const size_t count = 300001;
    std::vector<TestType> incoming(count), mine(count), out(count), expected(count);
    for (size_t i = 0; i < count; ++i) {
      incoming[i] = static_cast<TestType>(static_cast<int>(i % 1000) - 500);
      mine[i] = static_cast<TestType>(static_cast<int>((i * 7) % 1000) - 500);
      expected[i] = kFloat ? mine[i] + incoming[i] : std::max(mine[i], incoming[i]);
    }
    if (in_place) out = mine;
    size_t bytes = count * sizeof(TestType);
    MsgTag tag =
        tag_of(CollKind::kAllReduce, 3, count, dtype, kFloat ? RedOpKind::kSum : RedOpKind::kMax);
    SendRequest s;
    init(&s, incoming.data(), bytes, tag);
    RecvRequest r;
    init(&r, out.data(), bytes, tag);
    r.src = in_place ? out.data() : mine.data();
    r.reduce = kernels::reduce_fn(dtype, op);
    r.elem_size = sizeof(TestType);
    bool ok_send = false;
    std::thread t([&] { ok_send = drive(g.get(0, 1), {&s}, {}); });
    bool ok_recv = drive(g.get(1, 0), {}, {&r});
    t.join();
    REQUIRE(ok_send);
    REQUIRE(ok_recv);
    REQUIRE_FALSE(r.failed());
    CHECK(out == expected);
  }
}

TEST_CASE("tcp: a tag mismatch names both operations", "[unit][tcp]") {
  Group g = make_group(2);
  std::vector<float> data(8, 1.0f), dst(8);
  SendRequest s;
  init(&s, data.data(), 32, tag_of(CollKind::kAllGather, 5, 8, DataType::kFloat32));
  RecvRequest r;
  init(&r, dst.data(), 32, tag_of(CollKind::kAllReduce, 5, 8, DataType::kFloat32, RedOpKind::kSum));
  bool ok_send = drive(g.get(1, 0), {&s}, {});
  REQUIRE(ok_send);
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
}

TEST_CASE("tcp: a peer that closes fails pending receives and sends", "[unit][tcp]") {
  Group g = make_group(3);
  // Rank 1 waits for a message that rank 0 never sends.
  std::vector<uint8_t> dst(1000);
  RecvRequest r;
  init(&r, dst.data(), dst.size(), tag_of(CollKind::kBroadcast, 9, 1000));
  g.close(0, 1);
  REQUIRE(drive(g.get(1, 0), {}, {&r}));
  CHECK(r.failed());
  Status st = g.get(1, 0)->error();
  CHECK(st.code() == Code::kRemoteError);
  CHECK_THAT(st.message(), Catch::Contains("rank 0 ("));
  CHECK_THAT(st.message(), Catch::Contains("closed the connection"));
  CHECK_THAT(st.message(), Catch::Contains("Broadcast #9"));

  // Rank 2 streams far more than the socket buffers hold to rank 1, which goes away.
  std::vector<uint8_t> big(64 << 20, 0x11);
  SendRequest s;
  init(&s, big.data(), big.size(), tag_of(CollKind::kSend, 1, big.size()));
  g.close(1, 2);
  REQUIRE(drive(g.get(2, 1), {&s}, {}));
  CHECK(s.failed());
  CHECK(g.get(2, 1)->error().code() == Code::kRemoteError);
  CHECK_THAT(g.get(2, 1)->error().message(), Catch::Contains("rank 1 ("));
}

TEST_CASE("tcp: intruders are dropped while the ranks connect", "[unit][tcp]") {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  for (int r = 0; r < 2; ++r) listeners.push_back(loopback_listener());
  net::Secret secret = net::Secret::random();
  auto setups = make_setups(listeners, secret, 2, 1 << 20);
  const net::SockAddr target = listeners[1]->address();  // rank 1 accepts from rank 0
  // Rank 1 starts accepting; rank 0 only starts once the intruders have been judged.
  Result<TcpConnections> rank1(internal_error("not run"));
  std::thread accepting([&] { rank1 = connect_all(setups[1]); });
  Status wrong_secret, bad_ident;
  {
    auto fd = net::connect_socket(target, Deadline::after_ms(3000));
    REQUIRE(fd.ok());
    wrong_secret = net::auth_initiator(fd->get(), net::Secret::random(),
                                             auth_context(kUid), Deadline::after_ms(3000));
  }
  {
    // The right secret, but an identity that is not an expected peer: refused after auth.
    auto fd = net::connect_socket(target, Deadline::after_ms(3000));
    REQUIRE(fd.ok());
    REQUIRE(
        net::auth_initiator(fd->get(), secret, auth_context(kUid), Deadline::after_ms(3000))
            .ok());
    uint8_t ident[24] = {};
    bootstrap::wire::put_u32(ident, 0x43485449);
    bootstrap::wire::put_u32(ident + 4, 7);  // rank 7 does not exist
    bootstrap::wire::put_u64(ident + 16, kUid);
    uint8_t ack[8] = {};
    bad_ident = net::send_all(fd->get(), ident, sizeof(ident), Deadline::after_ms(3000));
    if (bad_ident.ok())
      bad_ident = net::recv_all(fd->get(), ack, sizeof(ack), Deadline::after_ms(3000));
    if (bad_ident.ok() && bootstrap::wire::get_u32(ack + 4) != 0)
      bad_ident = remote_error("refused");
  }
  auto rank0 = connect_all(setups[0]);
  accepting.join();
  CHECK(wrong_secret.code() == Code::kRemoteError);
  CHECK_THAT(wrong_secret.message(), Catch::Contains("authentication failed"));
  CHECK_FALSE(bad_ident.ok());
  INFO(rank0.status().to_string() << " / " << rank1.status().to_string());
  REQUIRE(rank0.ok());
  REQUIRE(rank1.ok());
  REQUIRE(rank1->size() == 1);
  CHECK(rank1->at(0).size() == 2);
  CHECK(rank1->at(0)[1] != nullptr);
}

TEST_CASE("tcp: a missing peer times out with a message naming it", "[unit][tcp]") {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  for (int r = 0; r < 3; ++r) listeners.push_back(loopback_listener());
  auto setups = make_setups(listeners, net::Secret::random(), 1, 1 << 20);
  // Rank 1 alone: rank 0 never connects to it, rank 2 never accepts.
  setups[1].deadline = Deadline::after_ms(400);
  auto result = connect_all(setups[1]);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == Code::kRemoteError);
  CHECK_THAT(result.status().message(), Catch::Contains("rank 0 ("));
  CHECK_THAT(result.status().message(), Catch::Contains("rank 2 ("));
  CHECK_THAT(result.status().message(), Catch::Contains("CHORUS_CONNECT_TIMEOUT_MS"));
}

}  // namespace chorus::tcp

namespace chorus::tcp {
namespace {

// Both ranks' connections to each other (`channels` of them) joined as failover groups, as the
// plug-in does for a peer on several rails; with `mend`, each rank's mender reconnects failed
// channels on its listener.
void join_groups(Group& g, bool mend = false, int channels = 2) {
  for (int r = 0; r < 2; ++r) {
    auto group = std::make_shared<TcpPeerGroup>();
    for (int c = 0; c < channels; ++c)
      group->members.push_back(static_cast<TcpConnection*>(g.get(r, 1 - r, c)));
    if (mend) {
      group->mender = std::make_shared<TcpMender>(r, kUid, g.setups[r].secret,
                                                  g.listeners[r]->fd());
      group->mender->add(group.get());
    }
    for (TcpConnection* m : group->members) m->join_group(group);
  }
}

// Messages on every channel in both directions, every third one on channels >= 1 a reducing
// receive of random floats; `cut` runs once rank 0 has completed `cut_after` of its sends on
// channel `cut_channel`. Progresses every connection from this thread until everything is done
// or fails, or 30 s pass; true if everything completed.
struct Traffic {
  static constexpr int kMessages = 30;
  struct Message {
    std::vector<float> sent, mine, got, expected;
    SendRequest s;
    RecvRequest r;
  };
  const int channels;
  std::vector<std::unique_ptr<Message>> msgs;  // [from][channel][i]

  Message& at(int from, int channel, int i) {
    return *msgs[(from * channels + channel) * kMessages + i];
  }

  explicit Traffic(uint32_t seed, int channels_ = 2) : channels(channels_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(-3.0f, 3.0f);
    for (int k = 0; k < 2 * channels * kMessages; ++k) msgs.push_back(std::make_unique<Message>());
    for (int from = 0; from < 2; ++from) {
      for (int c = 0; c < channels; ++c) {
        for (int i = 0; i < kMessages; ++i) {
          Message& m = at(from, c, i);
          const size_t count = (static_cast<size_t>(i) * i * 7919 + 13) % 200000 + 1;
          const bool reduce = c >= 1 && i % 3 == 0;
          m.sent.resize(count);
          for (float& v : m.sent) v = value(rng);
          m.got.assign(count, 0.0f);
          m.expected = m.sent;
          MsgTag tag = tag_of(reduce ? CollKind::kAllReduce : CollKind::kSendRecv,
                              static_cast<uint32_t>(i + 1), count, DataType::kFloat32);
          init(&m.s, m.sent.data(), count * sizeof(float), tag);
          init(&m.r, m.got.data(), count * sizeof(float), tag);
          if (reduce) {
            m.mine.resize(count);
            for (size_t k = 0; k < count; ++k) {
              m.mine[k] = value(rng);
              m.expected[k] = m.mine[k] + m.sent[k];
            }
            m.r.src = m.mine.data();
            m.r.reduce = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
            m.r.elem_size = sizeof(float);
          }
        }
      }
    }
  }

  // Every message arrived whole: nothing failed, each receive holds what was sent (or reduced).
  void require_all_right() const {
    for (const auto& m : msgs) {
      REQUIRE_FALSE(m->s.failed());
      REQUIRE_FALSE(m->r.failed());
      REQUIRE(m->got == m->expected);
    }
  }
  int failed() const {
    int n = 0;
    for (const auto& m : msgs) n += m->s.failed() + m->r.failed();
    return n;
  }

  bool run(Group& g, int cut_after, const std::function<void()>& cut, int cut_channel = 1) {
    for (int from = 0; from < 2; ++from) {
      for (int c = 0; c < channels; ++c) {
        for (int i = 0; i < kMessages; ++i) {
          g.get(from, 1 - from, c)->post_send(&at(from, c, i).s);
          g.get(1 - from, from, c)->post_recv(&at(from, c, i).r);
        }
      }
    }
    bool cut_done = cut == nullptr;
    Deadline deadline = Deadline::after_ms(30000);
    for (;;) {
      int open = 0, sent_on_1 = 0;
      for (auto& m : msgs) open += !m->s.done() + !m->r.done();
      for (int i = 0; i < kMessages; ++i) sent_on_1 += at(0, cut_channel, i).s.done();
      if (open == 0) return true;
      if (deadline.expired()) return false;
      if (!cut_done && sent_on_1 >= cut_after) {
        cut();
        cut_done = true;
      }
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < channels; ++c) g.get(r, 1 - r, c)->progress();
    }
  }
};

}  // namespace

TEST_CASE("tcp: a failed channel's traffic continues on its sibling, in order and intact",
          "[unit][tcp]") {
  // A bounce buffer of 4099 bytes: reduced elements straddle refills, also across the switch.
  Group g = make_group(2, 2, 4099);
  join_groups(g);
  Traffic t(7);
  short events = 0;
  const int fd = g.get(0, 1, 1)->poll_fd(&events);
  // Rank 0's channel 1 stops sending mid-stream (its writes fail; rank 1 reads an early end).
  REQUIRE(t.run(g, 8, [&] { ::shutdown(fd, SHUT_WR); }));
  auto* c01 = static_cast<TcpConnection*>(g.get(0, 1, 1));
  auto* c10 = static_cast<TcpConnection*>(g.get(1, 0, 1));
  CHECK(c01->abandoned());
  CHECK(c10->abandoned());
  t.require_all_right();
  // The abandoned channel keeps working, through its sibling.
  Traffic more(8);
  REQUIRE(more.run(g, 0, nullptr));
  more.require_all_right();
  CHECK(g.get(0, 1, 1)->error().ok());
}

TEST_CASE("tcp: a failed channel is reconnected in the background and carries its own traffic "
          "again", "[unit][tcp]") {
  Group g = make_group(2, 2, 4099);
  join_groups(g, true);
  Traffic t(11);
  short events = 0;
  const int fd = g.get(0, 1, 1)->poll_fd(&events);
  REQUIRE(t.run(g, 8, [&] { ::shutdown(fd, SHUT_WR); }));
  t.require_all_right();
  auto* c01 = static_cast<TcpConnection*>(g.get(0, 1, 1));
  auto* c10 = static_cast<TcpConnection*>(g.get(1, 0, 1));
  // The menders reconnect within about a second; the switch back happens as traffic flows.
  Deadline deadline = Deadline::after_ms(20000);
  int rounds = 0;
  while ((c01->abandoned() || c10->abandoned()) && !deadline.expired()) {
    Traffic more(static_cast<uint32_t>(100 + rounds++));
    REQUIRE(more.run(g, 0, nullptr));
    more.require_all_right();
  }
  INFO("rounds of traffic while waiting: " << rounds);
  CHECK_FALSE(c01->abandoned());
  CHECK_FALSE(c10->abandoned());
  // Back to normal: it carries its traffic, and a later failure is survived again.
  Traffic after(12);
  const int fd_new = c01->poll_fd(&events);
  REQUIRE(after.run(g, 8, [&] { ::shutdown(fd_new, SHUT_WR); }));
  after.require_all_right();
}

TEST_CASE("tcp: a channel that was reading ahead as a carrier can fail over itself",
          "[unit][tcp]") {
  Group g = make_group(2, 2, 4099);
  join_groups(g);
  Connection* c01 = g.get(0, 1, 0);
  auto* c10 = static_cast<TcpConnection*>(g.get(1, 0, 0));
  auto progress_all = [&] {
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) g.get(r, 1 - r, c)->progress();
  };
  // Rank 0 sends 8 messages on channel 0; rank 1 takes the first, and its channel reads the
  // other 7 ahead (as when channel 1 looked stalled) while nobody has asked for them.
  constexpr int kCount = 8;
  constexpr size_t kBytes = 48 << 10;
  std::vector<std::vector<uint8_t>> sent, got(kCount, std::vector<uint8_t>(kBytes));
  std::vector<SendRequest> sends(kCount);
  std::vector<RecvRequest> recvs(kCount);
  for (int i = 0; i < kCount; ++i) {
    sent.push_back(pattern(kBytes, static_cast<uint8_t>(i * 29 + 1)));
    const MsgTag tag = tag_of(CollKind::kSendRecv, static_cast<uint32_t>(i + 1), kBytes);
    init(&sends[i], sent[i].data(), kBytes, tag);
    init(&recvs[i], got[i].data(), kBytes, tag);
    c01->post_send(&sends[i]);
  }
  c10->post_recv(&recvs[0]);
  Deadline deadline = Deadline::after_ms(20000);
  auto run_until = [&](const std::function<bool()>& done) {
    while (!done() && !deadline.expired()) progress_all();
    return done();
  };
  REQUIRE(run_until([&] {
    for (auto& s : sends)
      if (!s.done()) return false;
    return recvs[0].done();
  }));
  c10->read_ahead();
  // Then rank 1's channel 0 fails on its own side (its writes): what it read ahead and has not
  // passed on yet must still reach its reader, in order, before what comes through channel 1.
  std::vector<uint8_t> back = pattern(kBytes, 77), back_got(kBytes);
  SendRequest bs;
  RecvRequest br;
  const MsgTag back_tag = tag_of(CollKind::kSendRecv, 100, kBytes);
  init(&bs, back.data(), kBytes, back_tag);
  init(&br, back_got.data(), kBytes, back_tag);
  short events = 0;
  ::shutdown(c10->poll_fd(&events), SHUT_WR);
  c10->post_send(&bs);
  c01->post_recv(&br);
  REQUIRE(run_until([&] { return c10->abandoned(); }));
  for (int i = 1; i < kCount; ++i) c10->post_recv(&recvs[i]);
  REQUIRE(run_until([&] {
    for (auto& r : recvs)
      if (!r.done()) return false;
    return bs.done() && br.done();
  }));
  CHECK(c10->abandoned());
  for (int i = 0; i < kCount; ++i) {
    REQUIRE_FALSE(recvs[i].failed());
    REQUIRE(got[i] == sent[i]);
  }
  REQUIRE_FALSE(bs.failed());
  REQUIRE_FALSE(br.failed());
  CHECK(back_got == back);
}

TEST_CASE("tcp: with three channels, two may fail one after the other; the first carries both",
          "[unit][tcp]") {
  Group g = make_group(2, 3, 4099);
  join_groups(g, false, 3);
  short events = 0;
  const int fd1 = g.get(0, 1, 1)->poll_fd(&events);
  const int fd2 = g.get(1, 0, 2)->poll_fd(&events);
  Traffic t(13, 3);
  REQUIRE(t.run(g, 8, [&] { ::shutdown(fd1, SHUT_WR); }, 1));
  Traffic t2(14, 3);
  REQUIRE(t2.run(g, 8, [&] { ::shutdown(fd2, SHUT_WR); }, 2));
  t.require_all_right();
  t2.require_all_right();
  for (int r = 0; r < 2; ++r) {
    CHECK_FALSE(static_cast<TcpConnection*>(g.get(r, 1 - r, 0))->abandoned());
    CHECK(static_cast<TcpConnection*>(g.get(r, 1 - r, 1))->abandoned());
    CHECK(static_cast<TcpConnection*>(g.get(r, 1 - r, 2))->abandoned());
  }
  // The carrier is the last one: its failure fails them all.
  const int fd0 = g.get(0, 1, 0)->poll_fd(&events);
  Traffic t3(15, 3);
  REQUIRE(t3.run(g, 4, [&] { ::shutdown(fd0, SHUT_WR); }, 0));
  CHECK(g.get(1, 0, 0)->error().code() == Code::kRemoteError);
}

// The carrier of a failed path fails too: its own stream, with the first path's frames in it,
// goes on through the third channel, and the receiving side unpacks both. Cut from rank 0's
// side first, then from rank 1's, mid-stream both times.
TEST_CASE("tcp: with three channels, a carrier that fails hands what it carries to the third",
          "[unit][tcp]") {
  Group g = make_group(2, 3, 4099);
  join_groups(g, false, 3);
  short events = 0;
  Traffic t(21, 3);
  const int fd1 = g.get(0, 1, 1)->poll_fd(&events);
  REQUIRE(t.run(g, 8, [&] { ::shutdown(fd1, SHUT_WR); }, 1));
  t.require_all_right();
  // Channel 1 goes through channel 0 now; channel 0 breaks while both carry traffic.
  Traffic t2(22, 3);
  const int fd0 = g.get(1, 0, 0)->poll_fd(&events);
  REQUIRE(t2.run(g, 4, [&] { ::shutdown(fd0, SHUT_WR); }, 0));
  t2.require_all_right();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(static_cast<TcpConnection*>(g.get(r, 1 - r, 0))->abandoned());
    CHECK(static_cast<TcpConnection*>(g.get(r, 1 - r, 1))->abandoned());
    CHECK_FALSE(static_cast<TcpConnection*>(g.get(r, 1 - r, 2))->abandoned());
    for (int c = 0; c < 3; ++c) CHECK(g.get(r, 1 - r, c)->error().ok());
  }
  // Everything keeps working on the one channel left; its failure is the end.
  Traffic t3(23, 3);
  REQUIRE(t3.run(g, 0, nullptr));
  t3.require_all_right();
  const int fd2 = g.get(0, 1, 2)->poll_fd(&events);
  Traffic t4(24, 3);
  REQUIRE(t4.run(g, 4, [&] { ::shutdown(fd2, SHUT_WR); }, 2));
  CHECK(t4.failed() > 0);
  CHECK(g.get(1, 0, 2)->error().code() == Code::kRemoteError);
}

TEST_CASE("tcp: a second failure in a group fails every channel, naming the peer",
          "[unit][tcp]") {
  Group g = make_group(2, 2, 4099);
  join_groups(g);
  Traffic t(9);
  short events = 0;
  const int fd1 = g.get(0, 1, 1)->poll_fd(&events);
  const int fd0 = g.get(0, 1, 0)->poll_fd(&events);
  bool ok = t.run(g, 4, [&] {
    ::shutdown(fd1, SHUT_WR);
    ::shutdown(fd0, SHUT_WR);
  });
  // Everything ends (no hang), and what did not complete failed with the peer named.
  CHECK(ok);
  CHECK(t.failed() > 0);
  Status st = g.get(1, 0, 0)->error();
  CHECK(st.code() == Code::kRemoteError);
  CHECK_THAT(st.message(), Catch::Contains("rank 0 ("));
}

TEST_CASE("tcp: without a group, a failed channel fails its requests", "[unit][tcp]") {
  Group g = make_group(2, 2, 4099);
  Traffic t(10);
  short events = 0;
  const int fd = g.get(0, 1, 1)->poll_fd(&events);
  REQUIRE(t.run(g, 8, [&] { ::shutdown(fd, SHUT_WR); }));
  CHECK(t.failed() > 0);
  CHECK_FALSE(g.get(0, 1, 1)->error().ok());
}

}  // namespace chorus::tcp
