// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/process_group.h
// The torch.distributed backend "chorus" (torch 1.13, CPU tensors): a c10d::ProcessGroup whose
// operations are Chorus's NCCL API calls.
//
// Every operation is queued and returns at once with a Work; one thread per group runs the
// queue in issue order (the order every rank issues them in, as NCCL requires), each call with
// the NULL stream, so it has completed when the call returns. The Work's future then completes
// with the output tensors, or with the call's error (the NCCL result and ncclGetLastError's
// text, which names the operation and the peer). DistributedDataParallel chains its buckets on
// those futures. batch_isend_irecv (startCoalescing .. endCoalescing) runs its sends and
// receives as one ncclGroupStart/End, so rings of them cannot deadlock; isend/irecv outside a
// batch run one by one, as with NCCL.
//
// The unique id travels through the group's Store (rank 0 sets it, the others get it, within the
// store's timeout), so every group, new_group's included, has a communicator of its own.
#pragma once

#include <nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace chorus::torch_backend {

// The Work of one queued operation; completes with its outputs or the call's error.
class ChorusWork : public c10d::Work {
 public:
  ChorusWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Blocks until done (or `timeout`, then throws); rethrows the operation's error.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Called once, by the group's thread.
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupChorus : public c10d::ProcessGroup {
 public:
  // Joins the group's communicator: rank 0 makes the unique id and publishes it in `store`.
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // FP8 AllReduce of one gradient bucket (chorusAllReduceCompressed), for the DDP hook
  // chorus_torch.hooks.fp8_hook. Each `key` (a bucket's index) has a compressor of its own,
  // so its error-feedback residual follows that bucket from step to step; when the bucket's
  // size or type changes (DDP rebuilds its buckets after the first step) the residual starts
  // again from zero. `average`: ncclAvg, else ncclSum.
  struct CompressOptions {
    bool e5m2 = false;
    int block_size = 128;
    bool error_feedback = true;
    bool average = true;
  };
  c10::intrusive_ptr<c10d::Work> allreduce_compressed(at::Tensor& tensor, int64_t key,
                                                      const CompressOptions& options);

  // The overlap scheduler for the DDP hook chorus_torch.hooks.overlap_hook
  // (<chorus/overlap.h>). overlap_setup, queued like an operation, (re)makes the scheduler
  // over a communicator split from the group's, with `buckets` registered in DDP's order (the
  // last bucket holds the first layers: it gets layer 0, the highest priority).
  // overlap_ready hands it one bucket and returns a Work that completes when the bucket's
  // reduction has, on a thread that waits for the buckets in the order they were readied.
  struct OverlapOptions {
    bool fifo = false;
    bool fp8 = false;
    int64_t bucket_bytes = 0, partition_bytes = -1;  // 0 / -1: the scheduler's defaults
  };
  c10::intrusive_ptr<c10d::Work> overlap_setup(std::vector<at::Tensor> buckets,
                                               const OverlapOptions& options);
  c10::intrusive_ptr<c10d::Work> overlap_ready(at::Tensor& bucket);

  // A communicator of its own for a caller that makes blocking collective calls on its own
  // thread (chorus_torch.ep.Buffer): split from the group's, so those calls never interleave
  // with the operations the group's lanes run on theirs. The split is collective over the
  // group: it is queued on lane kMain in issue order, like an operation, and waited for here
  // (the GIL released). The caller owns the communicator (ncclCommDestroy, or ncclCommAbort
  // after a failure) and keeps the group alive while it lives.
  ncclComm_t split_comm(const char* purpose);

  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) override;

 private:
  // What the group's thread runs for one Work: NCCL calls (their result checked), then the
  // copies back into the caller's tensors.
  struct Job {
    c10::intrusive_ptr<ChorusWork> work;
    std::function<void()> run;  // throws std::runtime_error with Chorus's message
  };

  // A communicator and the thread that runs its jobs in issue order. Lane kMain runs the
  // collectives and batches; sends and receives outside a batch run on kUp (data flowing to
  // higher ranks: sends to them, receives from lower ones) or kDown, communicators split from
  // the group's. So a rank may post irecv before isend to the same peer, as Gloo allows: the
  // two run on different lanes, and on each lane data flows one way only.
  struct Lane {
    ncclComm_t comm = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> queue;
    bool stop = false;
    bool failed = false;  // a job failed: destroy aborts the communicator instead
    std::thread thread;
  };
  enum LaneId { kMain = 0, kUp = 1, kDown = 2, kLanes = 3 };

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title,
                                         std::vector<at::Tensor> outputs, std::function<void()> run,
                                         LaneId lane = kMain);
  void loop(Lane& lane);
  // Throws, naming `what` and `comm`'s last error, when `r` is not ncclSuccess.
  void check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) const;

  ncclComm_t comm_ = nullptr;  // the group's: lanes_[kMain]->comm
  std::unique_ptr<Lane> lanes_[kLanes];
  std::mutex mu_;  // guards coalescing_ and batch_
  // Between startCoalescing and endCoalescing: the jobs of a batch, run as one group.
  bool coalescing_ = false;
  std::vector<Job> batch_;
  // allreduce_compressed's compressors, by key; used on the group's thread only.
  struct Compressor;
  std::map<int64_t, std::unique_ptr<Compressor>> compressors_;
  // overlap_setup's scheduler and its communicator; the waiter thread and its queue.
  struct Overlap;
  std::unique_ptr<Overlap> overlap_;
};

}  // namespace chorus::torch_backend
