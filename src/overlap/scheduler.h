// SPDX-License-Identifier: Apache-2.0
// File: src/overlap/scheduler.h
// The overlap scheduler (include/chorus/overlap.h): gradients reduced as they become ready,
// in buckets every rank builds alike from what the ranks agree is ready everywhere.
//
// Three kinds of thread meet here:
//  - the caller's threads: register(), ready(), wait(), wait_all();
//  - the scheduler's own thread: every cycle, one round of agreement (an AllGather, on a
//    communicator split off at creation, of each rank's flags: which pieces are ready here,
//    which launched buckets finished here), then the buckets every rank derives from the
//    agreed flags, launched on a host stream of the caller's communicator;
//  - Chorus's progress thread: a host function queued after each bucket copies a staged
//    bucket back and marks its pieces reduced.
// Every decision that shapes what goes on the wire (bucket contents, order, the credit in
// flight, the end of a step) is a function of agreed flags only, so every rank makes the same
// calls in the same order, whatever order its gradients came in.
//
// Counters per tensor: ready_count (ready() calls), done_count (steps whose reduction finished
// here); ready_count <= done_count + 1 (a second ready() before the reduction is an error). A
// step ends when every piece of every tensor is agreed finished; step_ counts ended steps, so
// a tensor is ready in the running step when ready_count > step_.
#pragma once

#include <chorus/overlap.h>
#include <nccl.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace chorus::overlap {

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> create(ncclComm_t comm, const chorusOverlapConfig_t& config);
  // Stops agreeing, waits for the buckets in flight (bounded), releases the communicator it
  // split off.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  Status add(void* buf, size_t count, int datatype, int layer);
  Status ready(void* buf, size_t count, int datatype);
  Status wait(void* buf);
  Status wait_all();
  chorusOverlapStats_t stats() const;
  Status dump_trace(const std::string& path) const;

 private:
  struct Tensor;
  struct Piece;
  struct Bucket;
  struct StepRecord;

  Scheduler(ncclComm_t comm, const chorusOverlapConfig_t& config);
  void run();
  // One round: agree, then plan and launch. Called with lock held; unlocks around the
  // AllGather and the launches. False when the step ended (or the scheduler failed).
  bool round(std::unique_lock<std::mutex>& lock);
  Status agree(const std::vector<uint8_t>& mine, std::vector<uint8_t>* all);
  // The buckets every rank builds from the candidates (agreed ready, not launched), in order.
  std::vector<std::vector<int>> plan(std::vector<int> candidates) const;
  Status launch(Bucket* b);
  static void bucket_done(void* arg);
  void end_step();
  // Until every tensor in `which` has done_count >= target (and with `step_end`, step `target`
  // ended: agreed finished on every rank), the scheduler failed, or the deadline: then an error
  // naming what is missing.
  Status wait_for(const std::vector<int>& which, uint64_t target, bool step_end);
  int find(const void* buf) const;
  void fail(Status status);

  const ncclComm_t comm_;
  ncclComm_t agree_comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  const chorusOverlapConfig_t config_;
  bool compress_ = false;
  chorusCompressConfig_t compress_config_{};  // with compress_: a copy of config.compress
  int rank_ = 0, nranks_ = 1;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Tensor> tensors_;
  std::vector<Piece> pieces_;
  bool frozen_ = false;  // the first ready() came: no more registrations
  bool stop_ = false;
  Status error_;
  uint64_t step_ = 0;    // steps ended
  uint64_t max_ready_ = 0;  // the largest ready_count: the step the caller is in
  // The running step: its buckets (launched, in launch order), its rounds, the last agreed
  // flags of every rank (for errors that name who is missing).
  std::vector<std::unique_ptr<Bucket>> buckets_;
  uint64_t rounds_ = 0;
  std::vector<uint8_t> last_agreed_;
  int64_t exposed_ns_ = 0;  // caller's time in waits for the running step
  std::unique_ptr<StepRecord> last_step_;
  std::thread thread_;
};

}  // namespace chorus::overlap
