// SPDX-License-Identifier: Apache-2.0
// File: src/common/fork_safe_mutex.h
// A mutex that fork() waits for.
//
// A process that has created a ncclUniqueId runs the bootstrap root on a thread; the common
// launch pattern (create the id, then fork the ranks) forks while that thread may be inside a
// lock. The child inherits the lock held by a thread that does not exist there, and its first
// use of the lock hangs forever. Locks a child needs (the log's, and the one around our OpenSSL
// calls, whose own internal locks have no fork handlers) are ForkSafeMutex: pthread_atfork
// handlers take every one of them before fork() and release them in the parent and the child,
// so fork() happens between critical sections, never inside one.
//
// Only for namespace-scope (static) mutexes: they register once and live as long as the process.
// A thread must never hold one while forking.
#pragma once

#include <mutex>

namespace chorus {

class ForkSafeMutex {
 public:
  ForkSafeMutex();
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;

  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }
  bool try_lock() { return mutex_.try_lock(); }

 private:
  friend struct ForkHandlers;
  std::mutex mutex_;
  ForkSafeMutex* next_ = nullptr;  // registration list, newest first
};

}  // namespace chorus
