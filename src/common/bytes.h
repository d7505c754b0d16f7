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
