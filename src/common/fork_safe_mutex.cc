// SPDX-License-Identifier: Apache-2.0
// File: src/common/fork_safe_mutex.cc
#include "common/fork_safe_mutex.h"

#include <pthread.h>

#include <atomic>

namespace chorus {

struct ForkHandlers {
  // Registered mutexes, newest first. Registration happens during static initialisation or
  // later; the list only grows, and the handlers walk it under fork(), so it is published with
  // release/acquire.
  static std::atomic<ForkSafeMutex*>& head() {
    static std::atomic<ForkSafeMutex*> list{nullptr};
    return list;
  }

  // Lock in list order (newest first) and unlock in the same order: each mutex is held by the
  // forking thread alone, so the unlock order does not matter, and code never holds two of them
  // at once, so the lock order cannot deadlock.
  // fork() runs prepare and then release on one thread; release unlocks exactly what prepare
  // locked, even if another thread registered a mutex in between.
  static inline ForkSafeMutex* locked = nullptr;

  static void prepare() {
    locked = head().load(std::memory_order_acquire);
    for (ForkSafeMutex* m = locked; m != nullptr; m = m->next_) m->mutex_.lock();
  }
  static void release() {
    for (ForkSafeMutex* m = locked; m != nullptr; m = m->next_) m->mutex_.unlock();
    locked = nullptr;
  }

  static void add(ForkSafeMutex* m) {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(prepare, release, release); });
    ForkSafeMutex* old = head().load(std::memory_order_relaxed);
    do {
      m->next_ = old;
    } while (!head().compare_exchange_weak(old, m, std::memory_order_release,
                                           std::memory_order_relaxed));
  }
};

ForkSafeMutex::ForkSafeMutex() { ForkHandlers::add(this); }

}  // namespace chorus
