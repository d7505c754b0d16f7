// SPDX-License-Identifier: Apache-2.0
// File: src/common/clock.h
// Monotonic time in the units the code needs, without <chrono> noise at call sites.
#pragma once

#include <time.h>

#include <cstdint>

namespace chorus {

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
inline int64_t now_us() { return now_ns() / 1000; }
inline int64_t now_ms() { return now_ns() / 1000000; }

// A point in time after which a wait gives up.
class Deadline {
 public:
  static Deadline after_ms(int64_t ms) { return Deadline(now_ns() + ms * 1000000); }
  static Deadline never() { return Deadline(INT64_MAX); }
  bool expired() const { return now_ns() >= at_ns_; }
  // Milliseconds left, clamped to [0, cap_ms]; for poll() timeouts.
  int remaining_ms(int cap_ms) const {
    if (at_ns_ == INT64_MAX) return cap_ms;
    int64_t left = (at_ns_ - now_ns() + 999999) / 1000000;
    if (left < 0) return 0;
    return left > cap_ms ? cap_ms : static_cast<int>(left);
  }
  int64_t at_ns() const { return at_ns_; }

 private:
  explicit Deadline(int64_t at_ns) : at_ns_(at_ns) {}
  int64_t at_ns_;
};

}  // namespace chorus
