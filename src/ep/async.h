// SPDX-License-Identifier: Apache-2.0
// File: src/ep/async.h
// The thread that does an EP buffer's stream-ordered work (chorusEpDispatchAsync,
// chorusEpCombineAsync): writing tokens into peers' buffers, forwarding, waiting for arrival,
// unpacking and reducing. Each piece is an external op on the caller's host stream
// (core/stream.h), so it runs after the work queued on that stream before it, and the work
// queued after it (the call's messages, an event the caller records) waits for it. Pieces run
// one at a time, in the order queued. None of them calls the communicator: the messages of a
// call are posted on the stream by the calling thread, so the communicator's issue order is
// the order of the calls.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "core/op.h"
#include "core/stream.h"

namespace chorus::ep {

class Worker {
 public:
  Worker();
  // Runs what is queued, then stops.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Queues `work` on `stream` as an op described by `what`: it runs once the stream's work
  // before it is done (not at all if that failed: the op then fails with that error), and its
  // Status completes the op (a failure is the stream's).
  std::shared_ptr<Op> queue(Stream& stream, std::string what, std::function<Status()> work);

 private:
  struct Job {
    std::shared_ptr<Op> op;
    std::function<Status()> work;
  };
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace chorus::ep
