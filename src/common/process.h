// SPDX-License-Identifier: Apache-2.0
// File: src/common/process.h
// Per-process identity and the doorbell that wakes this process's sleeping threads.
//
// A thread with nothing to do sleeps on its process's doorbell (a futex word in a small
// memfd-backed segment). Whoever makes work possible for it rings the doorbell: another thread
// of the process (op queued, request completed, abort) or a peer process on the same host that
// wrote into one of our shared-memory FIFOs (peers map the segment). Threads that must also
// watch sockets sleep in poll() on the process's eventfd instead; ring_local() covers both.
//
// After fork() the child gets a fresh context (new pid, token and doorbell), so a child is never
// mistaken for its parent.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace chorus {

// Lives in shared memory; layout is part of the same-host wire protocol.
struct DoorbellWord {
  std::atomic<uint32_t> seq;       // bumped on every ring
  std::atomic<uint32_t> sleepers;  // threads in futex_wait on seq
  std::atomic<uint32_t> pollers;   // threads in poll() on the process eventfd
  uint32_t pad;
};

// Wakes the threads sleeping on `word` (ours or a peer process's).
void ring_doorbell(DoorbellWord* word);

// While alive, the calling thread counts itself among its own process's sleepers (`poller`
// false) or pollers (true): Idler::idle holds one from registering until it has slept or found
// work. ring_local() from this thread meanwhile wakes only the others: the thread is awake, and
// waking itself would cost a futex wake or an eventfd write, then a spurious return from its
// sleep and a read to drain the eventfd.
class CountedAsSleeper {
 public:
  explicit CountedAsSleeper(bool poller);
  ~CountedAsSleeper();
  CountedAsSleeper(const CountedAsSleeper&) = delete;
  CountedAsSleeper& operator=(const CountedAsSleeper&) = delete;

 private:
  const bool poller_;
  const uint32_t outer_;  // what an enclosing one registered (nested drives)
};

class ProcessContext {
 public:
  // The context of the calling process (created on first use, and again after fork()).
  static ProcessContext& get();

  int pid() const { return pid_; }
  uint64_t token() const { return token_; }          // random, distinguishes processes
  uint64_t host_hash() const { return host_hash_; }  // equal for processes of one host
  const std::string& hostname() const { return hostname_; }
  DoorbellWord* doorbell() const { return doorbell_; }
  int doorbell_fd() const { return doorbell_fd_.get(); }
  int wake_fd() const { return wake_fd_.get(); }
  // Rings our own doorbell and, if threads sleep in poll(), the eventfd too.
  void ring_local();
  // CPUs this process may run on (its affinity mask).
  int cpus() const { return cpus_; }
  // Set when a communicator puts more ranks on this host than it has CPUs: waiting threads
  // then yield the CPU on every poll instead of spinning (the peer they wait for needs it).
  bool oversubscribed() const { return oversubscribed_.load(std::memory_order_relaxed); }
  void note_local_ranks(int ranks_on_host) {
    if (ranks_on_host > cpus_) oversubscribed_.store(true, std::memory_order_relaxed);
  }
  // Drains the eventfd after a poll() woke on it.
  void drain_wake_fd();

 private:
  ProcessContext();
  int pid_;
  uint64_t token_;
  uint64_t host_hash_;
  std::string hostname_;
  UniqueFd doorbell_fd_;
  Mapping doorbell_map_;
  DoorbellWord* doorbell_ = nullptr;
  UniqueFd wake_fd_;
  int cpus_ = 1;
  std::atomic<bool> oversubscribed_{false};
};

// Blocks on a futex word until it differs from `expected`, a wake, or timeout (ms).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void futex_wake_all(std::atomic<uint32_t>* word);

// Random bytes from the kernel (getrandom); aborts never, returns false on failure.
bool random_bytes(void* out, size_t bytes);
uint64_t random_u64();

}  // namespace chorus
