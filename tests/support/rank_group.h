// SPDX-License-Identifier: Apache-2.0
// File: tests/support/rank_group.h
// N ranks as threads of the test process, each with its own communicator (ncclCommInitAll).
// run() calls fn(rank, comm) on each rank's worker thread (the same thread every time, so
// per-thread buffers are reused) and returns the failures to the main thread, where Catch2
// assertions are made (they are not thread-safe).
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace chorus::test {

class RankGroup {
 public:
  explicit RankGroup(int nranks);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  ncclComm_t comm(int rank) const { return comms_[rank]; }
  const std::string& init_error() const { return init_error_; }

  // Runs fn on every rank concurrently; returns "" if all returned "", else "rank r: text; ...".
  std::string run(const std::function<std::string(int rank, ncclComm_t comm)>& fn);

 private:
  void worker(int rank);

  std::vector<ncclComm_t> comms_;
  std::string init_error_;
  std::mutex mutex_;
  std::condition_variable cv_;
  const std::function<std::string(int, ncclComm_t)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::string> results_;
  std::vector<std::thread> threads_;
};

}  // namespace chorus::test
