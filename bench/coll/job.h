// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/job.h
// What the rank threads of one process share: the options, the world, the collective, their
// communicators (so that the first failure, or the -T watchdog, can abort every one of them
// and no thread waits for a peer that will never come) and that first failure.
//
// Lock order: Job::mutex_ is a leaf lock; ncclCommAbort and ncclCommDestroy run under it so
// that neither can race the other on one communicator. No Chorus call other than those two is
// made while it is held.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/coll/args.h"
#include "bench/coll/collective.h"
#include "bench/coll/world.h"

namespace chorus::bench {

class Job {
 public:
  Job(const Options& options, const World& world, const Collective& coll);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const Options& options() const { return options_; }
  const World& world() const { return world_; }
  const Collective& coll() const { return coll_; }
  int nranks() const { return world_.nprocs * options_.nthreads; }
  // Threads of one process hold consecutive ranks.
  int global_rank(int local) const { return world_.proc * options_.nthreads + local; }

  // Hands local rank `local`'s communicator to the job (after ncclCommInitRank).
  void adopt(int local, ncclComm_t comm);
  // ncclCommDestroy of that communicator, unless a failure already aborted it.
  ncclResult_t destroy(int local);

  // Records a failure. The first is printed to stderr; then every communicator of this
  // process is aborted, so that the other rank threads fail fast. Thread-safe.
  void fail(const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string first_error() const;

  // The -T watchdog: a rank starts a step (one message size) and ends it; a step that lasts
  // longer than the timeout fails the job. No-op when options().timeout_s is 0.
  void begin_step(int local, std::string what);
  void end_step(int local);

 private:
  struct Step {
    bool active = false;
    std::chrono::steady_clock::time_point deadline;
    std::string what;
  };
  void watch();
  void abort_all_locked();

  const Options& options_;
  const World& world_;
  const Collective& coll_;

  mutable std::mutex mutex_;
  std::vector<ncclComm_t> comms_;  // nullptr: not yet created, destroyed or aborted
  std::vector<Step> steps_;
  std::string first_error_;
  std::atomic<bool> failed_{false};  // release: after first_error_ is set (under mutex_)
  bool stop_ = false;
  std::condition_variable wake_;
  std::thread watchdog_;
};

}  // namespace chorus::bench
