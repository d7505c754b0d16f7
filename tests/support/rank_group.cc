// SPDX-License-Identifier: Apache-2.0
#include "support/rank_group.h"

#include <fmt/format.h>

namespace chorus::test {

RankGroup::RankGroup(int nranks) : comms_(nranks, nullptr), results_(nranks) {
  ncclResult_t r = ncclCommInitAll(comms_.data(), nranks, nullptr);
  if (r != ncclSuccess) {
    init_error_ = fmt::format("ncclCommInitAll({}) failed: {}", nranks, ncclGetLastError(nullptr));
    comms_.assign(nranks, nullptr);
  }
  for (int rank = 0; rank < nranks; ++rank) threads_.emplace_back([this, rank] { worker(rank); });
}

RankGroup::~RankGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (ncclComm_t c : comms_)
    if (c != nullptr) ncclCommDestroy(c);
}

void RankGroup::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<std::string(int, ncclComm_t)>* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::string result = (*job)(rank, comms_[rank]);
    std::lock_guard<std::mutex> lock(mutex_);
    results_[rank] = std::move(result);
    if (--pending_ == 0) cv_.notify_all();
  }
}

std::string RankGroup::run(const std::function<std::string(int, ncclComm_t)>& fn) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &fn;
    pending_ = size();
    ++generation_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return pending_ == 0; });
  }
  std::string failures;
  for (int r = 0; r < size(); ++r)
    if (!results_[r].empty()) failures += fmt::format("rank {}: {}; ", r, results_[r]);
  return failures;
}

}  // namespace chorus::test
