// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/unique_id.h
// What an ncclUniqueId carries: the bootstrap root's address, the communicator's secret and a
// communicator uid, in a fixed 128-byte binary layout that is stable across builds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "net/auth.h"
#include "net/socket.h"
#include "common/status.h"

namespace chorus::bootstrap {

using net::Secret;

struct UniqueId {
  net::SockAddr root;     // where the root server listens
  Secret secret;          // proves membership; never sent on the wire
  uint64_t comm_uid = 0;  // non-zero; names the communicator in logs and handshakes
};

inline constexpr size_t kUniqueIdBytes = 128;
inline constexpr uint32_t kUniqueIdMagic = 0x43484f52;  // "CHOR"
inline constexpr uint16_t kUniqueIdVersion = 1;

// Layout (little-endian):
//   0  u32 magic   4  u16 version   6  u16 reserved (0)
//   8  address: u16 family (4|6), u16 port, 16 bytes IP, u32 IPv6 scope id   (24 bytes)
//   32 secret (32 bytes)            64 u64 comm_uid        72..127 zero
void encode_unique_id(const UniqueId& id, char out[kUniqueIdBytes]);
// kInvalidArgument when the bytes are not an id made by encode_unique_id ("ncclUniqueId was not
// produced by ncclGetUniqueId (bad magic)", unsupported version, bad address, non-zero padding).
Result<UniqueId> decode_unique_id(const char in[kUniqueIdBytes]);

}  // namespace chorus::bootstrap
