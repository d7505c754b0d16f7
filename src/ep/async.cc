// SPDX-License-Identifier: Apache-2.0
// File: src/ep/async.cc
#include "ep/async.h"

#include <pthread.h>

#include <utility>

namespace chorus::ep {

Worker::Worker() : thread_([this] { run(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

std::shared_ptr<Op> Worker::queue(Stream& stream, std::string what,
                                  std::function<Status()> work) {
  std::shared_ptr<Op> op = ExternalOp::queue(stream, std::move(what));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back({op, std::move(work)});
  }
  cv_.notify_one();
  return op;
}

void Worker::run() {
  pthread_setname_np(pthread_self(), "chorus-ep");
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and everything queued has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    // Ops earlier on the stream bound their own waits, so start() returns.
    Status status = ExternalOp::start(job.op);
    if (status.ok()) status = job.work();
    job.work = nullptr;  // nothing of the call outlives its op
    ExternalOp::finish(job.op, std::move(status));
  }
}

}  // namespace chorus::ep
