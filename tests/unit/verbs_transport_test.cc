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
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "kernels/reduce/reduce.h"
#include "net/auth.h"
#include "support/scoped_env.h"
#include "transports/registry.h"
#include "transports/registration_key.h"
#include "transports/verbs/verbs_connection.h"
#include "transports/verbs/verbs_side.h"
#include "transports/verbs/verbs_transport.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {
namespace {

BlobInfo sample_blob(uint32_t rank = 1, uint32_t nranks = 3, uint32_t channels = 2,
                     uint32_t qps = 1) {
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
  b.qps_per_connection = qps;
  b.qps.resize(nranks * channels * qps);
  for (uint32_t i = 0; i < nranks * channels * qps; ++i) {
    if (i / qps / channels == rank) continue;
    b.qps[i] = QpEntry{0x100 + i, 0xabc00 + i};
  }
  return b;
}

BlobExpect expect_for(const BlobInfo& b, uint32_t my_rank = 0) {
  return BlobExpect{b.rank, b.nranks, b.channels, b.slots, b.slot_bytes, my_rank,
                    b.qps_per_connection};
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

ibv_gid_entry gid_entry(uint32_t type, std::initializer_list<uint8_t> head, uint8_t last) {
  ibv_gid_entry e{};
  e.gid_type = type;
  size_t i = 0;
  for (uint8_t b : head) e.gid.raw[i++] = b;
  e.gid.raw[15] = last;
  return e;
}

TEST_CASE("verbs: the GID choice honours RoCE version, NCCL_IB_ADDR_FAMILY and the netdev",
          "[unit][verbs]") {
  const ibv_gid_entry v2_ipv4 = gid_entry(IBV_GID_TYPE_ROCE_V2, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10}, 1);
  const ibv_gid_entry v1_ipv4 = gid_entry(IBV_GID_TYPE_ROCE_V1, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10}, 1);
  const ibv_gid_entry v2_ipv6 = gid_entry(IBV_GID_TYPE_ROCE_V2, {0x20, 0x01, 0x0d, 0xb8}, 1);
  const ibv_gid_entry v1_ipv6 = gid_entry(IBV_GID_TYPE_ROCE_V1, {0x20, 0x01, 0x0d, 0xb8}, 1);
  const ibv_gid_entry v2_link_local = gid_entry(IBV_GID_TYPE_ROCE_V2, {0xfe, 0x80}, 1);
  const ibv_gid_entry zero = gid_entry(IBV_GID_TYPE_ROCE_V2, {}, 0);
  const ibv_gid_entry ib = gid_entry(IBV_GID_TYPE_IB, {0xfe, 0x80}, 1);
  GidPolicy any;
  CHECK(gid_score(zero, "", any) == 0);
  CHECK(gid_score(v2_link_local, "", any) == 0);
  CHECK(gid_score(ib, "", any) == 0);
  // No family asked for: RoCE v2 first, then IPv4 before IPv6.
  CHECK(gid_score(v2_ipv4, "", any) > gid_score(v2_ipv6, "", any));
  CHECK(gid_score(v2_ipv6, "", any) > gid_score(v1_ipv4, "", any));
  CHECK(gid_score(v1_ipv4, "", any) > gid_score(v1_ipv6, "", any));
  CHECK(gid_score(v1_ipv6, "", any) > 0);
  // A family asked for: the other one is unusable.
  GidPolicy inet6;
  inet6.family = "AF_INET6";
  CHECK(gid_score(v2_ipv4, "", inet6) == 0);
  CHECK(gid_score(v1_ipv4, "", inet6) == 0);
  CHECK(gid_score(v2_ipv6, "", inet6) > gid_score(v1_ipv6, "", inet6));
  GidPolicy inet;
  inet.family = "AF_INET";
  CHECK(gid_score(v2_ipv6, "", inet) == 0);
  CHECK(gid_score(v2_ipv4, "", inet) > 0);
  // NCCL_SOCKET_IFNAME breaks ties only: a matching netdev wins among equals, never over a
  // better RoCE version or family.
  GidPolicy eth;
  eth.ifname_spec = "eth";
  CHECK(gid_score(v2_ipv4, "eth1", eth) > gid_score(v2_ipv4, "ens3", eth));
  CHECK(gid_score(v2_ipv4, "ens3", eth) > gid_score(v1_ipv4, "eth1", eth));
  CHECK(gid_score(v2_ipv4, "ens3", eth) > gid_score(v2_ipv6, "eth1", eth));
  GidPolicy not_eth;
  not_eth.ifname_spec = "^eth";
  CHECK(gid_score(v2_ipv4, "ens3", not_eth) > gid_score(v2_ipv4, "eth0", not_eth));
}

TEST_CASE("verbs blob: several QPs per connection", "[unit][verbs]") {
  BlobInfo b = sample_blob(1, 3, 2, 4);
  std::string bytes = encode_blob(b);
  CHECK(bytes.size() == kBlobHeaderBytes + 24 * kBlobEntryBytes);
  auto r = parse_blob(bytes, expect_for(b), "rank 1");
  REQUIRE(r.ok());
  CHECK(r->qps_per_connection == 4);
  REQUIRE(r->qps.size() == 24);
  CHECK(r->qps[7].qpn == 0x107);  // rank 0, channel 1, QP 3
  CHECK(r->qps[8].qpn == 0);      // rank 1's own
  CHECK(r->qps[16].qpn == 0x110);
  // Both sides must agree on the count.
  BlobExpect one = expect_for(b);
  one.qps_per_connection = 1;
  CHECK_THAT(parse(bytes, one).message(), Catch::Contains("uses 4 QPs per connection, this rank 1"));
  // Every QP of ours must be named; the entry count follows the QP count.
  BlobInfo m = b;
  m.qps[6].qpn = 0;  // rank 0, channel 1, QP 2
  CHECK_THAT(parse(encode_blob(m), expect_for(b)).message(),
             Catch::Contains("no QP for rank 0 channel 1"));
  m = b;
  m.qps.pop_back();
  CHECK_THAT(parse(encode_blob(m), expect_for(b)).message(), Catch::Contains("x 4 QPs"));
  // 3 ranks x 10 channels x 16 QPs fit a blob; 3 x 11 x 16 (528 entries) do not.
  BlobInfo most = sample_blob(1, 3, 10, 16);
  CHECK(parse_blob(encode_blob(most), expect_for(most), "rank 1").ok());
  BlobInfo over = sample_blob(1, 3, 11, 16);
  CHECK(parse(encode_blob(over), expect_for(over)).code() == Code::kRemoteError);
}

TEST_CASE("verbs: zero-copy messages split over the QPs of a connection", "[unit][verbs]") {
  CHECK(zero_copy_split(1, 1).parts == 1);
  CHECK(zero_copy_split(1, 4).parts == 1);
  CHECK(zero_copy_split(4096, 4).parts == 1);
  CHECK(zero_copy_split(4097, 4).parts == 2);
  CHECK(zero_copy_split(1 << 20, 4).part == 256 << 10);
  CHECK(zero_copy_split(1 << 20, 4).parts == 4);
  CHECK(zero_copy_split((1 << 20) + 1, 4).parts == 4);
  CHECK(zero_copy_split(0, 4).parts == 0);
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4095}, uint64_t{65537}, uint64_t{3} << 20,
                         uint64_t{1234567}, uint64_t{1} << 33}) {
    for (uint32_t qps = 1; qps <= kMaxQpsPerConnection; ++qps) {
      const ZeroCopySplit z = zero_copy_split(bytes, qps);
      INFO(bytes << " bytes over " << qps << " QPs");
      CHECK(z.part % 4096 == 0);
      CHECK(z.parts >= 1);
      CHECK(z.parts <= qps);
      CHECK(z.part * z.parts >= bytes);        // the parts cover the message
      CHECK(z.part * (z.parts - 1) < bytes);   // and none is empty
    }
  }
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
  CHECK_THAT(bad_byte(4, 4).message(), Catch::Contains("version 4"));
  CHECK_THAT(bad_byte(11, 0).message(), Catch::Contains("0 QPs per connection"));
  CHECK_THAT(bad_byte(11, 17).message(), Catch::Contains("17 QPs per connection"));
  CHECK_THAT(bad_byte(11, 2).message(), Catch::Contains("uses 2 QPs per connection, this rank 1") &&
                                            Catch::Contains("NCCL_IB_QPS_PER_CONNECTION"));
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
  // An older credit (overtaken by one a slot carried over another QP) changes nothing.
  CHECK(widen_credit(far, credit_imm(far - 3)) == far);
  CHECK(widen_credit(near + 5, credit_imm(near)) == near + 5);
  // Credits in slot headers: 32 bits, older ones ignored, across the wrap.
  CHECK(widen_slot_credit(100, 105) == 105);
  CHECK(widen_slot_credit(100, 100) == 100);
  CHECK(widen_slot_credit(100, 99) == 100);
  const uint64_t wrap = (uint64_t{3} << 32) - 16;
  CHECK(widen_slot_credit(wrap, static_cast<uint32_t>(wrap + 32)) == wrap + 32);
  CHECK(widen_slot_credit(wrap + 32, static_cast<uint32_t>(wrap)) == wrap + 32);
}

TEST_CASE("verbs: slot headers are checked against what is due", "[unit][verbs]") {
  const size_t slot = 4096, room = slot - kSlotHeaderBytes;
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.payload = static_cast<uint32_t>(room);
  h.total = 3 * room;
  h.offset = room;
  h.seq = 9;
  CHECK(check_slot(h, 9, true, room, 3 * room, slot).empty());
  CHECK_THAT(check_slot(h, 8, true, room, 3 * room, slot), Catch::Contains("slot 9 where slot 8"));
  CHECK_THAT(check_slot(h, 9, false, 0, 0, slot), Catch::Contains("offset"));
  CHECK_THAT(check_slot(h, 9, true, room, 4 * room, slot), Catch::Contains("middle"));
  SlotHeader m = h;
  m.magic = 1;
  CHECK_THAT(check_slot(m, 9, true, room, 3 * room, slot), Catch::Contains("magic"));
  m = h;
  m.payload = static_cast<uint32_t>(room + 1);
  CHECK_THAT(check_slot(m, 9, true, room, 3 * room, slot), Catch::Contains("payload"));
  m = h;
  m.payload = 10;  // short, but not the last
  CHECK_THAT(check_slot(m, 9, true, room, 3 * room, slot), Catch::Contains("partial"));
  m = h;
  m.flags = 4;
  CHECK_THAT(check_slot(m, 9, true, room, 3 * room, slot), Catch::Contains("flags 0x4"));
  m = h;
  m.credit = 1;  // a credit without its flag
  CHECK_THAT(check_slot(m, 9, true, room, 3 * room, slot), Catch::Contains("credit"));
  m.flags = kSlotCredit;
  CHECK(check_slot(m, 9, true, room, 3 * room, slot).empty());
  m.flags = 4;
  CHECK_THAT(check_slot(m, 9, true, room, 3 * room, slot), Catch::Contains("flags"));
  m = h;
  m.offset = 0;
  m.total = 5;
  m.payload = 10;  // past the message's end
  CHECK_FALSE(check_slot(m, 9, false, 0, 0, slot).empty());
  m.payload = 5;
  CHECK(check_slot(m, 9, false, 0, 0, slot).empty());
  // The first slot after an announcement: offset 0 of the message announced, same size.
  m = h;
  m.offset = 0;
  CHECK(check_slot(m, 9, true, 0, 3 * room, slot).empty());
  CHECK_THAT(check_slot(m, 9, true, 0, 2 * room, slot), Catch::Contains("middle"));
}

TEST_CASE("verbs: rendezvous announcements, replies and immediates", "[unit][verbs]") {
  const size_t slot = 4096;
  SlotHeader a{};
  a.magic = kSlotMagic;
  a.flags = kSlotAnnounce;
  a.total = 1 << 20;
  a.seq = 3;
  CHECK(check_slot(a, 3, false, 0, 0, slot).empty());
  CHECK_THAT(check_slot(a, 3, true, 0, 1 << 20, slot), Catch::Contains("middle of a message"));
  SlotHeader m = a;
  m.payload = 8;
  CHECK_THAT(check_slot(m, 3, false, 0, 0, slot), Catch::Contains("8 payload bytes"));
  m = a;
  m.total = 0;
  CHECK_THAT(check_slot(m, 3, false, 0, 0, slot), Catch::Contains("0-byte message"));
  m = a;
  m.offset = 64;
  CHECK_THAT(check_slot(m, 3, false, 0, 0, slot), Catch::Contains("at offset 64"));
  CHECK_THAT(check_slot(a, 4, false, 0, 0, slot), Catch::Contains("slot 3 where slot 4"));

  RdvReply r{};
  r.magic = kRdvReplyMagic;
  r.mode = kRdvZeroCopy;
  r.seq = 3;
  r.bytes = 1 << 20;
  r.addr = 0x7f0000001000;
  r.rkey = 0x42;
  CHECK(check_reply(r, 3, 1 << 20).empty());
  CHECK_THAT(check_reply(r, 4, 1 << 20), Catch::Contains("slot 3 where slot 4"));
  CHECK_THAT(check_reply(r, 3, 1 << 21), Catch::Contains("for 1048576 bytes"));
  auto bad = [&](auto edit) {
    RdvReply b = r;
    edit(b);
    return check_reply(b, 3, 1 << 20);
  };
  CHECK_THAT(bad([](RdvReply& b) { b.magic = 7; }), Catch::Contains("magic"));
  CHECK_THAT(bad([](RdvReply& b) { b.mode = 3; }), Catch::Contains("mode 3"));
  CHECK_THAT(bad([](RdvReply& b) { b.mode = 0; }), Catch::Contains("mode 0"));
  CHECK_THAT(bad([](RdvReply& b) { b.addr = 0; }), Catch::Contains("at 0x0"));
  CHECK_THAT(bad([](RdvReply& b) { b.addr = UINT64_MAX - 100; }), Catch::Contains("1048576 bytes at"));
  CHECK_THAT(bad([](RdvReply& b) { b.reserved = 1; }), Catch::Contains("reserved"));
  CHECK_THAT(bad([](RdvReply& b) { b.reserved2 = 1; }), Catch::Contains("reserved"));
  CHECK_THAT(bad([](RdvReply& b) { b.mode = kRdvRing; }), Catch::Contains("with an address"));
  RdvReply ring{};
  ring.magic = kRdvReplyMagic;
  ring.mode = kRdvRing;
  ring.seq = 3;
  ring.bytes = 1 << 20;
  CHECK(check_reply(ring, 3, 1 << 20).empty());
  // Random corruption of a good reply never passes unless it left the reply as it was.
  uint64_t x = 0x243f6a8885a308d3ull;
  for (int i = 0; i < 20000; ++i) {
    RdvReply c = r;
    auto* p = reinterpret_cast<uint8_t*>(&c);
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[x % sizeof(c)] ^= static_cast<uint8_t>(1u << ((x >> 8) % 8));
    if (c.addr != r.addr || c.rkey != r.rkey) continue;  // still a valid place to write
    INFO("corruption " << i);
    CHECK_FALSE(check_reply(c, 3, 1 << 20).empty());
  }

  for (uint64_t seq : {uint64_t{0}, uint64_t{5}, uint64_t{0x1fffffff}, uint64_t{0x123456789}}) {
    const uint32_t imm = rdv_done_imm(seq);
    CHECK(is_rdv_done_imm(imm));
    CHECK(imm == rdv_done_imm(seq + (uint64_t{1} << 29)));
    CHECK((imm & kImmRdvDoneMask) == (seq & kImmRdvDoneMask));
    CHECK_FALSE(is_slot_imm(imm));
    CHECK_FALSE(is_credit_imm(imm));
  }
  for (uint32_t control : {kImmHello, kImmFarewell, kImmRdvReply}) {
    CHECK_FALSE(is_rdv_done_imm(control));
    CHECK_FALSE(is_slot_imm(control));
    CHECK_FALSE(is_credit_imm(control));
  }
  CHECK_FALSE(is_rdv_done_imm(credit_imm(0x3fffffff)));
  CHECK_FALSE(is_rdv_done_imm(slot_imm(0x7fffffff)));
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

// The QPs of a connection the verbs instance made (each watched through its side channel).
uint32_t qps_of(Connection* c) {
  auto* watched = dynamic_cast<WatchedConnection*>(c);
  REQUIRE(watched != nullptr);
  return watched->inner().nqps();
}

}  // namespace

TEST_CASE("verbs: messages larger than the ring travel through it, both ways at once",
          "[rdma][verbs]") {
  // With 4 QPs per connection, slots go round robin over them and land out of order.
  const uint32_t qps = GENERATE(1u, 4u);
  INFO(qps << " QPs per connection");
  RdmaPair pair;
  VerbsOptions options{4, 4096};  // 16 KiB of ring per direction
  options.qps_per_connection = qps;
  connect_pair(&pair, options);
  for (int r = 0; r < 2; ++r) CHECK(qps_of(pair.conn(r)) == qps);
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

// A message that fits in an inline send (header and payload within the QP's inline data) has
// its payload copied when posted: its send completes before the peer posts a receive (eager),
// the counters say inline, and the data arrives intact. A longer message does not complete
// before it is received, and an inline one queued behind it completes only after it (requests
// complete in order).
TEST_CASE("verbs: small messages go inline, their sends complete at once and in order",
          "[rdma][verbs]") {
  RdmaPair pair;
  connect_pair(&pair, VerbsOptions{8, 8192});
  const ByteCounts before = instance_byte_counts(*pair.inst[0]);
  const std::vector<float> small = random_floats(2, 5), long_one = random_floats(1000, 6);
  std::vector<float> got_small(small.size(), -1.0f), got_long(long_one.size(), -1.0f);
  std::vector<float> got_small2(small.size(), -1.0f);
  SendRequest s;
  s.buf = small.data();
  s.bytes = small.size() * sizeof(float);
  s.tag = tag_of(1, small.size());
  pair.conn(0)->post_send(&s);
  Deadline deadline = Deadline::after_ms(20000);
  while (!s.done() && !deadline.expired()) pair.conn(0)->progress();
  REQUIRE(s.done());  // nobody has posted the receive yet
  REQUIRE_FALSE(s.failed());
  CHECK(instance_byte_counts(*pair.inst[0]).inline_sent - before.inline_sent == s.bytes);

  // A message too long to go inline, then an inline one behind it.
  SendRequest l, s2;
  l.buf = long_one.data();
  l.bytes = long_one.size() * sizeof(float);
  l.tag = tag_of(2, long_one.size());
  s2.buf = small.data();
  s2.bytes = s.bytes;
  s2.tag = tag_of(3, small.size());
  pair.conn(0)->post_send(&l);
  pair.conn(0)->post_send(&s2);
  for (int i = 0; i < 200; ++i) {
    pair.conn(0)->progress();
    const bool out_of_order = s2.done() && !l.done();
    REQUIRE_FALSE(out_of_order);
  }

  RecvRequest r, rl, r2;
  r.dst = got_small.data();
  r.bytes = s.bytes;
  r.tag = s.tag;
  rl.dst = got_long.data();
  rl.bytes = l.bytes;
  rl.tag = l.tag;
  r2.dst = got_small2.data();
  r2.bytes = s2.bytes;
  r2.tag = s2.tag;
  for (RecvRequest* q : {&r, &rl, &r2}) pair.conn(1)->post_recv(q);
  REQUIRE(drive(pair, {&l, &s2, &r, &rl, &r2}));
  for (Request* q : std::initializer_list<Request*>{&l, &s2, &r, &rl, &r2})
    REQUIRE_FALSE(q->failed());
  CHECK(got_small == small);
  CHECK(got_long == long_one);
  CHECK(got_small2 == small);
  const ByteCounts after = instance_byte_counts(*pair.inst[0]);
  CHECK(after.ring_sent - before.ring_sent == 2 * s.bytes + l.bytes);
  CHECK(pair.conn(0)->idle());
  CHECK(pair.conn(1)->idle());
}

// Rendezvous: a message of at least rdv_bytes from registered memory is announced; the
// receiver answers with its buffer's address when that is registered too (the sender writes it
// there: no byte through the ring), else the message follows through the ring. Eager and
// rendezvous messages queued back to back, both directions at once, stay in order; the
// instance's counters tell which way every payload byte went.
TEST_CASE("verbs: rendezvous writes registered messages straight into registered receives",
          "[rdma][verbs][rdv]") {
  // With 4 QPs per connection, each zero-copy message is split over them (a part each).
  const uint32_t qps = GENERATE(1u, 4u);
  INFO(qps << " QPs per connection");
  RdmaPair pair;
  VerbsOptions options{4, 8192};
  options.rdv_bytes = 16384;
  options.qps_per_connection = qps;
  connect_pair(&pair, options);
  for (int r = 0; r < 2; ++r) CHECK(qps_of(pair.conn(r)) == qps);
  // Floats: below the threshold, at it, several slots' worth, and beyond one 1 MiB write.
  const std::vector<size_t> counts = {4095, 4096, 30001, 300007};
  size_t total = 0;
  for (size_t c : counts) total += c;
  struct Side {
    std::vector<float> out, in;
    std::unique_ptr<RegistrationKey> out_key, in_key;
  };
  Side side[2];
  for (int r = 0; r < 2; ++r) {
    side[r].out = random_floats(total, 10 + r);
    side[r].in.assign(total, -1.0f);
    KeyFactory make = pair.inst[r]->key_factory();
    REQUIRE(make);
    auto k1 = make(RegisteredRange{side[r].out.data(), total * sizeof(float), std::nullopt});
    auto k2 = make(RegisteredRange{side[r].in.data(), total * sizeof(float), std::nullopt});
    REQUIRE(k1.ok());
    REQUIRE(k2.ok());
    side[r].out_key = std::move(k1).value();
    side[r].in_key = std::move(k2).value();
  }
  const ByteCounts before[2] = {instance_byte_counts(*pair.inst[0]),
                                instance_byte_counts(*pair.inst[1])};
  std::vector<SendRequest> sends(2 * counts.size());
  std::vector<RecvRequest> recvs(2 * counts.size());
  std::vector<Request*> all;
  for (int r = 0; r < 2; ++r) {
    size_t at = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      SendRequest& s = sends[r * counts.size() + i];
      s.buf = side[r].out.data() + at;
      s.bytes = counts[i] * sizeof(float);
      s.tag = tag_of(static_cast<uint32_t>(i + 1), counts[i]);
      s.key = side[r].out_key.get();
      RecvRequest& q = recvs[r * counts.size() + i];  // rank 1 - r receives it
      q.dst = side[1 - r].in.data() + at;
      q.bytes = s.bytes;
      q.tag = s.tag;
      q.key = side[1 - r].in_key.get();
      if (i == 2) {  // the size comes from the sender: a larger capacity
        q.size_from_sender = true;
        q.bytes = (total - at) * sizeof(float);
        q.tag.count = 0;
      }
      at += counts[i];
      all.push_back(&s);
      all.push_back(&q);
    }
  }
  // Sends first, so that announcements wait for receives; the receives then come in order.
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < counts.size(); ++i) {
      pair.conn(r)->post_send(&sends[r * counts.size() + i]);
    }
  for (int r = 0; r < 2; ++r) {
    MsgTag tag;
    uint64_t bytes = 0;
    Deadline deadline = Deadline::after_ms(20000);
    while (!pair.conn(1 - r)->peek(&tag, &bytes) && !deadline.expired()) {
      pair.conn(r)->progress();
    }
    CHECK(tag == sends[r * counts.size()].tag);
    CHECK(bytes == counts[0] * sizeof(float));
  }
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < counts.size(); ++i) {
      pair.conn(1 - r)->post_recv(&recvs[r * counts.size() + i]);
    }
  REQUIRE(drive(pair, all));
  for (Request* q : all) REQUIRE_FALSE(q->failed());
  CHECK(side[1].in == side[0].out);
  CHECK(side[0].in == side[1].out);
  CHECK(recvs[2].bytes == counts[2] * sizeof(float));
  CHECK(recvs[2].tag.count == counts[2]);
  const uint64_t eager = counts[0] * sizeof(float);
  const uint64_t zero_copy = (total - counts[0]) * sizeof(float);
  for (int r = 0; r < 2; ++r) {
    const ByteCounts now = instance_byte_counts(*pair.inst[r]);
    CHECK(now.ring_sent - before[r].ring_sent == eager);
    CHECK(now.ring_received - before[r].ring_received == eager);
    CHECK(now.zero_copy_sent - before[r].zero_copy_sent == zero_copy);
    CHECK(now.zero_copy_received - before[r].zero_copy_received == zero_copy);
  }
  CHECK(pair.conn(0)->idle());
  CHECK(pair.conn(1)->idle());

  // An unregistered receive, and a reducing one: the announced message comes through the ring.
  const ByteCounts mid = instance_byte_counts(*pair.inst[1]);
  const size_t n = counts[3];
  std::vector<float> plain(n, -1.0f), acc(n), want(n);
  const std::vector<float> base = random_floats(n, 77);
  for (size_t i = 0; i < n; ++i) want[i] = base[i] + side[0].out[i];
  SendRequest s1, s2;
  for (SendRequest* s : {&s1, &s2}) {
    s->buf = side[0].out.data();
    s->bytes = n * sizeof(float);
    s->key = side[0].out_key.get();
  }
  s1.tag = tag_of(10, n);
  s2.tag = tag_of(11, n);
  RecvRequest q1, q2;
  q1.dst = plain.data();
  q1.bytes = s1.bytes;
  q1.tag = s1.tag;
  q2.dst = side[1].in.data();  // registered, but reducing
  q2.key = side[1].in_key.get();
  q2.src = base.data();
  q2.bytes = s2.bytes;
  q2.tag = s2.tag;
  q2.reduce = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  q2.elem_size = sizeof(float);
  pair.conn(0)->post_send(&s1);
  pair.conn(0)->post_send(&s2);
  pair.conn(1)->post_recv(&q1);
  pair.conn(1)->post_recv(&q2);
  REQUIRE(drive(pair, {&s1, &s2, &q1, &q2}));
  REQUIRE_FALSE(q1.failed());
  REQUIRE_FALSE(q2.failed());
  CHECK(std::equal(plain.begin(), plain.end(), side[0].out.begin()));
  CHECK(std::equal(want.begin(), want.end(), side[1].in.begin()));
  const ByteCounts end = instance_byte_counts(*pair.inst[1]);
  CHECK(end.ring_received - mid.ring_received == 2 * n * sizeof(float));
  CHECK(end.zero_copy_received == mid.zero_copy_received);
}

// An announced message that the receiver does not expect: both sides fail with
// ncclInvalidUsage (the sender, waiting for the reply, learns it from the farewell).
TEST_CASE("verbs: a mismatched rendezvous message fails both sides", "[rdma][verbs][rdv]") {
  RdmaPair pair;
  VerbsOptions options{4, 8192};
  options.rdv_bytes = 4096;
  connect_pair(&pair, options);
  std::vector<float> a = random_floats(10000, 5), got(10000);
  KeyFactory make0 = pair.inst[0]->key_factory(), make1 = pair.inst[1]->key_factory();
  auto k0 = make0(RegisteredRange{a.data(), a.size() * sizeof(float), std::nullopt});
  auto k1 = make1(RegisteredRange{got.data(), got.size() * sizeof(float), std::nullopt});
  REQUIRE(k0.ok());
  REQUIRE(k1.ok());
  SendRequest s;
  s.buf = a.data();
  s.bytes = a.size() * sizeof(float);
  s.tag = tag_of(3, a.size());
  s.key = k0.value().get();
  RecvRequest r;
  r.dst = got.data();
  r.bytes = s.bytes - 4;  // one float fewer
  r.tag = tag_of(3, a.size() - 1);
  r.key = k1.value().get();
  pair.conn(0)->post_send(&s);
  pair.conn(1)->post_recv(&r);
  drive(pair, {&s, &r}, 20000);
  REQUIRE(r.failed());
  REQUIRE(s.failed());
  CHECK(pair.conn(1)->error().code() == Code::kInvalidUsage);
  CHECK(pair.conn(0)->error().code() == Code::kInvalidUsage);
  CHECK_THAT(pair.conn(0)->error().message(), Catch::Contains("gave up") &&
                                                  Catch::Contains("expects"));
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

// NCCL_IB_ADDR_FAMILY on the real device: AF_INET picks an IPv4-mapped GID; AF_INET6 picks a
// routable IPv6 one when the device has one (sysfs says), else refuses naming the variable.
TEST_CASE("verbs: NCCL_IB_ADDR_FAMILY chooses the GID's family on the device", "[rdma][verbs]") {
  auto filter = parse_hca_filter("");
  REQUIRE(filter.ok());
  GidPolicy inet;
  inet.family = "AF_INET";
  auto v4 = Device::open(filter.value(), inet);
  REQUIRE(v4.ok());
  REQUIRE(v4.value() != nullptr);  // [rdma] cases run only where a device exists
  const std::shared_ptr<Device>& dev = v4.value();
  INFO(dev->describe());
  CHECK(gid_to_string(dev->gid().raw).rfind("::ffff:", 0) == 0);
  // Does the port have a RoCE GID with a routable IPv6 address?
  bool has_ipv6 = false;
  const std::string port = "/sys/class/infiniband/" + dev->name() + "/ports/" +
                           std::to_string(dev->port());
  for (int i = 0; i < dev->port_attr().gid_tbl_len && i < 256; ++i) {
    std::ifstream gid_file(port + "/gids/" + std::to_string(i));
    std::ifstream type_file(port + "/gid_attrs/types/" + std::to_string(i));
    std::string gid, type;
    if (!std::getline(gid_file, gid) || !std::getline(type_file, type)) continue;
    if (type.rfind("RoCE", 0) != 0) continue;
    if (gid.rfind("0000:0000:0000:0000:0000:0000:", 0) == 0) continue;  // zero
    if (gid.rfind("0000:0000:0000:0000:0000:ffff:", 0) == 0) continue;  // IPv4-mapped
    if (gid.rfind("fe80:", 0) == 0) continue;                            // link-local
    has_ipv6 = true;
  }
  GidPolicy inet6;
  inet6.family = "AF_INET6";
  auto v6 = Device::open(filter.value(), inet6);
  if (has_ipv6) {
    REQUIRE(v6.ok());
    REQUIRE(v6.value() != nullptr);
    const std::string text = gid_to_string(v6.value()->gid().raw);
    CHECK(text.rfind("::ffff:", 0) != 0);
    CHECK(text.rfind("fe80:", 0) != 0);
  } else {
    REQUIRE_FALSE(v6.ok());
    CHECK(v6.status().code() == Code::kInvalidArgument);
    CHECK_THAT(v6.status().message(), Catch::Contains("NCCL_IB_ADDR_FAMILY=AF_INET6") &&
                                          Catch::Contains(dev->name()));
  }
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
