// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_wire.h
// What the verbs transport puts on the wire and in its published blob, and the NCCL_IB_HCA
// device filter: pure functions without libibverbs, so that they are unit-tested (and fuzzed)
// on hosts without RDMA. README.md describes every field.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transports/transport.h"

namespace chorus::verbs {

// ---- The blob (what a rank publishes through the authenticated bootstrap) ------------------
//
// Little-endian, kBlobHeaderBytes of header then one kBlobEntryBytes entry per (rank, channel):
//   0 u32 magic 'CHIB' | 4 u16 version | 6 u8 link layer (1 IB, 2 Ethernet) | 7 u8 active MTU
//   (enum ibv_mtu, 1..5) | 8 u16 LID | 10 u8 port | 11 u8 QPs per connection (1..16) |
//   12 u32 rank | 16 u32 nranks | 20 u32 channels | 24 u32 slots | 28 u32 slot bytes |
//   32 u64 ring base address | 40 u32 ring rkey | 44 u32 entries (= nranks x channels x QPs per
//   connection) | 48 gid[16]
//   entry [(r * channels + c) * qps + q]: u32 QP number | u32 initial PSN of this rank's QP q
//   for (r, c); zero for its own rank.
inline constexpr uint32_t kBlobMagic = 0x43484942;  // "CHIB"
inline constexpr uint16_t kBlobVersion = 3;  // 2: rendezvous; 3: QPs per connection
inline constexpr size_t kBlobHeaderBytes = 64;
inline constexpr size_t kBlobEntryBytes = 8;
inline constexpr size_t kMaxBlobBytes = 4096;  // = kMaxTransportBlob
inline constexpr size_t kMaxEntries = (kMaxBlobBytes - kBlobHeaderBytes) / kBlobEntryBytes;
inline constexpr uint32_t kMaxQpsPerConnection = 16;

// Ring geometry limits (every rank must use the same slots and slot bytes).
inline constexpr uint32_t kMinSlots = 4;
inline constexpr uint32_t kMaxSlots = 256;
inline constexpr uint32_t kMinSlotBytes = 4096;
inline constexpr uint32_t kMaxSlotBytes = 8u << 20;  // rxe's max_msg_sz; the port's is checked too
inline constexpr size_t kSlotHeaderBytes = 64;
// After a connection's slots: the farewell (header + text), the rendezvous reply, then one
// 32-byte hello per QP of the connection.
inline constexpr size_t kAuxBytes = 4096;
inline constexpr size_t kFarewellOffset = 64;
inline constexpr size_t kRdvReplyOffset = 2176;
inline constexpr size_t kHelloOffset = 2304;
inline constexpr size_t kHelloBytes = 32;
static_assert(kFarewellOffset + 16 + kMaxFarewellBytes <= kRdvReplyOffset);
static_assert(kRdvReplyOffset + 64 <= kHelloOffset);
static_assert(kHelloOffset + kMaxQpsPerConnection * kHelloBytes <= kAuxBytes);

// Bytes of one connection's ring (its slots, then the aux area).
inline uint64_t ring_stride(uint32_t slots, uint32_t slot_bytes) {
  return uint64_t{slots} * slot_bytes + kAuxBytes;
}

struct QpEntry {
  uint32_t qpn = 0;
  uint32_t psn = 0;
};

struct BlobInfo {
  uint8_t link_layer = 0;
  uint8_t mtu = 0;
  uint16_t lid = 0;
  uint8_t port = 0;
  uint32_t rank = 0;
  uint32_t nranks = 0;
  uint32_t channels = 0;
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;
  uint32_t qps_per_connection = 1;
  uint64_t ring_base = 0;
  uint32_t ring_rkey = 0;
  std::array<uint8_t, 16> gid{};
  std::vector<QpEntry> qps;  // [(rank * channels + channel) * qps_per_connection + q]
};

std::string encode_blob(const BlobInfo& info);

// What the parser demands of a peer's blob: it is rank `rank` of a communicator like ours.
struct BlobExpect {
  uint32_t rank = 0;
  uint32_t nranks = 0;
  uint32_t channels = 0;
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;
  uint32_t my_rank = 0;  // the entries for us must name QPs
  uint32_t qps_per_connection = 1;
};

// Parses `bytes` defensively: bounded by its length, versioned, every field checked against
// `expect` and its range. kRemoteError naming `who` and the bad field otherwise.
Result<BlobInfo> parse_blob(std::string_view bytes, const BlobExpect& expect,
                            const std::string& who);

// ---- Immediate data of a work request (sent big-endian, as a __be32) ------------------------
//   bit 31 = 0                  a slot: low 31 bits of its sequence number
//   bits 31,30 = 1,0            a credit: low 30 bits of the receiver's consumed-slot count
//   bits 31..29 = 1,1,0         a rendezvous message written: low 29 bits of the sequence
//                               number of the slot that announced it
//   0xfffffffd                  a rendezvous reply (RdvReply in the aux area)
//   0xfffffffe / 0xffffffff     the hello / the farewell (data in the aux area)
inline constexpr uint32_t kImmRdvReply = 0xfffffffd;
inline constexpr uint32_t kImmHello = 0xfffffffe;
inline constexpr uint32_t kImmFarewell = 0xffffffff;
inline constexpr uint32_t kImmRdvDoneFlag = 0xc0000000;
inline constexpr uint32_t kImmRdvDoneMask = 0x1fffffff;
inline uint32_t rdv_done_imm(uint64_t seq) {
  return kImmRdvDoneFlag | (static_cast<uint32_t>(seq) & kImmRdvDoneMask);
}
inline bool is_rdv_done_imm(uint32_t imm) { return (imm & 0xe0000000u) == kImmRdvDoneFlag; }
inline constexpr uint32_t kImmSlotMask = 0x7fffffff;
inline constexpr uint32_t kImmCreditFlag = 0x80000000;
inline constexpr uint32_t kImmCreditMask = 0x3fffffff;
inline uint32_t slot_imm(uint64_t seq) { return static_cast<uint32_t>(seq) & kImmSlotMask; }
inline uint32_t credit_imm(uint64_t consumed) {
  return kImmCreditFlag | (static_cast<uint32_t>(consumed) & kImmCreditMask);
}
inline bool is_slot_imm(uint32_t imm) { return (imm & 0x80000000u) == 0; }
inline bool is_credit_imm(uint32_t imm) { return (imm & 0xc0000000u) == kImmCreditFlag; }
// The full count a credit's low 30 bits stand for, given the last one known (counts only grow,
// and by less than 2^29 between two credits); `last` itself when the credit is not newer (one
// carried by a slot over another QP may have overtaken it).
inline uint64_t widen_credit(uint64_t last, uint32_t imm) {
  const uint64_t ahead = (static_cast<uint64_t>(imm & kImmCreditMask) - last) & kImmCreditMask;
  return ahead < (uint64_t{1} << 29) ? last + ahead : last;
}

// ---- In a slot and in the aux area (host byte order, like the other transports) -------------

// First kSlotHeaderBytes of every slot; the payload follows.
struct SlotHeader {
  uint32_t magic;    // kSlotMagic
  uint32_t payload;  // payload bytes in this slot
  MsgTag tag;        // the sender's tag
  uint64_t total;    // bytes of the whole message
  uint64_t offset;   // of this slot's payload in the message
  uint64_t seq;      // the slot's sequence number on the connection
  uint32_t flags;    // kSlotAnnounce and/or kSlotCredit, or 0
  uint32_t credit;   // with kSlotCredit: low 32 bits of the sender's consumed count of our slots
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes);
inline constexpr uint32_t kSlotMagic = 0x4348494d;  // "CHIM"
// A header-only slot (payload 0, offset 0) that announces a message of `total` bytes (> 0)
// from registered memory: the receiver answers with an RdvReply, and the payload follows either
// written straight into the receiver's buffer or as ordinary slots from offset 0.
inline constexpr uint32_t kSlotAnnounce = 1;
// The slot carries a credit (SlotHeader::credit): a connection returns credits in the slots it
// sends anyway, and posts a credit of its own only when it has none to send.
inline constexpr uint32_t kSlotCredit = 2;
// The consumed count that a credit's low 32 bits stand for, given the last one known; `last`
// itself when the credit is not newer (slots over several QPs may carry credits out of order).
inline uint64_t widen_slot_credit(uint64_t last, uint32_t credit) {
  const auto ahead = static_cast<int32_t>(credit - static_cast<uint32_t>(last));
  return ahead > 0 ? last + static_cast<uint64_t>(ahead) : last;
}

// Checks a slot's header against what the receiver expects next: slot `seq`; with
// `in_message`, the payload at `offset` of the message of `total` bytes already begun (or
// announced), else the first slot (or the announcement) of a new message. Empty when fine,
// else what is wrong, for an error message.
std::string check_slot(const SlotHeader& h, uint64_t seq, bool in_message, uint64_t offset,
                       uint64_t total, size_t slot_bytes);

// The receiver's answer to an announcement, written into the sender's aux area
// (kRdvReplyOffset) with immediate kImmRdvReply: either where to write the message (zero copy:
// `addr` in the memory of `rkey`, `bytes` long) or "send it through my ring" (addr and rkey 0).
struct RdvReply {
  uint32_t magic;  // kRdvReplyMagic
  uint32_t mode;   // kRdvZeroCopy or kRdvRing
  uint64_t seq;    // sequence number of the announcing slot
  uint64_t bytes;  // the message's size, as the receiver accepted it
  uint64_t addr;
  uint32_t rkey;
  uint32_t reserved;
  uint64_t reserved2;
};
static_assert(sizeof(RdvReply) == 48);
inline constexpr uint32_t kRdvReplyMagic = 0x43485256;  // "CHRV"
inline constexpr uint32_t kRdvZeroCopy = 1;
inline constexpr uint32_t kRdvRing = 2;

// Checks a reply against the announcement it must answer (slot `seq`, `bytes`). Empty when
// fine, else what is wrong.
std::string check_reply(const RdvReply& r, uint64_t seq, uint64_t bytes);

// How a zero-copy message of `bytes` (> 0) is split over the `qps` QPs of a connection: into
// parts of `part` bytes (a multiple of 4096; the last may be shorter), part i on QP i, each
// ending with a WRITE_WITH_IMM; `parts` of them (at most qps), so the receiver expects that
// many ends. Both sides compute it from the announced size.
struct ZeroCopySplit {
  uint64_t part = 0;
  uint32_t parts = 0;
};
ZeroCopySplit zero_copy_split(uint64_t bytes, uint32_t qps);

// One per QP of a connection, written over that QP into the peer's aux area at kHelloOffset +
// q x kHelloBytes.
struct Hello {
  uint32_t magic;  // kHelloMagic
  uint32_t from;
  uint32_t to;
  uint32_t channel;
  uint64_t comm_uid;
  uint32_t qpn;  // the sender's QP
  uint32_t index;  // q: which QP of the connection
};
static_assert(sizeof(Hello) == kHelloBytes);
inline constexpr uint32_t kHelloMagic = 0x43484948;  // "CHIH"

struct FarewellHeader {
  uint32_t magic;  // kFarewellMagic
  uint32_t code;   // Status code; kOk: a goodbye (the peer closed normally)
  uint64_t bytes;  // reason text that follows (at most kMaxFarewellBytes)
};
inline constexpr uint32_t kFarewellMagic = 0x43484657;  // "CHFW", as TCP's and UCX's

// ---- NCCL_IB_HCA --------------------------------------------------------------------------
//
// A comma-separated list of device names, each optionally ":port". A leading '^' (on the list
// or on one item) excludes; a leading '=' (on the list or one item) matches names exactly,
// else as prefixes. Empty: every device. "mlx5_0:1,^mlx5_1", "^=mlx5_2", "=rxe0".
struct HcaFilter {
  struct Item {
    std::string name;
    int port = -1;  // any
    bool exclude = false;
    bool exact = false;
  };
  std::vector<Item> items;
  bool matches(std::string_view device, int port) const;
};
Result<HcaFilter> parse_hca_filter(std::string_view spec);

}  // namespace chorus::verbs
