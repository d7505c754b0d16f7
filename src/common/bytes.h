// SPDX-License-Identifier: Apache-2.0
// File: src/common/bytes.h
// Little-endian serialisation of the small records ranks exchange (peer info, split keys).
// The reader checks every length against what is left, so a corrupt or hostile record yields
// an error, never an overread or a huge allocation.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/status.h"

namespace chorus {

// FNV-1a, 64-bit: a cheap digest of short texts (host identities, a topology file), for
// equality checks between ranks, not for security.
inline uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Fixed-width little-endian codecs for wire headers.
namespace le {
inline void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace le

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void put_bytes(const void* data, size_t bytes) {
    put<uint32_t>(static_cast<uint32_t>(bytes));
    out_.append(static_cast<const char*>(data), bytes);
  }
  void put_string(std::string_view s) { put_bytes(s.data(), s.size()); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  template <typename T>
  Status get(T* value) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (in_.size() < sizeof(T)) return truncated();
    std::memcpy(value, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return Status();
  }
  // A length-prefixed byte string of at most max_bytes.
  Status get_string(std::string* s, size_t max_bytes) {
    uint32_t n = 0;
    CHORUS_RETURN_IF_ERROR(get(&n));
    if (n > max_bytes || n > in_.size()) return truncated();
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return Status();
  }
  size_t remaining() const { return in_.size(); }

 private:
  static Status truncated() { return remote_error("malformed record from a peer (bad length)"); }
  std::string_view in_;
};

}  // namespace chorus
