// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/unique_id.cc
// The 128-byte ncclUniqueId codec.
#include "bootstrap/unique_id.h"

#include <cstring>

#include "bootstrap/wire.h"

namespace chorus::bootstrap {

namespace {
constexpr size_t kAddrOffset = 8;
constexpr size_t kSecretOffset = kAddrOffset + wire::kAddrBytes;
constexpr size_t kUidOffset = kSecretOffset + 32;
constexpr size_t kUsedBytes = kUidOffset + 8;
static_assert(kUsedBytes <= kUniqueIdBytes);
}  // namespace

void encode_unique_id(const UniqueId& id, char out[kUniqueIdBytes]) {
  wire::Writer w;
  w.u32(kUniqueIdMagic);
  w.u16(kUniqueIdVersion);
  w.u16(0);
  wire::put_addr(w, id.root);
  w.bytes(id.secret.bytes.data(), id.secret.bytes.size());
  w.u64(id.comm_uid);
  std::string bytes = w.take();
  std::memset(out, 0, kUniqueIdBytes);
  std::memcpy(out, bytes.data(), bytes.size());
}

Result<UniqueId> decode_unique_id(const char in[kUniqueIdBytes]) {
  wire::Reader r(std::string_view(in, kUniqueIdBytes));
  uint32_t magic = r.u32();
  if (magic != kUniqueIdMagic) {
    return invalid_argument("ncclUniqueId was not produced by ncclGetUniqueId (bad magic 0x{:08x})",
                            magic);
  }
  uint16_t version = r.u16();
  if (version != kUniqueIdVersion) {
    return invalid_argument(
        "ncclUniqueId has format version {}; this Chorus reads version {} "
        "(all ranks must run the same Chorus version)",
        version, kUniqueIdVersion);
  }
  uint16_t reserved = r.u16();
  UniqueId id;
  id.root = wire::get_addr(r);
  r.bytes(id.secret.bytes.data(), id.secret.bytes.size());
  id.comm_uid = r.u64();
  if (id.root.empty() || id.root.port() == 0) {
    return invalid_argument("ncclUniqueId is corrupt: no valid root address");
  }
  if (id.comm_uid == 0) return invalid_argument("ncclUniqueId is corrupt: zero communicator uid");
  bool padding_zero = reserved == 0;
  for (size_t i = kUsedBytes; i < kUniqueIdBytes; ++i) padding_zero &= in[i] == 0;
  if (!padding_zero) return invalid_argument("ncclUniqueId is corrupt: non-zero reserved bytes");
  return id;
}

}  // namespace chorus::bootstrap
