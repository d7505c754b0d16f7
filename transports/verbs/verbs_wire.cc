// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_wire.cc
// The blob codec, the slot check and the NCCL_IB_HCA parser.
#include "transports/verbs/verbs_wire.h"

#include <fmt/format.h>

#include <cstring>

#include "common/bytes.h"

namespace chorus::verbs {

using le::get_u16;
using le::get_u32;
using le::get_u64;
using le::put_u16;
using le::put_u32;
using le::put_u64;

std::string encode_blob(const BlobInfo& info) {
  std::string out(kBlobHeaderBytes + info.qps.size() * kBlobEntryBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  put_u32(p, kBlobMagic);
  put_u16(p + 4, kBlobVersion);
  p[6] = info.link_layer;
  p[7] = info.mtu;
  put_u16(p + 8, info.lid);
  p[10] = info.port;
  p[11] = static_cast<uint8_t>(info.qps_per_connection);
  put_u32(p + 12, info.rank);
  put_u32(p + 16, info.nranks);
  put_u32(p + 20, info.channels);
  put_u32(p + 24, info.slots);
  put_u32(p + 28, info.slot_bytes);
  put_u64(p + 32, info.ring_base);
  put_u32(p + 40, info.ring_rkey);
  put_u32(p + 44, static_cast<uint32_t>(info.qps.size()));
  std::memcpy(p + 48, info.gid.data(), 16);
  for (size_t i = 0; i < info.qps.size(); ++i) {
    put_u32(p + kBlobHeaderBytes + i * kBlobEntryBytes, info.qps[i].qpn);
    put_u32(p + kBlobHeaderBytes + i * kBlobEntryBytes + 4, info.qps[i].psn);
  }
  return out;
}

Result<BlobInfo> parse_blob(std::string_view bytes, const BlobExpect& expect,
                            const std::string& who) {
  auto bad = [&](const std::string& what) {
    return remote_error("verbs: {} published a malformed verbs blob ({} bytes): {}", who,
                        bytes.size(), what);
  };
  if (bytes.size() < kBlobHeaderBytes) return bad("shorter than its header");
  if (bytes.size() > kMaxBlobBytes) return bad("longer than 4096 bytes");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (get_u32(p) != kBlobMagic) return bad(fmt::format("magic {:#010x}", get_u32(p)));
  if (get_u16(p + 4) != kBlobVersion) {
    return remote_error("verbs: {} speaks verbs blob version {}, this rank {}", who,
                        get_u16(p + 4), kBlobVersion);
  }
  BlobInfo b;
  b.link_layer = p[6];
  b.mtu = p[7];
  b.lid = get_u16(p + 8);
  b.port = p[10];
  b.qps_per_connection = p[11];
  b.rank = get_u32(p + 12);
  b.nranks = get_u32(p + 16);
  b.channels = get_u32(p + 20);
  b.slots = get_u32(p + 24);
  b.slot_bytes = get_u32(p + 28);
  b.ring_base = get_u64(p + 32);
  b.ring_rkey = get_u32(p + 40);
  const uint32_t entries = get_u32(p + 44);
  std::memcpy(b.gid.data(), p + 48, 16);
  if (b.qps_per_connection < 1 || b.qps_per_connection > kMaxQpsPerConnection) {
    return bad(fmt::format("{} QPs per connection", b.qps_per_connection));
  }
  if (b.qps_per_connection != expect.qps_per_connection) {
    return remote_error("verbs: {} uses {} QPs per connection, this rank {}; set "
                        "NCCL_IB_QPS_PER_CONNECTION (or CHORUS_IB_QPS_PER_CONNECTION) alike on "
                        "every rank",
                        who, b.qps_per_connection, expect.qps_per_connection);
  }
  if (b.link_layer != 1 && b.link_layer != 2) return bad(fmt::format("link layer {}", b.link_layer));
  if (b.mtu < 1 || b.mtu > 5) return bad(fmt::format("MTU code {}", b.mtu));
  if (b.port == 0) return bad("port 0");
  // Degenerate geometry is refused even where both sides agree on it (no entry would name us).
  if (b.nranks == 0 || b.rank >= b.nranks || expect.my_rank >= b.nranks || b.channels == 0) {
    return bad(fmt::format("rank {} of {} with {} channels", b.rank, b.nranks, b.channels));
  }
  if (b.rank != expect.rank || b.nranks != expect.nranks) {
    return bad(fmt::format("it is rank {} of {}, expected rank {} of {}", b.rank, b.nranks,
                           expect.rank, expect.nranks));
  }
  if (b.channels != expect.channels) {
    return bad(fmt::format("{} channels, expected {}", b.channels, expect.channels));
  }
  if (b.slots != expect.slots || b.slot_bytes != expect.slot_bytes) {
    return remote_error("verbs: {} uses {} slots of {} bytes, this rank {} of {}; set "
                        "CHORUS_IB_SLOTS and CHORUS_IB_SLOT_BYTES alike on every rank",
                        who, b.slots, b.slot_bytes, expect.slots, expect.slot_bytes);
  }
  if (b.slots < kMinSlots || b.slots > kMaxSlots || b.slot_bytes < kMinSlotBytes ||
      b.slot_bytes > kMaxSlotBytes || b.slot_bytes % 64 != 0) {
    return bad(fmt::format("ring of {} slots of {} bytes", b.slots, b.slot_bytes));
  }
  const uint64_t want = uint64_t{b.nranks} * b.channels * b.qps_per_connection;
  if (want > kMaxEntries || entries != want) {
    return bad(fmt::format("{} QP entries for {} ranks x {} channels x {} QPs", entries, b.nranks,
                           b.channels, b.qps_per_connection));
  }
  if (bytes.size() != kBlobHeaderBytes + size_t{entries} * kBlobEntryBytes) {
    return bad(fmt::format("{} bytes for {} QP entries", bytes.size(), entries));
  }
  // The whole ring region must lie in the address space: base + rings x stride, no wrap.
  const uint64_t region = ring_stride(b.slots, b.slot_bytes) * (entries / b.qps_per_connection);
  if (b.ring_base == 0 || b.ring_base > UINT64_MAX - region) {
    return bad(fmt::format("ring base {:#x}", b.ring_base));
  }
  b.qps.resize(entries);
  for (uint32_t i = 0; i < entries; ++i) {
    const uint8_t* e = p + kBlobHeaderBytes + size_t{i} * kBlobEntryBytes;
    b.qps[i] = QpEntry{get_u32(e), get_u32(e + 4)};
    const uint32_t rank = i / b.qps_per_connection / b.channels;
    const bool own = rank == b.rank;
    if (b.qps[i].qpn > 0xffffff || b.qps[i].psn > 0xffffff || (own && b.qps[i].qpn != 0)) {
      return bad(fmt::format("QP entry {}: qpn {:#x} psn {:#x}", i, b.qps[i].qpn, b.qps[i].psn));
    }
    if (rank == expect.my_rank && b.qps[i].qpn == 0) {
      return bad(fmt::format("no QP for rank {} channel {}", expect.my_rank,
                             i / b.qps_per_connection % b.channels));
    }
  }
  return b;
}

std::string check_slot(const SlotHeader& h, uint64_t seq, bool in_message, uint64_t offset,
                       uint64_t total, size_t slot_bytes) {
  if (h.magic != kSlotMagic) return fmt::format("a slot with magic {:#010x}", h.magic);
  if (h.seq != seq) return fmt::format("slot {} where slot {} was due", h.seq, seq);
  if ((h.flags & ~(kSlotAnnounce | kSlotCredit)) != 0 ||
      ((h.flags & kSlotCredit) == 0 && h.credit != 0)) {
    return fmt::format("a slot with flags {:#x} (credit {:#x})", h.flags, h.credit);
  }
  if ((h.flags & kSlotAnnounce) != 0) {
    if (in_message) return "an announcement in the middle of a message";
    if (h.payload != 0 || h.offset != 0 || h.total == 0) {
      return fmt::format("an announcement of a {}-byte message with {} payload bytes at offset "
                         "{}",
                         h.total, h.payload, h.offset);
    }
    return "";
  }
  if (h.payload > slot_bytes - kSlotHeaderBytes) {
    return fmt::format("a slot claiming {} payload bytes", h.payload);
  }
  if (!in_message) offset = 0;
  if (h.offset != offset) {
    return fmt::format("a slot at message offset {} where offset {} was due", h.offset, offset);
  }
  if (in_message && h.total != total) {
    return fmt::format("a slot of a {}-byte message in the middle of a {}-byte one", h.total,
                       total);
  }
  if (h.total < h.offset || h.total - h.offset < h.payload) {
    return fmt::format("a slot of {} bytes at offset {} of a {}-byte message", h.payload,
                       h.offset, h.total);
  }
  // Every slot but a message's last is full.
  if (h.offset + h.payload < h.total && h.payload != slot_bytes - kSlotHeaderBytes) {
    return fmt::format("a partial slot of {} bytes in the middle of a message", h.payload);
  }
  return "";
}

std::string check_reply(const RdvReply& r, uint64_t seq, uint64_t bytes) {
  if (r.magic != kRdvReplyMagic) return fmt::format("a rendezvous reply with magic {:#010x}", r.magic);
  if (r.seq != seq) {
    return fmt::format("a rendezvous reply to the announcement in slot {} where slot {} was due",
                       r.seq, seq);
  }
  if (r.bytes != bytes) {
    return fmt::format("a rendezvous reply for {} bytes to an announcement of {}", r.bytes, bytes);
  }
  if (r.reserved != 0 || r.reserved2 != 0) return "a rendezvous reply with reserved fields set";
  if (r.mode == kRdvRing) {
    if (r.addr != 0 || r.rkey != 0) return "a rendezvous reply 'through the ring' with an address";
    return "";
  }
  if (r.mode != kRdvZeroCopy) return fmt::format("a rendezvous reply of mode {}", r.mode);
  if (r.addr == 0 || r.addr > UINT64_MAX - r.bytes) {
    return fmt::format("a rendezvous reply to write {} bytes at {:#x}", r.bytes, r.addr);
  }
  return "";
}

ZeroCopySplit zero_copy_split(uint64_t bytes, uint32_t qps) {
  ZeroCopySplit z;
  if (bytes == 0 || qps == 0) return z;
  const uint64_t share = (bytes + qps - 1) / qps;
  z.part = (share + 4095) / 4096 * 4096;
  z.parts = static_cast<uint32_t>((bytes + z.part - 1) / z.part);
  return z;
}

bool HcaFilter::matches(std::string_view device, int port) const {
  bool any_include = false, included = false;
  for (const Item& it : items) {
    const bool name_ok = it.exact ? device == it.name : device.substr(0, it.name.size()) == it.name;
    const bool hit = name_ok && (it.port < 0 || it.port == port);
    if (it.exclude) {
      if (hit) return false;
    } else {
      any_include = true;
      included |= hit;
    }
  }
  return !any_include || included;
}

Result<HcaFilter> parse_hca_filter(std::string_view spec) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  HcaFilter f;
  spec = trim(spec);
  if (spec.empty()) return f;
  bool all_exclude = false, all_exact = false;
  // NCCL's list prefixes: "^" then "=" ("^=mlx5_1"); either order is taken.
  for (int i = 0; i < 2 && !spec.empty(); ++i) {
    if (spec.front() == '^' && !all_exclude) {
      all_exclude = true;
      spec.remove_prefix(1);
    } else if (spec.front() == '=' && !all_exact) {
      all_exact = true;
      spec.remove_prefix(1);
    }
  }
  while (true) {
    size_t comma = spec.find(',');
    std::string_view item = trim(spec.substr(0, comma));
    HcaFilter::Item it;
    it.exclude = all_exclude;
    it.exact = all_exact;
    for (int i = 0; i < 2 && !item.empty(); ++i) {
      if (item.front() == '^') {
        it.exclude = true;
        item.remove_prefix(1);
      } else if (item.front() == '=') {
        it.exact = true;
        item.remove_prefix(1);
      }
    }
    size_t colon = item.find(':');
    std::string_view name = item.substr(0, colon);
    if (name.empty() || name.find_first_of("^=: \t") != std::string_view::npos) {
      return invalid_argument("NCCL_IB_HCA/CHORUS_IB_HCA: bad item '{}' (expected "
                              "[^][=]name[:port], comma-separated)",
                              item);
    }
    it.name = std::string(name);
    if (colon != std::string_view::npos) {
      std::string_view port = item.substr(colon + 1);
      int value = 0;
      if (port.empty() || port.size() > 3) value = -1;
      for (char ch : port) {
        if (ch < '0' || ch > '9') value = -1;
        if (value >= 0) value = value * 10 + (ch - '0');
      }
      if (value < 1 || value > 255) {
        return invalid_argument("NCCL_IB_HCA/CHORUS_IB_HCA: bad port in '{}' (1..255)", item);
      }
      it.port = value;
    }
    f.items.push_back(std::move(it));
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return f;
}

}  // namespace chorus::verbs
