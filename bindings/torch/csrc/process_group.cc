// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/process_group.cc
#include "process_group.h"

#include <chorus/chorus.h>
#include <chorus/compress.h>
#include <chorus/overlap.h>

#include <Python.h>
#include <pybind11/pybind11.h>

#include <ATen/ATen.h>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace chorus::torch_backend {

namespace {

constexpr const char* kUniqueIdKey = "chorus_unique_id";

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default:
      TORCH_CHECK(false, "chorus: tensors of type ", t.scalar_type(),
                  " are not supported (float, double, half, bfloat16, int8, uint8, bool, int32, "
                  "int64 are)");
  }
}

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "chorus: ", what, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "chorus: ", what, ": tensors must be on the CPU, not ",
              t.device());
  TORCH_CHECK(!t.is_sparse(), "chorus: ", what, ": sparse tensors are not supported");
  (void)nccl_type(t);
}

void check_one(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "chorus: ", what, " takes one tensor per call (got ",
              tensors.size(), ")");
  check_tensor(tensors[0], what);
}

bool is_bitwise(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
}

// The NCCL operation for `op` on `t`'s type, validated at call time. Bitwise operations have
// none (they run as an AllGather and a local fold), except on bool, where AND is MIN and OR is
// MAX.
void check_op(const c10d::ReduceOp& op, const at::Tensor& t, const char* what) {
  const bool floating = at::isFloatingType(t.scalar_type());
  if (is_bitwise(op)) {
    TORCH_CHECK(!floating, "chorus: ", what, ": bitwise reductions need integer or bool tensors, not ",
                t.scalar_type());
  }
  TORCH_CHECK(op != c10d::ReduceOp::UNUSED, "chorus: ", what, ": unknown reduce op");
}

// The NCCL operation for `op` on `t`'s type, validated by check_op. A PREMUL_SUM's is created
// for the call and destroyed with this object, so it must outlive the call (and its group).
class NcclOp {
 public:
  NcclOp(const c10d::ReduceOp& op, const at::Tensor& t, ncclComm_t comm);
  ~NcclOp() {
    if (premul_comm_ != nullptr) ncclRedOpDestroy(op_, premul_comm_);
  }
  NcclOp(NcclOp&& other) noexcept : op_(other.op_), premul_comm_(other.premul_comm_) {
    other.premul_comm_ = nullptr;
  }
  NcclOp(const NcclOp&) = delete;
  NcclOp& operator=(const NcclOp&) = delete;
  NcclOp& operator=(NcclOp&&) = delete;
  ncclRedOp_t get() const { return op_; }

 private:
  ncclRedOp_t op_ = ncclSum;
  ncclComm_t premul_comm_ = nullptr;  // set when op_ is a PREMUL_SUM to destroy
};

NcclOp::NcclOp(const c10d::ReduceOp& op, const at::Tensor& t, ncclComm_t comm) {
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: op_ = boolean ? ncclMax : ncclSum; return;
    case c10d::ReduceOp::AVG: op_ = ncclAvg; return;
    case c10d::ReduceOp::PRODUCT: op_ = boolean ? ncclMin : ncclProd; return;
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::BAND: op_ = ncclMin; return;  // BAND reaches here on bool only
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::BOR: op_ = ncclMax; return;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "chorus: PREMUL_SUM without its factor");
      // The factor in the tensor's own type, read by the library at the call (host immediate).
      at::Tensor factor = !s->tensor_factors.empty()
                              ? s->tensor_factors[0].to(t.scalar_type()).contiguous()
                              : at::scalar_tensor(s->double_factor, t.options());
      ncclResult_t r = ncclRedOpCreatePreMulSum(&op_, factor.data_ptr(), nccl_type(t),
                                                ncclScalarHostImmediate, comm);
      if (r != ncclSuccess)
        throw std::runtime_error(std::string("chorus: ncclRedOpCreatePreMulSum: ") +
                                 ncclGetLastError(comm));
      premul_comm_ = comm;
      return;
    }
    default: TORCH_CHECK(false, "chorus: reduce op ", int(op.op_), " has no NCCL counterpart");
  }
}

// A contiguous tensor to hand to the library: `t` itself, or a copy that copy_back() returns.
struct Flat {
  at::Tensor user, flat;
  explicit Flat(const at::Tensor& t) : user(t), flat(t.is_contiguous() ? t : t.contiguous()) {}
  void* data() const { return flat.data_ptr(); }
  size_t count() const { return static_cast<size_t>(flat.numel()); }
  void copy_back() {
    if (!flat.is_same(user)) user.copy_(flat);
  }
};

// Bitwise reductions have no NCCL operation: they run as an AllGather and a local fold. On
// bool, AND and OR are MIN and MAX; XOR folds too.
bool needs_fold(const c10d::ReduceOp& op, const at::Tensor& t) {
  return is_bitwise(op.op_) && (t.scalar_type() != at::kBool || op.op_ == c10d::ReduceOp::BXOR);
}

at::Tensor fold_bitwise(const at::Tensor& stacked, c10d::ReduceOp::RedOpType op) {
  at::Tensor acc = stacked[0].clone();
  for (int64_t i = 1; i < stacked.size(0); ++i) {
    if (op == c10d::ReduceOp::BAND) acc.bitwise_and_(stacked[i]);
    else if (op == c10d::ReduceOp::BOR) acc.bitwise_or_(stacked[i]);
    else acc.bitwise_xor_(stacked[i]);
  }
  return acc;
}

// Throws Chorus's error for a failed call.
void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  std::string detail = ncclGetLastError(comm);
  throw std::runtime_error(std::string("chorus: ") + what + " failed: " + ncclGetErrorString(r) +
                           (detail.empty() ? "" : ": " + detail));
}

// Every rank's `input` (contiguous), one row each: what the bitwise reductions, which NCCL
// does not have, fold locally (fold_bitwise).
at::Tensor gather_rows(ncclComm_t comm, int size, const at::Tensor& input, const char* what) {
  at::Tensor all = at::empty({size, input.numel()}, input.options());
  check_nccl(ncclAllGather(input.data_ptr(), all.data_ptr(), input.numel(), nccl_type(input), comm,
                           nullptr),
             what, comm);
  return all;
}

// A bitwise reduce-scatter of `input` into `out`: every rank's whole input (n blocks),
// folded, and this rank's block kept; n times the traffic of a reduce-scatter.
void reduce_scatter_folded(ncclComm_t comm, int rank, int size, const at::Tensor& input,
                           Flat& out, c10d::ReduceOp::RedOpType op) {
  const int64_t count = static_cast<int64_t>(out.count());
  at::Tensor folded = fold_bitwise(gather_rows(comm, size, input.contiguous().reshape({-1}),
                                               "ncclAllGather (bitwise reduce_scatter)"),
                                   op);
  out.flat.copy_(folded.narrow(0, rank * count, count).view_as(out.flat));
  out.copy_back();
}

// Releases the GIL while the calling thread waits for the group's thread, whose work (future
// callbacks: DDP's, Python hooks) may need it.
template <typename F>
void without_gil(F&& f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    f();
  } else {
    f();
  }
}

}  // namespace

// ---- ChorusWork ----------------------------------------------------------------------------

ChorusWork::ChorusWork(int rank, c10d::OpType type, const char* title,
                       std::vector<at::Tensor> outputs)
    : Work(rank, type, title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

bool ChorusWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool ChorusWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr ChorusWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> ChorusWork::result() { return outputs_; }

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    TORCH_CHECK(false, "chorus: wait() timed out after ", timeout.count(), " ms");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> ChorusWork::getFuture() { return future_; }

void ChorusWork::complete(std::exception_ptr error) {
  finish(error);  // wakes wait()
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// ---- ProcessGroupChorus --------------------------------------------------------------------

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size) {
  ncclUniqueId id;
  if (rank == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set(kUniqueIdKey, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    store->setTimeout(timeout);
    std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
    TORCH_CHECK(bytes.size() == sizeof(id.internal), "chorus: the store holds a unique id of ",
                bytes.size(), " bytes, not ", sizeof(id.internal));
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  // The group's timeout bounds every operation's wait for its peers (a silent or dead rank
  // fails it naming that rank); the lanes' communicators, split below, inherit it.
  check(chorusCommSetTimeout(comm_, std::max<int64_t>(1, timeout.count())), "chorusCommSetTimeout");
  for (auto& lane : lanes_) lane = std::make_unique<Lane>();
  lanes_[kMain]->comm = comm_;
  check(ncclCommSplit(comm_, 0, rank, &lanes_[kUp]->comm, nullptr), "ncclCommSplit (sends up)");
  check(ncclCommSplit(comm_, 0, rank, &lanes_[kDown]->comm, nullptr), "ncclCommSplit (sends down)");
  for (auto& lane : lanes_) {
    Lane* l = lane.get();
    l->thread = std::thread([this, l] { loop(*l); });
  }
}

ProcessGroupChorus::~ProcessGroupChorus() {
  for (auto& lane : lanes_) {
    if (!lane) continue;
    std::lock_guard<std::mutex> lock(lane->mu);
    lane->stop = true;
    lane->cv.notify_all();
  }
  without_gil([&] {
    for (auto& lane : lanes_)
      if (lane && lane->thread.joinable()) lane->thread.join();
    compressors_.clear();
    overlap_.reset();
    // A failed operation may have left peers half way: abort (bounded) rather than finalize.
    for (int i = kLanes - 1; i >= 0; --i) {
      Lane* lane = lanes_[i].get();
      ncclComm_t comm = lane ? lane->comm : (i == kMain ? comm_ : nullptr);
      if (comm == nullptr) continue;
      (lane && lane->failed) ? ncclCommAbort(comm) : ncclCommDestroy(comm);
    }
  });
}

void ProcessGroupChorus::check(ncclResult_t r, const char* what, ncclComm_t comm) const {
  check_nccl(r, what, comm != nullptr ? comm : comm_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::enqueue(c10d::OpType type, const char* title,
                                                           std::vector<at::Tensor> outputs,
                                                           std::function<void()> run, LaneId id) {
  auto work = c10::make_intrusive<ChorusWork>(getRank(), type, title, std::move(outputs));
  Job job{work, std::move(run)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (coalescing_) {
      batch_.push_back(std::move(job));
      return work;
    }
  }
  Lane& lane = *lanes_[id];
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    TORCH_CHECK(!lane.stop, "chorus: the process group is being destroyed");
    lane.queue.push_back(std::move(job));
  }
  lane.cv.notify_one();
  return work;
}

void ProcessGroupChorus::loop(Lane& lane) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(lane.mu);
      lane.cv.wait(lock, [&] { return lane.stop || !lane.queue.empty(); });
      if (lane.queue.empty()) return;  // stopping, and everything queued has run
      job = std::move(lane.queue.front());
      lane.queue.pop_front();
    }
    try {
      job.run();
      job.work->complete(nullptr);
    } catch (...) {
      lane.failed = true;
      job.work->complete(std::current_exception());
    }
  }
}

void ProcessGroupChorus::startCoalescing() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(!coalescing_, "chorus: startCoalescing inside a batch");
  coalescing_ = true;
}

void ProcessGroupChorus::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) {
  std::vector<Job> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(coalescing_, "chorus: endCoalescing without startCoalescing");
    coalescing_ = false;
    batch.swap(batch_);
  }
  (void)reqs;  // the same Works as in `batch`
  if (batch.empty()) return;
  // One job runs the batch's calls in one group; each Work completes with the batch's outcome.
  auto shared = std::make_shared<std::vector<Job>>(std::move(batch));
  auto first = (*shared)[0].work;
  std::function<void()> run = [this, shared] {
    std::exception_ptr error;
    try {
      check(ncclGroupStart(), "ncclGroupStart");
      for (auto& j : *shared) j.run();
      check(ncclGroupEnd(), "ncclGroupEnd");
    } catch (...) {
      error = std::current_exception();
    }
    for (size_t i = 1; i < shared->size(); ++i) (*shared)[i].work->complete(error);
    if (error) std::rethrow_exception(error);
  };
  Lane& lane = *lanes_[kMain];
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    lane.queue.push_back(Job{first, std::move(run)});
  }
  lane.cv.notify_one();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  auto t = tensors[0];
  return enqueue(c10d::OpType::BROADCAST, "chorus:broadcast", {t}, [this, t, root] {
    Flat f(t);
    check(ncclBroadcast(f.data(), f.data(), f.count(), nccl_type(t), root, comm_, nullptr),
          "ncclBroadcast");
    f.copy_back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  check_one(tensors, "all_reduce");
  auto t = tensors[0];
  check_op(opts.reduceOp, t, "all_reduce");
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::ALLREDUCE, "chorus:all_reduce", {t}, [this, t, op] {
    Flat f(t);
    if (needs_fold(op, t)) {
      at::Tensor all = gather_rows(comm_, getSize(), f.flat, "ncclAllGather (bitwise all_reduce)");
      f.flat.copy_(fold_bitwise(all, op.op_).view_as(f.flat));
    } else {
      NcclOp n(op, t, comm_);
      check(ncclAllReduce(f.data(), f.data(), f.count(), nccl_type(t), n.get(), comm_, nullptr),
            "ncclAllReduce");
    }
    f.copy_back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "chorus: allreduce_coalesced of no tensors");
  for (auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced");
    check_op(opts.reduceOp, t, "allreduce_coalesced");
    TORCH_CHECK(!is_bitwise(opts.reduceOp.op_), "chorus: allreduce_coalesced: bitwise reductions "
                "are not supported here; use all_reduce");
  }
  const c10d::ReduceOp op = opts.reduceOp;
  std::vector<at::Tensor> ts = tensors;
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "chorus:allreduce_coalesced", ts,
                 [this, ts, op] {
                   std::vector<Flat> flats(ts.begin(), ts.end());
                   std::vector<NcclOp> ops;  // live until the group has run
                   ops.reserve(flats.size());
                   check(ncclGroupStart(), "ncclGroupStart");
                   for (auto& f : flats) {
                     ops.emplace_back(op, f.flat, comm_);
                     check(ncclAllReduce(f.data(), f.data(), f.count(), nccl_type(f.flat),
                                         ops.back().get(), comm_, nullptr),
                           "ncclAllReduce");
                   }
                   check(ncclGroupEnd(), "ncclGroupEnd");
                   for (auto& f : flats) f.copy_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  auto t = tensors[0];
  check_op(opts.reduceOp, t, "reduce");
  const c10d::ReduceOp op = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::REDUCE, "chorus:reduce", {t}, [this, t, op, root] {
    Flat f(t);
    if (needs_fold(op, t)) {
      at::Tensor all = gather_rows(comm_, getSize(), f.flat, "ncclAllGather (bitwise reduce)");
      if (getRank() == root) f.flat.copy_(fold_bitwise(all, op.op_).view_as(f.flat));
    } else {
      NcclOp n(op, t, comm_);
      check(ncclReduce(f.data(), f.data(), f.count(), nccl_type(t), n.get(), root, comm_, nullptr),
            "ncclReduce");
    }
    if (getRank() == root) f.copy_back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  check_one(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
              "chorus: all_gather needs one list of ", getSize(), " output tensors");
  auto in = inputs[0];
  for (auto& o : outputs[0]) {
    check_tensor(o, "all_gather");
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "chorus: all_gather: every output must have the input's size and type");
  }
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(c10d::OpType::ALLGATHER, "chorus:all_gather", outs, [this, in, outs] {
    Flat f(in);
    at::Tensor all = at::empty({getSize() * in.numel()}, in.options());
    check(ncclAllGather(f.data(), all.data_ptr(), f.count(), nccl_type(in), comm_, nullptr),
          "ncclAllGather");
    for (int i = 0; i < getSize(); ++i)
      outs[i].copy_(all.narrow(0, i * in.numel(), in.numel()).view(outs[i].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output,
                                                                   at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  check_tensor(input, "all_gather_into_tensor");
  check_tensor(output, "all_gather_into_tensor");
  TORCH_CHECK(output.numel() == input.numel() * getSize() &&
                  output.scalar_type() == input.scalar_type(),
              "chorus: all_gather_into_tensor: the output must hold ", getSize(), " x ",
              input.numel(), " elements of the input's type (it holds ", output.numel(), ")");
  at::Tensor in = input, out = output;
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "chorus:all_gather_into_tensor", {out},
                 [this, in, out] {
                   Flat i(in), o(out);
                   check(ncclAllGather(i.data(), o.data(), i.count(), nccl_type(in), comm_, nullptr),
                         "ncclAllGather");
                   o.copy_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  auto in = inputs[0];
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                "chorus: gather needs, on the root, one list of ", getSize(), " output tensors");
    outs = outputs[0];
    for (auto& o : outs) {
      check_tensor(o, "gather");
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "chorus: gather: every output must have the input's size and type");
    }
  }
  return enqueue(c10d::OpType::GATHER, "chorus:gather", outs, [this, in, outs, root] {
    Flat f(in);
    at::Tensor all;
    if (getRank() == root) all = at::empty({getSize() * in.numel()}, in.options());
    check(ncclGather(f.data(), all.defined() ? all.data_ptr() : nullptr, f.count(), nccl_type(in),
                     root, comm_, nullptr),
          "ncclGather");
    for (size_t i = 0; i < outs.size(); ++i)
      outs[i].copy_(all.narrow(0, i * in.numel(), in.numel()).view(outs[i].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  auto out = outputs[0];
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                "chorus: scatter needs, on the root, one list of ", getSize(), " input tensors");
    ins = inputs[0];
    for (auto& i : ins) {
      check_tensor(i, "scatter");
      TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                  "chorus: scatter: every input must have the output's size and type");
    }
  }
  return enqueue(c10d::OpType::SCATTER, "chorus:scatter", {out}, [this, out, ins, root] {
    Flat o(out);
    at::Tensor all;
    if (!ins.empty()) {
      std::vector<at::Tensor> flat;
      for (auto& i : ins) flat.push_back(i.reshape({-1}));
      all = at::cat(flat);
    }
    check(ncclScatter(all.defined() ? all.data_ptr() : nullptr, o.data(), o.count(),
                      nccl_type(out), root, comm_, nullptr),
          "ncclScatter");
    o.copy_back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  auto out = outputs[0];
  check_op(opts.reduceOp, out, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
              "chorus: reduce_scatter needs one list of ", getSize(), " input tensors");
  for (auto& i : inputs[0]) {
    check_tensor(i, "reduce_scatter");
    TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                "chorus: reduce_scatter: every input must have the output's size and type");
  }
  std::vector<at::Tensor> ins = inputs[0];
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::REDUCE_SCATTER, "chorus:reduce_scatter", {out},
                 [this, out, ins, op] {
                   std::vector<at::Tensor> flat;
                   for (auto& i : ins) flat.push_back(i.reshape({-1}));
                   at::Tensor all = at::cat(flat);
                   Flat o(out);
                   if (needs_fold(op, out)) {
                     reduce_scatter_folded(comm_, getRank(), getSize(), all, o, op.op_);
                     return;
                   }
                   NcclOp n(op, out, comm_);
                   check(ncclReduceScatter(all.data_ptr(), o.data(), o.count(), nccl_type(out),
                                           n.get(), comm_, nullptr),
                         "ncclReduceScatter");
                   o.copy_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(input, "reduce_scatter_tensor");
  check_tensor(output, "reduce_scatter_tensor");
  check_op(opts.reduceOp, output, "reduce_scatter_tensor");
  TORCH_CHECK(input.numel() == output.numel() * getSize() &&
                  input.scalar_type() == output.scalar_type(),
              "chorus: reduce_scatter_tensor: the input must hold ", getSize(), " x ",
              output.numel(), " elements of the output's type (it holds ", input.numel(), ")");
  at::Tensor in = input, out = output;
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "chorus:reduce_scatter_tensor", {out},
                 [this, in, out, op] {
                   Flat i(in), o(out);
                   if (needs_fold(op, out)) {
                     reduce_scatter_folded(comm_, getRank(), getSize(), i.flat, o, op.op_);
                     return;
                   }
                   NcclOp n(op, out, comm_);
                   check(ncclReduceScatter(i.data(), o.data(), o.count(), nccl_type(out), n.get(),
                                           comm_, nullptr),
                         "ncclReduceScatter");
                   o.copy_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions&) {
  check_tensor(input, "all_to_all_single");
  check_tensor(output, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(),
              "chorus: all_to_all_single: input and output types differ");
  const int n = getSize();
  // Splits count rows (the first dimension); empty splits mean equal ones.
  auto rows_of = [n](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    std::vector<int64_t> rows(n);
    const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      TORCH_CHECK(dim0 % n == 0, "chorus: all_to_all_single: the ", which, "'s first dimension (",
                  dim0, ") is not a multiple of the group size ", n);
      std::fill(rows.begin(), rows.end(), dim0 / n);
    } else {
      TORCH_CHECK(splits.size() == static_cast<size_t>(n), "chorus: all_to_all_single: ",
                  splits.size(), " ", which, " splits for ", n, " ranks");
      TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == dim0,
                  "chorus: all_to_all_single: the ", which, " splits do not add up to ", dim0);
      for (int i = 0; i < n; ++i) {
        TORCH_CHECK(splits[i] >= 0, "chorus: all_to_all_single: a negative split");
        rows[i] = splits[i];
      }
    }
    return rows;
  };
  std::vector<int64_t> in_rows = rows_of(input, input_splits, "input");
  std::vector<int64_t> out_rows = rows_of(output, output_splits, "output");
  at::Tensor in = input, out = output;
  return enqueue(c10d::OpType::ALLTOALL_BASE, "chorus:all_to_all_single", {out},
                 [this, in, out, in_rows, out_rows, n] {
                   Flat i(in), o(out);
                   const int64_t dim0_in = in.dim() == 0 ? 1 : in.size(0);
                   const int64_t dim0_out = out.dim() == 0 ? 1 : out.size(0);
                   const int64_t row_in = dim0_in == 0 ? 0 : in.numel() / dim0_in;
                   const int64_t row_out = dim0_out == 0 ? 0 : out.numel() / dim0_out;
                   const size_t elem = in.element_size();
                   auto* src = static_cast<char*>(i.data());
                   auto* dst = static_cast<char*>(o.data());
                   int64_t in_off = 0, out_off = 0;
                   check(ncclGroupStart(), "ncclGroupStart");
                   for (int p = 0; p < n; ++p) {
                     const size_t send = in_rows[p] * row_in, recv = out_rows[p] * row_out;
                     if (p == getRank()) {
                       TORCH_CHECK(send == recv, "chorus: all_to_all_single: this rank sends "
                                   "itself ", send, " elements but expects ", recv);
                       std::memcpy(dst + out_off * elem, src + in_off * elem, send * elem);
                     } else {
                       if (send > 0)
                         check(ncclSend(src + in_off * elem, send, nccl_type(in), p, comm_, nullptr),
                               "ncclSend (all_to_all_single)");
                       if (recv > 0)
                         check(ncclRecv(dst + out_off * elem, recv, nccl_type(in), p, comm_, nullptr),
                               "ncclRecv (all_to_all_single)");
                     }
                     in_off += send;
                     out_off += recv;
                   }
                   check(ncclGroupEnd(), "ncclGroupEnd");
                   o.copy_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  const size_t n = static_cast<size_t>(getSize());
  TORCH_CHECK(outputs.size() == n && inputs.size() == n, "chorus: all_to_all needs ", n,
              " input and ", n, " output tensors");
  for (size_t p = 0; p < n; ++p) {
    check_tensor(inputs[p], "all_to_all");
    check_tensor(outputs[p], "all_to_all");
    TORCH_CHECK(inputs[p].scalar_type() == outputs[p].scalar_type(),
                "chorus: all_to_all: input and output types differ");
  }
  TORCH_CHECK(inputs[getRank()].numel() == outputs[getRank()].numel(),
              "chorus: all_to_all: this rank's own input and output sizes differ");
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(c10d::OpType::ALLTOALL, "chorus:all_to_all", outs, [this, ins, outs, n] {
    std::vector<Flat> i(ins.begin(), ins.end()), o(outs.begin(), outs.end());
    check(ncclGroupStart(), "ncclGroupStart");
    for (size_t p = 0; p < n; ++p) {
      if (static_cast<int>(p) == getRank()) {
        o[p].flat.copy_(i[p].flat.view(o[p].flat.sizes()));
        continue;
      }
      if (i[p].count() > 0)
        check(ncclSend(i[p].data(), i[p].count(), nccl_type(ins[p]), static_cast<int>(p), comm_,
                       nullptr),
              "ncclSend (all_to_all)");
      if (o[p].count() > 0)
        check(ncclRecv(o[p].data(), o[p].count(), nccl_type(outs[p]), static_cast<int>(p), comm_,
                       nullptr),
              "ncclRecv (all_to_all)");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    for (auto& f : o) f.copy_back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst,
                                                        int /*tag: NCCL has none*/) {
  check_one(tensors, "send");
  TORCH_CHECK(dst >= 0 && dst < getSize() && dst != getRank(), "chorus: send to rank ", dst,
              " (group of ", getSize(), ", this is rank ", getRank(), ")");
  auto t = tensors[0];
  // A copy when not contiguous, made now: what is sent is the tensor as it is at the call.
  at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  // In a batch on the group's communicator; alone, on the lane of its direction.
  const LaneId id = dst > getRank() ? kUp : kDown;
  ncclComm_t comm = coalescing_ ? comm_ : lanes_[id]->comm;
  return enqueue(c10d::OpType::SEND, "chorus:send", {t}, [this, c, dst, comm] {
    check(ncclSend(c.data_ptr(), c.numel(), nccl_type(c), dst, comm, nullptr), "ncclSend", comm);
  }, id);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int src,
                                                        int /*tag*/) {
  check_one(tensors, "recv");
  TORCH_CHECK(src >= 0 && src < getSize() && src != getRank(), "chorus: recv from rank ", src,
              " (group of ", getSize(), ", this is rank ", getRank(), ")");
  auto t = tensors[0];
  // Inside a batch the receive completes at ncclGroupEnd, after this job's body: a
  // non-contiguous tensor is received into a contiguous one that is copied back then.
  TORCH_CHECK(t.is_contiguous() || !coalescing_,
              "chorus: irecv into a non-contiguous tensor inside batch_isend_irecv");
  const LaneId id = src < getRank() ? kUp : kDown;
  ncclComm_t comm = coalescing_ ? comm_ : lanes_[id]->comm;
  return enqueue(c10d::OpType::RECV, "chorus:recv", {t}, [this, t, src, comm] {
    Flat f(t);
    check(ncclRecv(f.data(), f.count(), nccl_type(t), src, comm, nullptr), "ncclRecv", comm);
    f.copy_back();
  }, id);
}

struct ProcessGroupChorus::Compressor {
  chorusCompressor_t handle = nullptr;
  int64_t count = -1;
  at::ScalarType type = at::kFloat;
  ~Compressor() {
    if (handle != nullptr) chorusCompressorDestroy(handle);
  }
};

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_compressed(
    at::Tensor& tensor, int64_t key, const CompressOptions& options) {
  check_tensor(tensor, "allreduce_compressed");
  const auto type = tensor.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf,
              "chorus: FP8 compression takes float, bfloat16 or half tensors, not ", type);
  at::Tensor t = tensor;
  return enqueue(c10d::OpType::ALLREDUCE, "chorus:all_reduce_fp8", {t}, [this, t, key, options] {
    std::unique_ptr<Compressor>& c = compressors_[key];
    if (!c) {
      c = std::make_unique<Compressor>();
      chorusCompressConfig_t config = CHORUS_COMPRESS_CONFIG_INIT;
      config.format = options.e5m2 ? chorusFp8E5M2 : chorusFp8E4M3;
      config.blockSize = static_cast<unsigned>(options.block_size);
      config.errorFeedback = options.error_feedback ? 1 : 0;
      check(chorusCompressorCreate(&config, &c->handle), "chorusCompressorCreate");
    }
    Flat f(t);
    if (c->count != static_cast<int64_t>(f.count()) || c->type != t.scalar_type()) {
      if (c->count >= 0) check(chorusCompressorReset(c->handle), "chorusCompressorReset");
      c->count = static_cast<int64_t>(f.count());
      c->type = t.scalar_type();
    }
    check(chorusAllReduceCompressed(f.data(), f.data(), f.count(), nccl_type(t),
                                    options.average ? ncclAvg : ncclSum, c->handle, comm_, nullptr),
          "chorusAllReduceCompressed");
    f.copy_back();
  });
}

struct ProcessGroupChorus::Overlap {
  ncclComm_t comm = nullptr;
  chorusOverlap_t scheduler = nullptr;
  std::vector<at::Tensor> buckets;  // kept alive: the scheduler holds their addresses
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<c10::intrusive_ptr<ChorusWork>, void*>> waiting;
  bool stop = false;
  std::thread waiter;

  // Waits for each readied bucket in turn and completes its Work.
  void wait_loop(const ProcessGroupChorus* pg) {
    for (;;) {
      std::pair<c10::intrusive_ptr<ChorusWork>, void*> next;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !waiting.empty(); });
        if (waiting.empty()) return;
        next = std::move(waiting.front());
        waiting.pop_front();
      }
      std::exception_ptr error;
      try {
        pg->check(chorusOverlapWait(scheduler, next.second), "chorusOverlapWait");
      } catch (...) {
        error = std::current_exception();
      }
      next.first->complete(error);
    }
  }

  ~Overlap() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (waiter.joinable()) waiter.join();
    if (scheduler != nullptr) chorusOverlapDestroy(scheduler);
    if (comm != nullptr) ncclCommDestroy(comm);
  }
};

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::overlap_setup(std::vector<at::Tensor> buckets,
                                                                 const OverlapOptions& options) {
  TORCH_CHECK(!buckets.empty(), "chorus: overlap_setup of no buckets");
  for (auto& b : buckets) {
    check_tensor(b, "overlap_setup");
    TORCH_CHECK(b.is_contiguous(), "chorus: overlap_setup: bucket buffers are contiguous");
  }
  return enqueue(c10d::OpType::UNKNOWN, "chorus:overlap_setup", {}, [this, buckets, options] {
    overlap_.reset();  // the previous scheduler's buckets are all reduced: DDP waited for them
    auto o = std::make_unique<Overlap>();
    check(ncclCommSplit(comm_, 0, getRank(), &o->comm, nullptr), "ncclCommSplit (overlap)");
    chorusOverlapConfig_t config;
    check(chorusOverlapConfigInit(&config), "chorusOverlapConfigInit");
    config.policy = options.fifo ? chorusOverlapFifo : chorusOverlapPriority;
    config.op = ncclAvg;
    if (options.bucket_bytes > 0) config.bucketBytes = static_cast<size_t>(options.bucket_bytes);
    if (options.partition_bytes >= 0)
      config.partitionBytes = static_cast<size_t>(options.partition_bytes);
    chorusCompressConfig_t fp8 = CHORUS_COMPRESS_CONFIG_INIT;
    fp8.errorFeedback = 1;
    if (options.fp8) config.compress = &fp8;
    check(chorusOverlapCreate(o->comm, &config, &o->scheduler), "chorusOverlapCreate");
    const int n = static_cast<int>(buckets.size());
    for (int i = 0; i < n; ++i)
      check(chorusOverlapRegister(o->scheduler, buckets[i].data_ptr(), buckets[i].numel(),
                                  nccl_type(buckets[i]), n - 1 - i),
            "chorusOverlapRegister");
    o->buckets = buckets;
    Overlap* raw = o.get();
    o->waiter = std::thread([raw, this] { raw->wait_loop(this); });
    overlap_ = std::move(o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::overlap_ready(at::Tensor& bucket) {
  TORCH_CHECK(overlap_ != nullptr, "chorus: overlap_ready before overlap_setup completed");
  auto work = c10::make_intrusive<ChorusWork>(getRank(), c10d::OpType::ALLREDUCE,
                                              "chorus:overlap_bucket", std::vector<at::Tensor>{bucket});
  Overlap& o = *overlap_;
  check(chorusOverlapReady(o.scheduler, bucket.data_ptr(), bucket.numel(), nccl_type(bucket)),
        "chorusOverlapReady");
  {
    std::lock_guard<std::mutex> lock(o.mu);
    o.waiting.emplace_back(work, bucket.data_ptr());
  }
  o.cv.notify_one();
  return work;
}

ncclComm_t ProcessGroupChorus::split_comm(const char* purpose) {
  auto comm = std::make_shared<ncclComm_t>(nullptr);
  const std::string what = std::string("ncclCommSplit (") + purpose + ")";
  auto work = enqueue(c10d::OpType::UNKNOWN, "chorus:split_comm", {}, [this, comm, what] {
    check(ncclCommSplit(comm_, 0, getRank(), comm.get(), nullptr), what.c_str());
  });
  without_gil([&] { work->wait(); });
  return *comm;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false, "chorus: recv from any source is not supported (NCCL has no such receive)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions&) {
  at::Tensor token = at::zeros({1}, at::kInt);
  return enqueue(c10d::OpType::BARRIER, "chorus:barrier", {}, [this, token] {
    check(ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclInt32, ncclSum, comm_, nullptr),
          "ncclAllReduce (barrier)");
  });
}

}  // namespace chorus::torch_backend
