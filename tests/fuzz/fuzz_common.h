// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/fuzz_common.h
// Helpers shared by the libFuzzer targets: a front-to-back reader of the fuzz input (so that a
// seed is simply the fields in order, then the bytes a peer would send), quiet logging, and a
// check that aborts (libFuzzer reports it as a crash) when an invariant does not hold.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace chorus::fuzz {

// Reads fixed-size little-endian fields from the front of the input; past the end it returns
// zeros, so every input is usable.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1)); }
  uint16_t u16() { return static_cast<uint16_t>(take(2)); }
  uint32_t u32() { return static_cast<uint32_t>(take(4)); }
  uint64_t u64() { return take(8); }
  // Up to `n` bytes (fewer at the end of the input).
  std::string_view bytes(size_t n) {
    n = n < n_ ? n : n_;
    std::string_view out(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    n_ -= n;
    return out;
  }
  std::string_view rest() { return bytes(n_); }
  size_t remaining() const { return n_; }

 private:
  uint64_t take(size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k && n_ > 0; ++i, ++p_, --n_) v |= uint64_t{*p_} << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t n_;
};

// Appends little-endian fields (the seed generator's side of Input).
inline void put_le(std::string* out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// Warnings are formatted (that code runs on hostile values too) but go nowhere.
inline void quiet_logging() {
  setenv("CHORUS_DEBUG", "WARN", 1);
  setenv("CHORUS_DEBUG_FILE", "/dev/null", 1);
}

[[noreturn]] inline void invariant_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", file, line, what);
  std::abort();
}

// Writes as much of `bytes` as the (non-blocking) socket takes; returns how much it took.
inline size_t write_some(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// Reads and drops whatever is waiting on a non-blocking socket.
inline void drain(int fd) {
  char buf[4096];
  while (::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace chorus::fuzz

#define FUZZ_CHECK(cond) \
  ((cond) ? (void)0 : ::chorus::fuzz::invariant_failed(#cond, __FILE__, __LINE__))
