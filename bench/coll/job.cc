// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/job.cc
// The shared state of a process's rank threads: communicator ownership, first failure, and
// the watchdog thread that turns a step longer than -T seconds into a failure.
#include "bench/coll/job.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace chorus::bench {

namespace {

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

}  // namespace

Job::Job(const Options& options, const World& world, const Collective& coll)
    : options_(options),
      world_(world),
      coll_(coll),
      comms_(options.nthreads, nullptr),
      steps_(options.nthreads) {
  if (options_.timeout_s > 0) watchdog_ = std::thread([this] { watch(); });
}

Job::~Job() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void Job::adopt(int local, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  comms_[local] = comm;
  // A failure may have come first: this communicator must not outlive it.
  if (failed_.load(std::memory_order_relaxed)) abort_all_locked();
}

ncclResult_t Job::destroy(int local) {
  std::lock_guard<std::mutex> lock(mutex_);
  ncclComm_t comm = comms_[local];
  comms_[local] = nullptr;
  return comm != nullptr ? ncclCommDestroy(comm) : ncclSuccess;
}

void Job::abort_all_locked() {
  for (ncclComm_t& comm : comms_) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }
}

void Job::fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_.load(std::memory_order_relaxed)) {
    first_error_ = message;
    fmt::print(stderr, "# {}:{}: {}\n", host_name(), getpid(), message);
    std::fflush(stderr);
    failed_.store(true, std::memory_order_release);
  }
  abort_all_locked();
}

std::string Job::first_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_error_;
}

void Job::begin_step(int local, std::string what) {
  if (options_.timeout_s <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Step& s = steps_[local];
  s.active = true;
  s.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options_.timeout_s);
  s.what = std::move(what);
}

void Job::end_step(int local) {
  if (options_.timeout_s <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  steps_[local].active = false;
}

void Job::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_ || failed_.load(std::memory_order_relaxed)) continue;
    auto now = std::chrono::steady_clock::now();
    for (size_t local = 0; local < steps_.size(); ++local) {
      const Step& s = steps_[local];
      if (!s.active || now < s.deadline) continue;
      first_error_ = fmt::format("rank {}: test timeout ({} s): {} did not finish",
                                 global_rank(static_cast<int>(local)), options_.timeout_s, s.what);
      fmt::print(stderr, "# {}:{}: {}\n", host_name(), getpid(), first_error_);
      std::fflush(stderr);
      failed_.store(true, std::memory_order_release);
      abort_all_locked();
      break;
    }
  }
}

}  // namespace chorus::bench
