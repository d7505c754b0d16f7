// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/verbs_transport_test.cc
// The verbs transport. [unit]: its blob parser against malformed input, the NCCL_IB_HCA
// filter, the immediate-data and slot codecs (no RDMA needed). [rdma]: ranks as threads (and a
// forked process) over a real device, e.g. soft-RoCE in the test guest: rings smaller than the
// messages, registered sends read in place, reducing receives, a peer that leaves, a peer that
// dies (heard on the side channel), a wrong secret. ctest runs the [rdma] cases only where a
// device exists (label rdma).
#include <catch2/catch.hpp>

#if __has_include(<infiniband/verbs.h>)  // the transport is built whenever libibverbs is found

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "kernels/reduce/reduce.h"
#include "net/auth.h"
#include "support/scoped_env.h"
#include "transports/registry.h"
#include "transports/verbs/verbs_connection.h"
#include "transports/verbs/verbs_side.h"
#include "transports/verbs/verbs_transport.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {
namespace {

BlobInfo sample_blob(uint32_t rank = 1, uint32_t nranks = 3, uint32_t channels = 2) {
  BlobInfo b;
  b.link_layer = 2;
  b.mtu = 3;
  b.lid = 0;
  b.port = 1;
  b.rank = rank;
  b.nranks = nranks;
  b.channels = channels;
  b.slots = 16;
  b.slot_bytes = 65536;
  b.ring_base = 0x7f0000000000;
  b.ring_rkey = 0x1234;
  for (int i = 0; i < 16; ++i) b.gid[static_cast<size_t>(i)] = static_cast<uint8_t>(i == 10 || i == 11 ? 0xff : 0);
  b.gid[15] = 7;
  b.qps.resize(nranks * channels);
  for (uint32_t i = 0; i < nranks * channels; ++i) {
    if (i / channels == rank) continue;
    b.qps[i] = QpEntry{0x100 + i, 0xabc00 + i};
  }
  return b;
}

BlobExpect expect_for(const BlobInfo& b, uint32_t my_rank = 0) {
  return BlobExpect{b.rank, b.nranks, b.channels, b.slots, b.slot_bytes, my_rank};
}

Status parse(const std::string& bytes, const BlobExpect& e) {
  auto r = parse_blob(bytes, e, "rank 1 (host h, pid 1)");
  return r.ok() ? Status() : r.take_status();
}

}  // namespace

TEST_CASE("verbs blob: what is encoded parses back", "[unit][verbs]") {
  BlobInfo b = sample_blob();
  std::string bytes = encode_blob(b);
  CHECK(bytes.size() == kBlobHeaderBytes + 6 * kBlobEntryBytes);
  auto r = parse_blob(bytes, expect_for(b), "rank 1");
  REQUIRE(r.ok());
  CHECK(r->mtu == 3);
  CHECK(r->port == 1);
  CHECK(r->ring_base == b.ring_base);
  CHECK(r->ring_rkey == b.ring_rkey);
  CHECK(r->gid == b.gid);
  REQUIRE(r->qps.size() == 6);
  CHECK(r->qps[1].qpn == 0x101);
  CHECK(r->qps[5].psn == 0xabc05);
  CHECK(r->qps[2].qpn == 0);  // rank 1's own entries
}

TEST_CASE("verbs blob: malformed blobs are rejected, naming the field", "[unit][verbs]") {
  const BlobInfo good = sample_blob();
  const std::string bytes = encode_blob(good);
  const BlobExpect e = expect_for(good);
  SECTION("every truncation, and a trailing byte") {
    for (size_t n = 0; n < bytes.size(); ++n) {
      INFO(n << " bytes");
      CHECK(parse(bytes.substr(0, n), e).code() == Code::kRemoteError);
    }
    CHECK(parse(bytes + '\0', e).code() == Code::kRemoteError);
    CHECK(parse(std::string(5000, '\0'), e).code() == Code::kRemoteError);
  }
  auto with = [&](auto edit) {
    BlobInfo b = good;
    edit(b);
    return parse(encode_blob(b), e);
  };
  auto bad_byte = [&](size_t at, uint8_t v) {
    std::string m = bytes;
    m[at] = static_cast<char>(v);
    return parse(m, e);
  };
  CHECK_THAT(bad_byte(0, 0x41).message(), Catch::Contains("magic"));
  CHECK_THAT(bad_byte(4, 2).message(), Catch::Contains("version 2"));
  CHECK_THAT(bad_byte(11, 1).message(), Catch::Contains("reserved"));
  CHECK_THAT(with([](BlobInfo& b) { b.link_layer = 3; }).message(), Catch::Contains("link layer 3"));
  CHECK_THAT(with([](BlobInfo& b) { b.mtu = 0; }).message(), Catch::Contains("MTU"));
  CHECK_THAT(with([](BlobInfo& b) { b.mtu = 6; }).message(), Catch::Contains("MTU"));
  CHECK_THAT(with([](BlobInfo& b) { b.port = 0; }).message(), Catch::Contains("port 0"));
  CHECK_THAT(with([](BlobInfo& b) { b.rank = 2; }).message(), Catch::Contains("rank 2 of 3"));
  CHECK_THAT(with([](BlobInfo& b) { b.nranks = 4; }).message(), Catch::Contains("rank 1 of 4"));
  CHECK_THAT(with([](BlobInfo& b) { b.channels = 3; }).message(), Catch::Contains("3 channels"));
  CHECK_THAT(with([](BlobInfo& b) { b.slots = 8; }).message(),
             Catch::Contains("CHORUS_IB_SLOTS"));
  CHECK_THAT(with([](BlobInfo& b) { b.slot_bytes = 4096; }).message(),
             Catch::Contains("CHORUS_IB_SLOT_BYTES"));
  CHECK_THAT(with([](BlobInfo& b) { b.qps.pop_back(); }).message(), Catch::Contains("QP entries"));
  CHECK_THAT(with([](BlobInfo& b) { b.qps[1].qpn = 0x1000000; }).message(),
             Catch::Contains("QP entry 1"));
  CHECK_THAT(with([](BlobInfo& b) { b.qps[0].psn = 0x1000000; }).message(),
             Catch::Contains("QP entry 0"));
  CHECK_THAT(with([](BlobInfo& b) { b.qps[2].qpn = 5; }).message(),
             Catch::Contains("QP entry 2"));  // its own rank names a QP
  CHECK_THAT(with([](BlobInfo& b) { b.qps[1].qpn = 0; }).message(),
             Catch::Contains("no QP for rank 0 channel 1"));
  CHECK_THAT(with([](BlobInfo& b) { b.ring_base = 0; }).message(), Catch::Contains("ring base"));
  CHECK_THAT(with([](BlobInfo& b) { b.ring_base = UINT64_MAX - 4096; }).message(),
             Catch::Contains("ring base"));
  // Out-of-range geometry is refused even where both sides agree on it.
  const std::vector<std::pair<uint32_t, uint32_t>> geometries = {
      {2, 65536}, {512, 65536}, {16, 1024}, {16, 65537}, {16, 16u << 20}};
  for (auto [slots, bytes_per] : geometries) {
    BlobInfo b = good;
    b.slots = slots;
    b.slot_bytes = bytes_per;
    BlobExpect ex = e;
    ex.slots = slots;
    ex.slot_bytes = bytes_per;
    INFO(slots << " x " << bytes_per);
    CHECK_THAT(parse(encode_blob(b), ex).message(), Catch::Contains("ring of"));
  }
  // No ranks, no channels, a rank beyond the count: refused even where both sides agree.
  for (auto edit : {+[](BlobInfo& b) { b.nranks = 0; }, +[](BlobInfo& b) { b.channels = 0; },
                    +[](BlobInfo& b) { b.rank = b.nranks; }}) {
    BlobInfo b = good;
    edit(b);
    b.qps.resize(size_t{b.nranks} * b.channels);
    BlobExpect ex = expect_for(b);
    CHECK_THAT(parse(encode_blob(b), ex).message(), Catch::Contains("channels"));
  }
  // Too many entries for a blob.
  BlobInfo big = sample_blob(1, 600, 1);
  CHECK(parse(encode_blob(big), expect_for(big)).code() == Code::kRemoteError);
}

TEST_CASE("verbs blob: random corruption never gets past the parser unchecked", "[unit][verbs]") {
  const BlobInfo good = sample_blob();
  const std::string bytes = encode_blob(good);
  const BlobExpect e = expect_for(good);
  uint32_t x = 12345;
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string m = bytes;
    for (int flips = 0; flips < 1 + i % 4; ++flips) {
      x = x * 1664525u + 1013904223u;
      m[(x >> 8) % m.size()] ^= static_cast<char>(1u << ((x >> 4) % 8));
    }
    auto r = parse_blob(m, e, "rank 1");
    if (!r.ok()) continue;
    ++accepted;  // only the fields nobody can check (addresses, keys, PSNs, GID, LID) changed
    CHECK(r->qps.size() == 6);
    CHECK(r->mtu >= 1);
    CHECK(r->mtu <= 5);
    for (size_t q = 0; q < r->qps.size(); ++q) {
      CHECK(r->qps[q].qpn <= 0xffffff);
      if (q / 2 == 1) CHECK(r->qps[q].qpn == 0);  // rank 1's own
      if (q / 2 == 0) CHECK(r->qps[q].qpn != 0);  // ours must name a QP
    }
  }
  CHECK(accepted > 0);
  CHECK(accepted < 20000);
}

TEST_CASE("verbs: NCCL_IB_HCA filters devices and ports", "[unit][verbs]") {
  auto f = [](const char* spec) {
    auto r = parse_hca_filter(spec);
    REQUIRE(r.ok());
    return r.value();
  };
  CHECK(f("").matches("anything", 1));
  CHECK(f("mlx5").matches("mlx5_0", 1));
  CHECK(f("mlx5").matches("mlx5_1", 2));
  CHECK_FALSE(f("mlx5").matches("rxe0", 1));
  HcaFilter mixed = f("mlx5_0:1,^mlx5_1");
  CHECK(mixed.matches("mlx5_0", 1));
  CHECK_FALSE(mixed.matches("mlx5_0", 2));
  CHECK_FALSE(mixed.matches("mlx5_1", 1));
  CHECK_FALSE(mixed.matches("rxe0", 1));
  HcaFilter excl = f("^mlx5_1");
  CHECK(excl.matches("mlx5_0", 1));
  CHECK(excl.matches("rxe0", 1));
  CHECK_FALSE(excl.matches("mlx5_1", 1));
  CHECK_FALSE(excl.matches("mlx5_10", 1));  // a prefix
  HcaFilter exact_excl = f("^=mlx5_1");
  CHECK(exact_excl.matches("mlx5_10", 1));
  CHECK_FALSE(exact_excl.matches("mlx5_1", 1));
  HcaFilter exact = f("=rxe0");
  CHECK(exact.matches("rxe0", 1));
  CHECK_FALSE(exact.matches("rxe01", 1));
  CHECK(f(" rxe0 , mlx5_2:2 ").matches("mlx5_2", 2));
  for (const char* bad : {"mlx5_0:0", "mlx5_0:x", "mlx5_0:", ",", "a,,b", ":1", "mlx5_0:1:2",
                          "^", "=", "mlx5_0:256"}) {
    INFO(bad);
    auto r = parse_hca_filter(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("verbs: immediate data and credits", "[unit][verbs]") {
  CHECK(is_slot_imm(slot_imm(0)));
  CHECK(is_slot_imm(slot_imm(0x123456789ull)));
  CHECK(slot_imm(0x80000001ull) == 1);
  CHECK(is_credit_imm(credit_imm(7)));
  CHECK_FALSE(is_slot_imm(credit_imm(7)));
  for (uint32_t control : {kImmHello, kImmFarewell}) {
    CHECK_FALSE(is_slot_imm(control));
    CHECK_FALSE(is_credit_imm(control));
  }
  CHECK(widen_credit(0, credit_imm(5)) == 5);
  CHECK(widen_credit(5, credit_imm(5)) == 5);
  const uint64_t near = (uint64_t{1} << 30) - 2;
  CHECK(widen_credit(near, credit_imm(near + 5)) == near + 5);
  const uint64_t far = (uint64_t{7} << 30) + 100;
  CHECK(widen_credit(far, credit_imm(far + 1000)) == far + 1000);
}

TEST_CASE("verbs: slot headers are checked against what is due", "[unit][verbs]") {
  const size_t slot = 4096, room = slot - kSlotHeaderBytes;
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.payload = static_cast<uint32_t>(room);
  h.total = 3 * room;
  h.offset = room;
  h.seq = 9;
  CHECK(check_slot(h, 9, room, 3 * room, slot).empty());
  CHECK_THAT(check_slot(h, 8, room, 3 * room, slot), Catch::Contains("slot 9 where slot 8"));
  CHECK_THAT(check_slot(h, 9, 0, 0, slot), Catch::Contains("offset"));
  CHECK_THAT(check_slot(h, 9, room, 4 * room, slot), Catch::Contains("middle"));
  SlotHeader m = h;
  m.magic = 1;
  CHECK_THAT(check_slot(m, 9, room, 3 * room, slot), Catch::Contains("magic"));
  m = h;
  m.payload = static_cast<uint32_t>(room + 1);
  CHECK_THAT(check_slot(m, 9, room, 3 * room, slot), Catch::Contains("payload"));
  m = h;
  m.payload = 10;  // short, but not the last
  CHECK_THAT(check_slot(m, 9, room, 3 * room, slot), Catch::Contains("partial"));
  m = h;
  m.offset = 0;
  m.total = 5;
  m.payload = 10;  // past the message's end
  CHECK_FALSE(check_slot(m, 9, 0, 0, slot).empty());
  m.payload = 5;
  CHECK(check_slot(m, 9, 0, 0, slot).empty());
}

// ---- Over a device ([rdma]) -----------------------------------------------------------------

TEST_CASE("verbs blob: the side channel address trailer splits off, or is refused",
          "[unit][verbs]") {
  const std::string verbs_blob = encode_blob(sample_blob());
  for (const char* ip : {"192.0.2.7", "fd00::5"}) {
    auto addr = net::SockAddr::parse(ip, 4711);
    REQUIRE(addr.ok());
    const std::string published = append_side_address(verbs_blob, *addr);
    std::string_view inner;
    net::SockAddr got;
    REQUIRE(split_side_address(published, &inner, &got, "rank 1").ok());
    CHECK(inner == verbs_blob);
    CHECK(got == *addr);
    CHECK(got.port() == 4711);
    // Every truncation, and a blob without the trailer, is refused naming the publisher.
    for (size_t n = 0; n < published.size(); n += 7) {
      Status st = split_side_address(std::string_view(published).substr(0, n), &inner, &got,
                                     "rank 1 (host x)");
      INFO("length " << n);
      CHECK(st.code() == Code::kRemoteError);
      CHECK_THAT(st.message(), Catch::Contains("rank 1 (host x)"));
    }
    std::string bad_len = published;
    bad_len[bad_len.size() - 8] = static_cast<char>(0xff);  // length 0x7fff: more than a
    bad_len[bad_len.size() - 7] = static_cast<char>(0x7f);  // sockaddr, more than precedes it
    CHECK_FALSE(split_side_address(bad_len, &inner, &got, "r").ok());
    std::string bad_family = published;
    bad_family[published.size() - 8 - addr->len] = 99;  // sa_family (little-endian low byte)
    bad_family[published.size() - 8 - addr->len + 1] = 0;
    CHECK_FALSE(split_side_address(bad_family, &inner, &got, "r").ok());
  }
}

namespace {

constexpr uint64_t kUid = 0x7e4b5c0de;

struct RdmaPair {
  std::vector<std::string> blobs = std::vector<std::string>(2);
  std::vector<std::unique_ptr<TransportInstance>> inst =
      std::vector<std::unique_ptr<TransportInstance>>(2);
  std::vector<ConnectionTable> conns = std::vector<ConnectionTable>(2);
  std::vector<Status> status = std::vector<Status>(2);
  bool no_device = false;
  Connection* conn(int r, int channel = 0) { return conns[r][0][static_cast<size_t>(channel)].get(); }
};

TransportContext context(int rank, int nranks, const net::Secret& secret, int channels = 1) {
  TransportContext ctx;
  ctx.rank = rank;
  ctx.nranks = nranks;
  ctx.comm_uid = kUid;
  ctx.secret = secret;
  ctx.channels = channels;
  ctx.comm_label = "verbs test rank " + std::to_string(rank);
  return ctx;
}

std::vector<EndpointInfo> endpoints(const std::vector<std::string>& blobs) {
  std::vector<EndpointInfo> all(blobs.size());
  for (size_t p = 0; p < blobs.size(); ++p) {
    all[p].rank = static_cast<int>(p);
    all[p].host_hash = 1;
    all[p].hostname = "testhost";
    all[p].pid = getpid();
    all[p].open = !blobs[p].empty();
    all[p].blob = blobs[p];
  }
  return all;
}

void connect_pair(RdmaPair* pair, const VerbsOptions& options, int channels = 1) {
  net::Secret secret = net::Secret::random();
  std::barrier sync(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto opened = open_instance(context(r, 2, secret, channels), options);
      if (!opened.ok()) {
        pair->status[r] = opened.take_status();
      } else if (opened.value() == nullptr) {
        pair->no_device = true;
      } else {
        pair->inst[r] = std::move(opened).value();
        pair->blobs[r] = pair->inst[r]->blob();
      }
      sync.arrive_and_wait();
      if (pair->inst[0] == nullptr || pair->inst[1] == nullptr) return;
      auto conns = pair->inst[r]->connect(endpoints(pair->blobs), {1 - r}, Deadline::after_ms(20000));
      if (conns.ok()) {
        pair->conns[r] = std::move(conns).value();
      } else {
        pair->status[r] = conns.take_status();
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE_FALSE(pair->no_device);  // [rdma] cases run only where a device exists
  INFO(pair->status[0].to_string() << " / " << pair->status[1].to_string());
  REQUIRE(pair->status[0].ok());
  REQUIRE(pair->status[1].ok());
}

bool drive(RdmaPair& pair, const std::vector<Request*>& reqs, int ms = 30000) {
  Deadline deadline = Deadline::after_ms(ms);
  for (;;) {
    bool all = true;
    for (const Request* r : reqs) all = all && r->done();
    if (all) return true;
    if (deadline.expired()) return false;
    bool moved = false;
    for (int r = 0; r < 2; ++r)
      for (auto& c : pair.conns[r][0]) moved |= c->progress();
    if (!moved) std::this_thread::yield();
  }
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

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x >> 8) % 100000) / 997.0f;
  }
  return v;
}

}  // namespace

TEST_CASE("verbs: messages larger than the ring travel through it, both ways at once",
          "[rdma][verbs]") {
  RdmaPair pair;
  connect_pair(&pair, VerbsOptions{4, 4096});  // 16 KiB of ring per direction
  uint32_t seq = 1;
  for (size_t count : {size_t{0}, size_t{1}, size_t{1008}, size_t{1009}, size_t{100003}}) {
    INFO(count << " floats");
    std::vector<float> a = random_floats(count, 1), b = random_floats(count, 2);
    std::vector<float> got_a(count, -1.0f), got_b(count, -1.0f);
    SendRequest s0, s1;
    s0.buf = a.data();
    s0.bytes = count * sizeof(float);
    s0.tag = tag_of(seq, count);
    s1.buf = b.data();
    s1.bytes = s0.bytes;
    s1.tag = s0.tag;
    RecvRequest r0, r1;
    r1.dst = got_a.data();
    r1.bytes = s0.bytes;
    r1.tag = s0.tag;
    r0.dst = got_b.data();
    r0.bytes = s0.bytes;
    r0.tag = s0.tag;
    ++seq;
    pair.conn(0)->post_send(&s0);
    pair.conn(1)->post_send(&s1);
    pair.conn(1)->post_recv(&r1);
    pair.conn(0)->post_recv(&r0);
    REQUIRE(drive(pair, {&s0, &s1, &r0, &r1}));
    REQUIRE_FALSE(r0.failed());
    REQUIRE_FALSE(r1.failed());
    CHECK(got_a == a);
    CHECK(got_b == b);
  }
  CHECK(pair.conn(0)->idle());
  CHECK(pair.conn(1)->idle());
}

TEST_CASE("verbs: registered sends are read in place; reducing receives reduce each slot",
          "[rdma][verbs]") {
  RdmaPair pair;
  connect_pair(&pair, VerbsOptions{4, 8192});
  const size_t count = 50001;
  std::vector<float> sent = random_floats(count, 3), mine = random_floats(count, 4);
  KeyFactory make = pair.inst[0]->key_factory();
  REQUIRE(make);
  auto key = make(RegisteredRange{sent.data(), sent.size() * sizeof(float), std::nullopt});
  REQUIRE(key.ok());
  std::vector<float> got(count), acc(count), want(count);
  for (size_t i = 0; i < count; ++i) want[i] = mine[i] + sent[i];
  SendRequest s;
  s.buf = sent.data();
  s.bytes = count * sizeof(float);
  s.tag = tag_of(1, count);
  s.key = key.value().get();
  RecvRequest r;
  r.dst = got.data();
  r.bytes = s.bytes;
  r.tag = s.tag;
  pair.conn(1)->post_recv(&r);
  pair.conn(0)->post_send(&s);
  REQUIRE(drive(pair, {&s, &r}));
  REQUIRE_FALSE(r.failed());
  CHECK(got == sent);

  // Part of a registered range: still in place. Received as a reduction into another buffer.
  SendRequest s2;
  s2.buf = sent.data() + 1;
  s2.bytes = (count - 1) * sizeof(float);
  s2.tag = tag_of(2, count - 1);
  s2.key = key.value().get();
  RecvRequest r2;
  r2.dst = acc.data() + 1;
  r2.src = mine.data() + 1;
  r2.bytes = s2.bytes;
  r2.tag = s2.tag;
  r2.reduce = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  r2.elem_size = sizeof(float);
  pair.conn(1)->post_recv(&r2);
  pair.conn(0)->post_send(&s2);
  REQUIRE(drive(pair, {&s2, &r2}));
  REQUIRE_FALSE(r2.failed());
  CHECK(std::equal(want.begin() + 1, want.end(), acc.begin() + 1));
}

TEST_CASE("verbs: a peer that closes fails a pending receive with its goodbye",
          "[rdma][verbs]") {
  RdmaPair pair;
  connect_pair(&pair, VerbsOptions{});
  std::vector<float> got(16);
  RecvRequest r;
  r.dst = got.data();
  r.bytes = 64;
  r.tag = tag_of(1, 16);
  pair.conn(1)->post_recv(&r);
  pair.conns[0].clear();
  pair.inst[0].reset();
  Deadline deadline = Deadline::after_ms(20000);
  while (!r.done() && !deadline.expired()) pair.conn(1)->progress();
  REQUIRE(r.failed());
  CHECK(pair.conn(1)->error().code() == Code::kRemoteError);
  CHECK_THAT(pair.conn(1)->error().message(),
             Catch::Contains("rank 0 (host testhost") && Catch::Contains("closed its end") &&
                 Catch::Contains("Send #1"));
}

TEST_CASE("verbs: a mismatch is ncclInvalidUsage on both sides (farewell)", "[rdma][verbs]") {
  RdmaPair pair;
  connect_pair(&pair, VerbsOptions{});
  std::vector<float> a(8, 1.0f), got(8), back(8);
  SendRequest s;
  s.buf = a.data();
  s.bytes = 32;
  s.tag = tag_of(3, 8);
  RecvRequest r;
  r.dst = got.data();
  r.bytes = 32;
  r.tag = tag_of(4, 8);  // another call
  RecvRequest r0;  // rank 0 waits for an answer that will not come
  r0.dst = back.data();
  r0.bytes = 32;
  r0.tag = tag_of(5, 8);
  pair.conn(0)->post_send(&s);
  pair.conn(0)->post_recv(&r0);
  pair.conn(1)->post_recv(&r);
  drive(pair, {&r, &r0}, 20000);
  REQUIRE(r.failed());
  REQUIRE(r0.failed());
  CHECK(pair.conn(1)->error().code() == Code::kInvalidUsage);
  CHECK(pair.conn(0)->error().code() == Code::kInvalidUsage);
  CHECK_THAT(pair.conn(0)->error().message(), Catch::Contains("gave up") &&
                                                  Catch::Contains("expects"));
}

// A peer process killed outright says nothing over RDMA (our write to its QP would fail only
// after NCCL_IB_TIMEOUT x 8 tries: 34 s at the default 20); its kernel closes the side channel,
// and the pending send fails within moments, naming the peer.
TEST_CASE("verbs: a killed peer fails a pending send within seconds (side channel)",
          "[rdma][verbs]") {
  test::ScopedEnv timeout("CHORUS_IB_TIMEOUT", "20");  // NCCL's default: no help from retries
  test::ScopedEnv retries("CHORUS_IB_RETRY_CNT", "7");
  int to_child[2], from_child[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(from_child) == 0);
  net::Secret secret = net::Secret::random();
  auto read_all = [](int fd, void* buf, size_t n) {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 20000) <= 0) return false;
      ssize_t got = read(fd, p, n);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  auto write_all = [](int fd, const void* buf, size_t n) {
    return write(fd, buf, n) == static_cast<ssize_t>(n);
  };
  auto exchange = [&](int out_fd, int in_fd, const std::string& mine, std::string* theirs) {
    uint32_t len = static_cast<uint32_t>(mine.size());
    if (!write_all(out_fd, &len, 4) || !write_all(out_fd, mine.data(), mine.size())) return false;
    if (!read_all(in_fd, &len, 4) || len > 4096) return false;
    theirs->resize(len);
    return read_all(in_fd, theirs->data(), len);
  };
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // rank 1: connect, then wait to be killed
    auto opened = open_instance(context(1, 2, secret), VerbsOptions{});
    if (!opened.ok() || opened.value() == nullptr) _exit(2);
    std::vector<std::string> blobs(2);
    blobs[1] = opened.value()->blob();
    if (!exchange(from_child[1], to_child[0], blobs[1], &blobs[0])) _exit(3);
    auto conns = opened.value()->connect(endpoints(blobs), {0}, Deadline::after_ms(20000));
    char ok = conns.ok() ? 'y' : 'n';
    if (!write_all(from_child[1], &ok, 1)) _exit(4);
    for (;;) pause();
  }
  close(to_child[0]);
  close(from_child[1]);
  auto opened = open_instance(context(0, 2, secret), VerbsOptions{});
  REQUIRE(opened.ok());
  REQUIRE(opened.value() != nullptr);
  std::vector<std::string> blobs(2);
  blobs[0] = opened.value()->blob();
  bool exchanged = exchange(to_child[1], from_child[0], blobs[0], &blobs[1]);
  Result<ConnectionTable> conns = exchanged ? opened.value()->connect(endpoints(blobs), {1},
                                                                      Deadline::after_ms(20000))
                                            : Result<ConnectionTable>(internal_error("no blob"));
  char child_ok = 'n';
  const bool told = read_all(from_child[0], &child_ok, 1);
  REQUIRE(exchanged);
  REQUIRE(conns.ok());
  REQUIRE(told);
  REQUIRE(child_ok == 'y');
  Connection* c = conns.value()[0][0].get();
  // The first message goes through while the peer lives: the connection works.
  std::vector<float> data(1000, 2.0f);
  SendRequest first;
  first.buf = data.data();
  first.bytes = data.size() * sizeof(float);
  first.tag = tag_of(1, data.size());
  c->post_send(&first);
  Deadline sent = Deadline::after_ms(20000);
  while (!first.done() && !sent.expired()) c->progress();
  REQUIRE(first.done());
  REQUIRE_FALSE(first.failed());
  // The peer's ring (16 slots) takes no more than its credits: the 17th slot waits for a credit
  // that a dead peer never returns, and nothing but the side channel says why.
  kill(child, SIGKILL);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  close(to_child[1]);
  close(from_child[0]);
  const int64_t killed = now_ns();
  std::vector<float> big(20 * 16384, 3.0f);  // 20 slots of 64 KiB
  SendRequest s;
  s.buf = big.data();
  s.bytes = big.size() * sizeof(float);
  s.tag = tag_of(2, big.size());
  c->post_send(&s);
  Deadline deadline = Deadline::after_ms(30000);
  while (!s.done() && !deadline.expired()) {
    if (!c->progress()) {
      short events = 0;
      pollfd p{c->poll_fd(&events), events, 0};
      if (p.fd >= 0) poll(&p, 1, 100);  // sleeps on the epoll set: the side socket wakes it
    }
  }
  const double ms = static_cast<double>(now_ns() - killed) / 1e6;
  REQUIRE(s.failed());
  const std::string why = c->error().message();
  INFO(why << " (after " << ms << " ms)");
  CHECK(c->error().code() == Code::kRemoteError);
  CHECK(ms < 5000);
  CHECK_THAT(why, Catch::Contains("rank 1 (host testhost") && Catch::Contains("is gone") &&
                      Catch::Contains("side channel") && Catch::Contains("while rank 0 was sending"));
}

// The side channel proves the communicator's secret both ways (net/auth.h): a peer with another
// secret is refused, and each side's error names the other.
TEST_CASE("verbs: a wrong secret is refused with an error naming the peer", "[rdma][verbs]") {
  const net::Secret secrets[2] = {net::Secret::random(), net::Secret::random()};
  RdmaPair pair;
  std::barrier sync(2);
  std::vector<std::thread> threads;
  const int64_t start = now_ns();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto opened = open_instance(context(r, 2, secrets[r]), VerbsOptions{});
      if (!opened.ok()) {
        pair.status[r] = opened.take_status();
      } else if (opened.value() == nullptr) {
        pair.no_device = true;
      } else {
        pair.inst[r] = std::move(opened).value();
        pair.blobs[r] = pair.inst[r]->blob();
      }
      sync.arrive_and_wait();
      if (pair.inst[0] == nullptr || pair.inst[1] == nullptr) return;
      auto conns = pair.inst[r]->connect(endpoints(pair.blobs), {1 - r}, Deadline::after_ms(3000));
      pair.status[r] = conns.ok() ? Status() : conns.take_status();
    });
  }
  for (auto& t : threads) t.join();
  const double ms = static_cast<double>(now_ns() - start) / 1e6;
  REQUIRE_FALSE(pair.no_device);
  INFO(pair.status[0].to_string() << " / " << pair.status[1].to_string());
  CHECK(ms < 5000);
  // Rank 0 connects and finds that rank 1 does not prove the secret; rank 1 drops the
  // connection and, when its deadline passes, names the rank it still waits for.
  CHECK(pair.status[0].code() == Code::kRemoteError);
  CHECK_THAT(pair.status[0].message(),
             Catch::Contains("authentication failed") && Catch::Contains("rank 1 (host testhost"));
  CHECK(pair.status[1].code() == Code::kRemoteError);
  CHECK_THAT(pair.status[1].message(),
             Catch::Contains("no side channel from rank 0 (host testhost") &&
                 Catch::Contains("authentication"));
}

}  // namespace chorus::verbs

#endif
