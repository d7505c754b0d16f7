// SPDX-License-Identifier: Apache-2.0
// File: src/common/clock.h
// Monotonic time in the units the code needs, without <chrono> noise at call sites.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace chorus {

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
// The kernel's last tick (a few ms of resolution, a quarter of the cost): for timeouts counted
// in milliseconds, read on every pass of a polling loop.
inline int64_t now_coarse_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
inline int64_t now_us() { return now_ns() / 1000; }
inline int64_t now_ms() { return now_ns() / 1000000; }

// A point in time after which a wait gives up; optionally also as soon as `*cancel` is set
// (ncclCommAbort of a communicator still initialising). Waits poll in slices of at most
// kCancelSliceMs when cancellable, so a cancel is noticed within that.
class Deadline {
 public:
  static constexpr int kCancelSliceMs = 50;
  static Deadline after_ms(int64_t ms, const std::atomic<bool>* cancel = nullptr) {
    return Deadline(now_ns() + ms * 1000000, cancel);
  }
  static Deadline never() { return Deadline(INT64_MAX, nullptr); }
  bool cancelled() const { return cancel_ != nullptr && cancel_->load(std::memory_order_acquire); }
  bool expired() const { return cancelled() || now_ns() >= at_ns_; }
  // Milliseconds left, clamped to [0, cap_ms]; for poll() timeouts.
  int remaining_ms(int cap_ms) const {
    if (cancel_ != nullptr) {
      if (cancelled()) return 0;
      if (cap_ms > kCancelSliceMs) cap_ms = kCancelSliceMs;
    }
    if (at_ns_ == INT64_MAX) return cap_ms;
    int64_t left = (at_ns_ - now_ns() + 999999) / 1000000;
    if (left < 0) return 0;
    return left > cap_ms ? cap_ms : static_cast<int>(left);
  }
  // When to wake up next at the latest (the deadline, or the next cancel check).
  int64_t wake_ns() const {
    if (cancel_ == nullptr) return at_ns_;
    int64_t slice = now_ns() + kCancelSliceMs * 1000000ll;
    return slice < at_ns_ ? slice : at_ns_;
  }
  int64_t at_ns() const { return at_ns_; }
  // This deadline, or `at_ns` if that comes first (same cancel flag): a slice of a long wait
  // that has something to do at `at_ns`, such as saying that it is still waiting.
  Deadline earlier(int64_t at_ns) const { return Deadline(at_ns < at_ns_ ? at_ns : at_ns_, cancel_); }

 private:
  Deadline(int64_t at_ns, const std::atomic<bool>* cancel) : at_ns_(at_ns), cancel_(cancel) {}
  int64_t at_ns_;
  const std::atomic<bool>* cancel_;
};

}  // namespace chorus
