// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/ep.cc
#include "ep.h"

#include <chorus/ep.h>
#include <chorus/stream.h>
#include <torch/python.h>

#include <ATen/ATen.h>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "process_group.h"

namespace py = pybind11;

namespace chorus::torch_backend {

namespace {

// Chorus's error for a failed EP call: the result and ncclGetLastError's text (the calling
// thread's last error, which names the token, the rank or the size needed). Read it at once.
std::string ep_error(ncclResult_t r, const char* what) {
  const std::string detail = ncclGetLastError(nullptr);
  return std::string("chorus: ") + what + " failed: " + ncclGetErrorString(r) +
         (detail.empty() ? "" : ": " + detail);
}

// Throws ep_error for a failed call.
void check_ep(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(ep_error(r, what));
}

// A failure that broke the communicator, not an argument refusal (which every rank agreed on).
bool breaks_comm(ncclResult_t r) {
  return r != ncclSuccess && r != ncclInvalidArgument && r != ncclInvalidUsage;
}

// A CPU, contiguous tensor of `type`, with `dims` (-1: any size) when `dims` is not empty.
void check_arg(const at::Tensor& t, const char* call, const char* name, at::ScalarType type,
               std::vector<int64_t> dims) {
  TORCH_CHECK_VALUE(t.defined(), "chorus ", call, ": ", name, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "chorus ", call, ": ", name,
                    " must be a CPU tensor, not on ", t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == type, "chorus ", call, ": ", name, " must be ", type,
                   ", not ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), "chorus ", call, ": ", name,
                    " must be contiguous (call .contiguous())");
  bool match = t.dim() == static_cast<int64_t>(dims.size());
  for (size_t d = 0; match && d < dims.size(); ++d)
    match = dims[d] < 0 || dims[d] == t.size(static_cast<int64_t>(d));
  if (match) return;
  std::string want = "[";
  for (size_t d = 0; d < dims.size(); ++d)
    want += (d ? ", " : "") + (dims[d] < 0 ? std::string("*") : std::to_string(dims[d]));
  TORCH_CHECK_VALUE(false, "chorus ", call, ": ", name, " must have shape ", want + "]",
                    ", not ", t.sizes());
}

int to_int(int64_t v, const char* call, const char* name) {
  TORCH_CHECK_VALUE(v >= 0 && v <= std::numeric_limits<int>::max(), "chorus ", call, ": ", name,
                    " is ", v);
  return static_cast<int>(v);
}

// The datatype of dispatched (`scales`: FP8 codes with their scales) or combined rows.
ncclDataType_t row_type(const at::Tensor& x, bool scales, const char* call) {
  if (scales) {
    TORCH_CHECK_TYPE(x.scalar_type() == at::kByte, "chorus ", call,
                     ": FP8 tokens are (uint8 E4M3 codes, float32 scales), not (", x.scalar_type(),
                     ", ...)");
    return ncclFloat8e4m3;
  }
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "chorus ",
                   call, ": x must be float32 or bfloat16 (or an FP8 tuple for dispatch), not ",
                   x.scalar_type());
  return x.scalar_type() == at::kFloat ? ncclFloat32 : ncclBfloat16;
}

// The outputs of one dispatch, allocated by chorusEpDispatchOutput_t's allocate callback once
// the dispatch's count exchange has told this rank how many rows arrive: tensors of exactly
// those rows, with no collective of our own to learn the count first.
struct DispatchOutputs {
  at::TensorOptions x_options;  // recv_x: x's dtype (uint8 FP8 codes with scales)
  int64_t hidden = 0, topk = 0;
  bool scales = false, weights = false;
  int64_t rows = -1;  // -1: not allocated (the call was refused before)
  at::Tensor recv_x, recv_idx;
  c10::optional<at::Tensor> recv_scales, recv_weights;
  std::exception_ptr error;  // what allocating raised: rethrown once the call returns

  // chorusEpDispatchOutput_t::allocate; a C callback, so it must not throw.
  static int allocate(void* ctx, size_t num_recv, chorusEpDispatchOutput_t* out) noexcept {
    auto& o = *static_cast<DispatchOutputs*>(ctx);
    try {
      const auto rows = static_cast<int64_t>(num_recv);
      o.recv_x = at::empty({rows, o.hidden}, o.x_options);
      if (o.scales) o.recv_scales = at::empty({rows, o.hidden / CHORUS_EP_FP8_BLOCK}, at::kFloat);
      o.recv_idx = at::empty({rows, o.topk}, at::kLong);
      if (o.weights) o.recv_weights = at::empty({rows, o.topk}, at::kFloat);
      out->recvX = o.recv_x.data_ptr();
      out->recvXScales = o.recv_scales ? o.recv_scales->data_ptr<float>() : nullptr;
      out->recvTopkIdx = o.recv_idx.data_ptr<int64_t>();
      out->recvTopkWeights = o.recv_weights ? o.recv_weights->data_ptr<float>() : nullptr;
      out->recvCapacity = num_recv;
      o.rows = rows;
      return 0;
    } catch (...) {
      o.error = std::current_exception();
      return 1;
    }
  }
};

}  // namespace

// What combine needs of one dispatch; frees its chorusEpHandle_t when Python lets go of it
// (valid even after its buffer was destroyed).
class EpHandle {
 public:
  EpHandle(chorusEpHandle_t handle, int64_t num_tokens, int64_t num_recv_tokens, int64_t hidden,
           int64_t topk)
      : num_tokens(num_tokens),
        num_recv_tokens(num_recv_tokens),
        hidden(hidden),
        topk(topk),
        handle_(handle) {}
  ~EpHandle() { chorusEpHandleDestroy(handle_); }
  EpHandle(const EpHandle&) = delete;
  EpHandle& operator=(const EpHandle&) = delete;

  chorusEpHandle_t get() const { return handle_; }

  const int64_t num_tokens;       // tokens this rank dispatched: combine's output rows
  const int64_t num_recv_tokens;  // tokens it received: combine's input rows
  const int64_t hidden;           // channels of the dispatched tokens
  const int64_t topk;

 private:
  const chorusEpHandle_t handle_;
};

// What low-latency combine needs of one low-latency dispatch, and its shapes; frees its
// chorusEpHandle_t when Python lets go of it (any time: a pending hook keeps what it needs).
class EpLowLatencyHandle {
 public:
  EpLowLatencyHandle(chorusEpHandle_t handle, at::Tensor topk_idx, int64_t hidden,
                     int64_t num_experts, int64_t num_local_experts, int64_t num_rows,
                     int64_t max_tokens)
      : topk_idx(std::move(topk_idx)),
        num_tokens(this->topk_idx.size(0)),
        topk(this->topk_idx.size(1)),
        hidden(hidden),
        num_experts(num_experts),
        num_local_experts(num_local_experts),
        num_rows(num_rows),
        max_tokens(max_tokens),
        handle_(handle) {}
  ~EpLowLatencyHandle() { chorusEpHandleDestroy(handle_); }
  EpLowLatencyHandle(const EpLowLatencyHandle&) = delete;
  EpLowLatencyHandle& operator=(const EpLowLatencyHandle&) = delete;

  chorusEpHandle_t get() const { return handle_; }

  const at::Tensor topk_idx;  // a copy of the dispatch's: combine checks it was given the same
  const int64_t num_tokens;   // tokens this rank dispatched: combine's output rows
  const int64_t topk;
  const int64_t hidden;
  const int64_t num_experts;
  const int64_t num_local_experts;  // L: combine's x is [L, num_rows, hidden]
  const int64_t num_rows;           // R = num_ranks * max_tokens
  const int64_t max_tokens;

 private:
  const chorusEpHandle_t handle_;
};

// The communicator and the C buffer of one EpBuffer, shared with its pending low-latency hooks:
// <chorus/ep.h> lets a hook outlive chorusEpBufferDestroy, but its transfers run on the
// communicator, so that is torn down only once the buffer is destroyed and no hook is pending.
struct EpState {
  c10::intrusive_ptr<ProcessGroupChorus> group;  // held while comm, split from it, lives
  std::mutex mu;  // one call at a time per buffer: calls, hook waits, destroy
  ncclComm_t comm = nullptr;
  chorusEpBuffer_t buffer = nullptr;
  bool broken = false;    // a call failed mid-way: the teardown aborts comm
  int pending_hooks = 0;  // hooks returned and not yet waited
  // Asynchronous calls (async_finish) queue their data movement on this host stream; the
  // tensors of the last one stay here until the next call on the buffer has returned (the C API
  // finishes a buffer's queued work before it starts another call) or the buffer goes.
  chorusStream_t stream = nullptr;
  std::vector<at::Tensor> in_flight;

  ~EpState() {
    if (buffer != nullptr) chorusEpBufferDestroy(buffer);
    buffer = nullptr;
    teardown_if_idle();
  }

  // The stream of asynchronous calls, made on first use. Under mu.
  chorusStream_t queue() {
    if (stream == nullptr) check_ep(chorusStreamCreate(&stream), "chorusStreamCreate");
    return stream;
  }

  // Frees the communicator once the buffer is destroyed and no hook needs it. Under mu (or by
  // the last owner).
  void teardown_if_idle() {
    if (buffer != nullptr || pending_hooks > 0 || comm == nullptr) return;
    if (stream != nullptr) chorusStreamDestroy(stream);  // waits; its error was the event's
    stream = nullptr;
    in_flight.clear();
    broken ? ncclCommAbort(comm) : ncclCommDestroy(comm);
    comm = nullptr;
    group.reset();
  }

  // check_ep, remembering a failure that broke the communicator.
  void check_call(ncclResult_t r, const char* what) {
    if (breaks_comm(r)) broken = true;
    check_ep(r, what);
  }
};

// DeepEP's recv hook: calling it waits for the data of the low-latency call that returned it
// and writes that call's outputs (chorusEpHookWait). It keeps those outputs alive until then.
// A second call does nothing (or raises the first call's error again); a hook Python drops
// uncalled is waited for then, so its outputs are written and nothing leaks.
class EpHook {
 public:
  EpHook(std::shared_ptr<EpState> state, chorusEpHook_t hook, std::vector<at::Tensor> outputs)
      : state_(std::move(state)), hook_(hook), outputs_(std::move(outputs)) {}
  ~EpHook();
  EpHook(const EpHook&) = delete;
  EpHook& operator=(const EpHook&) = delete;

  // Waits (once). Call without the GIL.
  void operator()();
  bool done() {
    std::lock_guard<std::mutex> lock(state_->mu);
    return hook_ == nullptr;
  }

 private:
  std::shared_ptr<EpState> state_;
  chorusEpHook_t hook_;  // nullptr once waited
  std::vector<at::Tensor> outputs_;
  std::string error_;  // the wait's failure, raised again by later calls
};

void EpHook::operator()() {
  std::vector<at::Tensor> outputs;  // released after the lock, once written
  std::lock_guard<std::mutex> lock(state_->mu);
  if (hook_ == nullptr) {
    if (!error_.empty()) throw std::runtime_error(error_ + " (raised by this hook's first call)");
    return;
  }
  const ncclResult_t r = chorusEpHookWait(hook_);  // frees the hook, also when it fails
  if (r != ncclSuccess) error_ = ep_error(r, "chorusEpHookWait");
  if (breaks_comm(r)) state_->broken = true;
  hook_ = nullptr;
  outputs.swap(outputs_);
  --state_->pending_hooks;
  state_->teardown_if_idle();
  if (r != ncclSuccess) throw std::runtime_error(error_);
}

EpHook::~EpHook() {
  if (hook_ == nullptr) return;
  auto wait = [this] {
    try {
      (*this)();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "chorus: a low-latency hook dropped uncalled failed its wait: %s\n",
                   e.what());
    }
  };
  if (PyGILState_Check()) {
    py::gil_scoped_release no_gil;
    wait();
  } else {
    wait();
  }
}

// DeepEP's event of an asynchronous call (async_finish): the work the call queued on its
// buffer's stream, up to the call (chorusEventRecord). synchronize() waits for it (the outputs
// are then written) and raises its failure; it keeps the call's tensors alive until then (the
// buffer keeps them too, so dropping the event is safe).
class EpEvent {
 public:
  EpEvent(chorusStream_t stream, std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
    check_ep(chorusEventCreate(&event_), "chorusEventCreate");
    const ncclResult_t r = chorusEventRecord(event_, stream);
    if (r != ncclSuccess) {
      chorusEventDestroy(event_);
      check_ep(r, "chorusEventRecord");
    }
  }
  ~EpEvent() { chorusEventDestroy(event_); }
  EpEvent(const EpEvent&) = delete;
  EpEvent& operator=(const EpEvent&) = delete;

  chorusEvent_t get() const { return event_; }
  // Call without the GIL.
  void synchronize() {
    check_ep(chorusEventSynchronize(event_), "the asynchronous EP call (chorusEventSynchronize)");
    std::lock_guard<std::mutex> lock(mu_);
    tensors_.clear();
  }
  bool query() const {
    const ncclResult_t r = chorusEventQuery(event_);
    if (r == ncclInProgress) return false;
    check_ep(r, "the asynchronous EP call (chorusEventQuery)");
    return true;
  }

 private:
  chorusEvent_t event_ = nullptr;
  std::mutex mu_;
  std::vector<at::Tensor> tensors_;
};

// recv_x, recv_x_scales (FP8), recv_topk_idx, recv_topk_weights (when topk_weights were
// given), num_recv_tokens_per_expert, handle.
// With async_finish, the event of the call (else None).
using DispatchResult =
    std::tuple<at::Tensor, c10::optional<at::Tensor>, at::Tensor, c10::optional<at::Tensor>,
               std::vector<int64_t>, std::shared_ptr<EpHandle>, std::shared_ptr<EpEvent>>;
// recv_x, recv_x_scales (FP8), recv_count, handle, hook (None without return_recv_hook).
using LowLatencyDispatchResult =
    std::tuple<at::Tensor, c10::optional<at::Tensor>, at::Tensor,
               std::shared_ptr<EpLowLatencyHandle>, std::shared_ptr<EpHook>>;

class EpBuffer {
 public:
  EpBuffer(const c10::intrusive_ptr<ProcessGroupChorus>& group, int64_t bytes);
  ~EpBuffer() { destroy(); }
  EpBuffer(const EpBuffer&) = delete;
  EpBuffer& operator=(const EpBuffer&) = delete;

  // Frees the staging memory and (once no hook is pending) the communicator; later calls raise.
  // Local, idempotent.
  void destroy();
  int rank() const { return rank_; }
  int num_ranks() const { return nranks_; }
  int64_t num_bytes() const { return bytes_; }

  std::tuple<at::Tensor, at::Tensor, at::Tensor> get_dispatch_layout(const at::Tensor& topk_idx,
                                                                     int64_t num_experts);
  DispatchResult dispatch(const at::Tensor& x, const c10::optional<at::Tensor>& x_scales,
                          const at::Tensor& topk_idx,
                          const c10::optional<at::Tensor>& topk_weights,
                          const at::Tensor& num_tokens_per_rank,
                          const at::Tensor& is_token_in_rank,
                          const at::Tensor& num_tokens_per_expert, int64_t expert_alignment,
                          const std::shared_ptr<EpEvent>& previous_event, bool async_finish);
  std::tuple<at::Tensor, c10::optional<at::Tensor>, std::shared_ptr<EpEvent>> combine(
      const at::Tensor& x, const EpHandle& handle, const c10::optional<at::Tensor>& topk_weights,
      const std::shared_ptr<EpEvent>& previous_event, bool async_finish);
  LowLatencyDispatchResult low_latency_dispatch(const at::Tensor& x, const at::Tensor& topk_idx,
                                                int64_t max_tokens, int64_t num_experts,
                                                bool use_fp8, bool round_scale, bool use_ue8m0,
                                                bool return_recv_hook);
  std::tuple<at::Tensor, std::shared_ptr<EpHook>> low_latency_combine(
      const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
      const EpLowLatencyHandle& handle, bool return_recv_hook,
      const c10::optional<at::Tensor>& out);

 private:
  // The live buffer (under state_->mu), or a ValueError naming `call`.
  chorusEpBuffer_t live(const char* call) const;
  // A hook of the call that just returned `hook` (nullptr: none), keeping `outputs`. Under mu.
  std::shared_ptr<EpHook> make_hook(chorusEpHook_t hook, std::vector<at::Tensor> outputs);
  // The stream a normal-mode call queues on: with async_finish, the buffer's (waiting first for
  // previous_event), else NULL (blocking; previous_event is waited for). Under mu.
  chorusStream_t stream_for(const std::shared_ptr<EpEvent>& previous_event, bool async_finish);
  // After a call on `stream` returned: the previous call's tensors go (its work is done), and
  // with a stream, this call's stay, and its event is returned. Under mu.
  std::shared_ptr<EpEvent> queued(chorusStream_t stream, std::vector<at::Tensor> tensors);

  int rank_ = 0;
  int nranks_ = 0;
  int64_t bytes_ = 0;
  const std::shared_ptr<EpState> state_ = std::make_shared<EpState>();
};

EpBuffer::EpBuffer(const c10::intrusive_ptr<ProcessGroupChorus>& group, int64_t bytes)
    : rank_(group->getRank()), nranks_(group->getSize()), bytes_(bytes) {
  TORCH_CHECK_VALUE(bytes > 0, "chorus Buffer: num_bytes is ", bytes,
                    " (Buffer.get_buffer_size_hint gives the size)");
  state_->group = group;
  state_->comm = group->split_comm("EP buffer");
  try {
    check_ep(chorusEpBufferCreate(state_->comm, static_cast<size_t>(bytes), &state_->buffer),
             "chorusEpBufferCreate");
  } catch (...) {
    ncclCommDestroy(state_->comm);
    state_->comm = nullptr;
    throw;
  }
}

void EpBuffer::destroy() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->buffer == nullptr) return;
  chorusEpBufferDestroy(state_->buffer);  // a pending hook keeps the memory it needs
  state_->buffer = nullptr;
  state_->teardown_if_idle();
}

chorusEpBuffer_t EpBuffer::live(const char* call) const {
  TORCH_CHECK_VALUE(state_->buffer != nullptr, "chorus ", call, ": the Buffer was destroyed");
  return state_->buffer;
}

std::shared_ptr<EpHook> EpBuffer::make_hook(chorusEpHook_t hook, std::vector<at::Tensor> outputs) {
  if (hook == nullptr) return nullptr;
  ++state_->pending_hooks;
  return std::make_shared<EpHook>(state_, hook, std::move(outputs));
}

chorusStream_t EpBuffer::stream_for(const std::shared_ptr<EpEvent>& previous_event,
                                    bool async_finish) {
  chorusStream_t stream = async_finish ? state_->queue() : nullptr;
  if (previous_event)
    check_ep(chorusStreamWaitEvent(stream, previous_event->get()), "chorusStreamWaitEvent");
  return stream;
}

std::shared_ptr<EpEvent> EpBuffer::queued(chorusStream_t stream, std::vector<at::Tensor> tensors) {
  state_->in_flight.clear();
  if (stream == nullptr) return nullptr;
  state_->in_flight = tensors;
  return std::make_shared<EpEvent>(stream, std::move(tensors));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> EpBuffer::get_dispatch_layout(
    const at::Tensor& topk_idx, int64_t num_experts) {
  const char* call = "get_dispatch_layout";
  check_arg(topk_idx, call, "topk_idx", at::kLong, {-1, -1});
  const int experts = to_int(num_experts, call, "num_experts");
  const int64_t tokens = topk_idx.size(0);
  at::Tensor per_rank = at::empty({nranks_}, at::kInt);
  at::Tensor per_expert = at::empty({experts}, at::kInt);
  at::Tensor in_rank = at::empty({tokens, nranks_}, at::kBool);
  std::lock_guard<std::mutex> lock(state_->mu);
  // isTokenInRank's 0/1 bytes are valid torch bools.
  state_->check_call(
      chorusEpGetDispatchLayout(live(call), topk_idx.data_ptr<int64_t>(),
                                static_cast<size_t>(tokens), to_int(topk_idx.size(1), call, "topk"),
                                experts, per_rank.data_ptr<int>(), per_expert.data_ptr<int>(),
                                reinterpret_cast<uint8_t*>(in_rank.data_ptr<bool>())),
      "chorusEpGetDispatchLayout");
  return {per_rank, per_expert, in_rank};
}

DispatchResult EpBuffer::dispatch(const at::Tensor& x, const c10::optional<at::Tensor>& x_scales,
                                  const at::Tensor& topk_idx,
                                  const c10::optional<at::Tensor>& topk_weights,
                                  const at::Tensor& num_tokens_per_rank,
                                  const at::Tensor& is_token_in_rank,
                                  const at::Tensor& num_tokens_per_expert,
                                  int64_t expert_alignment,
                                  const std::shared_ptr<EpEvent>& previous_event,
                                  bool async_finish) {
  const char* call = "dispatch";
  const ncclDataType_t type = row_type(x, x_scales.has_value(), call);
  check_arg(x, call, "x", x.scalar_type(), {-1, -1});
  const int64_t tokens = x.size(0), hidden = x.size(1);
  if (x_scales)
    check_arg(*x_scales, call, "the FP8 scales", at::kFloat, {tokens, hidden / CHORUS_EP_FP8_BLOCK});
  check_arg(topk_idx, call, "topk_idx", at::kLong, {tokens, -1});
  const int64_t topk = topk_idx.size(1);
  if (topk_weights) check_arg(*topk_weights, call, "topk_weights", at::kFloat, {tokens, topk});
  check_arg(num_tokens_per_rank, call, "num_tokens_per_rank", at::kInt, {nranks_});
  check_arg(is_token_in_rank, call, "is_token_in_rank", at::kBool, {tokens, nranks_});
  check_arg(num_tokens_per_expert, call, "num_tokens_per_expert", at::kInt, {-1});
  const int experts = to_int(num_tokens_per_expert.size(0), call, "num_experts");

  chorusEpDispatchArgs_t args{};
  args.x = x.data_ptr();
  args.xScales = x_scales ? x_scales->data_ptr<float>() : nullptr;
  args.datatype = type;
  args.numTokens = static_cast<size_t>(tokens);
  args.hidden = static_cast<size_t>(hidden);
  args.topkIdx = topk_idx.data_ptr<int64_t>();
  args.topkWeights = topk_weights ? topk_weights->data_ptr<float>() : nullptr;
  args.topk = to_int(topk, call, "topk");
  args.numExperts = experts;
  args.numTokensPerRank = num_tokens_per_rank.data_ptr<int>();
  args.numTokensPerExpert = num_tokens_per_expert.data_ptr<int>();
  args.isTokenInRank = reinterpret_cast<const uint8_t*>(is_token_in_rank.data_ptr<bool>());
  args.expertAlignment = to_int(expert_alignment, call, "expert_alignment");

  std::lock_guard<std::mutex> lock(state_->mu);
  live(call);
  const int64_t local_experts = nranks_ > 0 && experts % nranks_ == 0 ? experts / nranks_ : 0;
  std::vector<int> per_expert(static_cast<size_t>(local_experts), 0);
  // Outputs of exactly the rows that arrive, allocated during the call (DispatchOutputs).
  DispatchOutputs outputs;
  outputs.x_options = x.options();
  outputs.hidden = hidden;
  outputs.topk = topk;
  outputs.scales = x_scales.has_value();
  outputs.weights = topk_weights.has_value();
  chorusEpDispatchOutput_t out{};
  out.numRecvTokensPerExpert = per_expert.data();
  out.allocate = DispatchOutputs::allocate;
  out.allocateCtx = &outputs;
  chorusEpHandle_t raw = nullptr;
  const chorusStream_t stream = stream_for(previous_event, async_finish);
  const ncclResult_t r = chorusEpDispatchAsync(state_->buffer, &args, &out, &raw, stream);
  // This rank's allocation failed: the call was refused on every rank and the communicator is
  // fine, so the allocator's own error is the one to raise.
  if (outputs.error) std::rethrow_exception(outputs.error);
  state_->check_call(r, "chorusEpDispatch");
  TORCH_INTERNAL_ASSERT(outputs.rows == static_cast<int64_t>(out.numRecvTokens),
                        "chorus dispatch: ", out.numRecvTokens, " tokens arrived, outputs for ",
                        outputs.rows, " were allocated");
  auto handle = std::make_shared<EpHandle>(raw, tokens, static_cast<int64_t>(out.numRecvTokens),
                                           hidden, topk);
  const at::Tensor& recv_x = outputs.recv_x;
  const at::Tensor& recv_idx = outputs.recv_idx;
  const c10::optional<at::Tensor>& recv_scales = outputs.recv_scales;
  const c10::optional<at::Tensor>& recv_weights = outputs.recv_weights;
  // Queued: x, its scales, topk_idx and topk_weights are read, and the outputs written, later.
  std::vector<at::Tensor> tensors = {x, topk_idx, recv_x, recv_idx};
  using Optional = const c10::optional<at::Tensor>*;
  for (Optional t : std::initializer_list<Optional>{&x_scales, &topk_weights, &recv_scales, &recv_weights})
    if (t->has_value()) tensors.push_back(**t);
  auto event = queued(stream, std::move(tensors));
  return {recv_x, recv_scales, recv_idx, recv_weights,
          std::vector<int64_t>(per_expert.begin(), per_expert.end()), handle, event};
}

std::tuple<at::Tensor, c10::optional<at::Tensor>, std::shared_ptr<EpEvent>> EpBuffer::combine(
    const at::Tensor& x, const EpHandle& handle, const c10::optional<at::Tensor>& topk_weights,
    const std::shared_ptr<EpEvent>& previous_event, bool async_finish) {
  const char* call = "combine";
  const ncclDataType_t type = row_type(x, false, call);
  check_arg(x, call, "x", x.scalar_type(), {handle.num_recv_tokens, handle.hidden});
  if (topk_weights)
    check_arg(*topk_weights, call, "topk_weights", at::kFloat,
              {handle.num_recv_tokens, handle.topk});
  at::Tensor combined = at::empty({handle.num_tokens, handle.hidden}, x.options());
  c10::optional<at::Tensor> combined_weights;
  if (topk_weights) combined_weights = at::empty({handle.num_tokens, handle.topk}, at::kFloat);
  std::lock_guard<std::mutex> lock(state_->mu);
  chorusEpBuffer_t buffer = live(call);
  const chorusStream_t stream = stream_for(previous_event, async_finish);
  state_->check_call(
      chorusEpCombineAsync(buffer, handle.get(), x.data_ptr(), type,
                           topk_weights ? topk_weights->data_ptr<float>() : nullptr,
                           combined.data_ptr(),
                           combined_weights ? combined_weights->data_ptr<float>() : nullptr, stream),
      "chorusEpCombine");
  std::vector<at::Tensor> tensors = {x, combined};
  using Optional = const c10::optional<at::Tensor>*;
  for (Optional t : std::initializer_list<Optional>{&topk_weights, &combined_weights})
    if (t->has_value()) tensors.push_back(**t);
  return {combined, combined_weights, queued(stream, std::move(tensors))};
}

LowLatencyDispatchResult EpBuffer::low_latency_dispatch(const at::Tensor& x,
                                                        const at::Tensor& topk_idx,
                                                        int64_t max_tokens, int64_t num_experts,
                                                        bool use_fp8, bool round_scale,
                                                        bool use_ue8m0, bool return_recv_hook) {
  const char* call = "low_latency_dispatch";
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "chorus ",
                   call, ": x must be bfloat16 or float32, not ", x.scalar_type());
  check_arg(x, call, "x", x.scalar_type(), {-1, -1});
  const int64_t tokens = x.size(0), hidden = x.size(1);
  check_arg(topk_idx, call, "topk_idx", at::kLong, {tokens, -1});
  TORCH_CHECK_VALUE(max_tokens > 0 && max_tokens <= std::numeric_limits<int>::max(), "chorus ",
                    call, ": num_max_dispatch_tokens_per_rank is ", max_tokens);
  const int experts = to_int(num_experts, call, "num_experts");
  // Outputs for every row a local expert can receive. numExperts not a multiple of nranks is
  // refused by the C API (on every rank) before anything is written.
  const int64_t local = experts % nranks_ == 0 ? experts / nranks_ : 0;
  const int64_t rows = nranks_ * max_tokens;
  at::Tensor recv_x = at::empty({local, rows, hidden}, use_fp8 ? at::kByte : x.scalar_type());
  c10::optional<at::Tensor> recv_scales;
  if (use_fp8)
    recv_scales = at::empty({local, rows, hidden / CHORUS_EP_FP8_BLOCK},
                            use_ue8m0 ? at::kByte : at::kFloat);
  at::Tensor recv_count = at::zeros({local}, at::kInt);

  chorusEpLowLatencyDispatchArgs_t args{};
  args.x = x.data_ptr();
  args.datatype = x.scalar_type() == at::kFloat ? ncclFloat32 : ncclBfloat16;
  args.numTokens = static_cast<size_t>(tokens);
  args.hidden = static_cast<size_t>(hidden);
  args.topkIdx = topk_idx.data_ptr<int64_t>();
  args.topk = to_int(topk_idx.size(1), call, "topk");
  args.numExperts = experts;
  args.maxTokensPerRank = static_cast<size_t>(max_tokens);
  args.useFp8 = use_fp8;
  args.roundScale = round_scale;
  args.useUe8m0 = use_ue8m0;
  chorusEpLowLatencyDispatchOutput_t out{};
  out.recvX = recv_x.data_ptr();
  out.recvXScales = recv_scales ? recv_scales->data_ptr() : nullptr;
  out.recvCount = recv_count.data_ptr<int>();

  std::lock_guard<std::mutex> lock(state_->mu);
  chorusEpHandle_t raw = nullptr;
  chorusEpHook_t hook = nullptr;
  state_->check_call(
      chorusEpLowLatencyDispatch(live(call), &args, &out, return_recv_hook, &raw, &hook),
      "chorusEpLowLatencyDispatch");
  auto handle = std::make_shared<EpLowLatencyHandle>(raw, topk_idx.clone(), hidden, experts,
                                                     local, rows, max_tokens);
  std::vector<at::Tensor> outputs{recv_x, recv_count};
  if (recv_scales) outputs.push_back(*recv_scales);
  return {recv_x, recv_scales, recv_count, handle, make_hook(hook, std::move(outputs))};
}

std::tuple<at::Tensor, std::shared_ptr<EpHook>> EpBuffer::low_latency_combine(
    const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights,
    const EpLowLatencyHandle& handle, bool return_recv_hook,
    const c10::optional<at::Tensor>& out) {
  const char* call = "low_latency_combine";
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "chorus ",
                   call, ": x must be bfloat16 or float32, not ", x.scalar_type());
  check_arg(x, call, "x", x.scalar_type(),
            {handle.num_local_experts, handle.num_rows, handle.hidden});
  check_arg(topk_idx, call, "topk_idx", at::kLong, {handle.num_tokens, handle.topk});
  TORCH_CHECK_VALUE(at::equal(topk_idx, handle.topk_idx), "chorus ", call,
                    ": topk_idx differs from the dispatch's (the handle's): combine sums the "
                    "rows of the dispatch's routing");
  check_arg(topk_weights, call, "topk_weights", at::kFloat, {handle.num_tokens, handle.topk});
  at::Tensor combined;
  if (out) {
    check_arg(*out, call, "out", x.scalar_type(), {handle.num_tokens, handle.hidden});
    combined = *out;
  } else {
    combined = at::empty({handle.num_tokens, handle.hidden}, x.options());
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  chorusEpHook_t hook = nullptr;
  state_->check_call(
      chorusEpLowLatencyCombine(live(call), handle.get(), x.data_ptr(),
                                x.scalar_type() == at::kFloat ? ncclFloat32 : ncclBfloat16,
                                topk_weights.data_ptr<float>(), combined.data_ptr(),
                                return_recv_hook, &hook),
      "chorusEpLowLatencyCombine");
  return {combined, make_hook(hook, {combined})};
}

void bind_ep(py::module_& m) {
  m.def(
      "ep_buffer_size_hint",
      [](int64_t num_ranks, int64_t max_tokens, int64_t hidden, int64_t topk) {
        size_t bytes = 0;
        const char* call = "get_buffer_size_hint";
        TORCH_CHECK_VALUE(max_tokens >= 0 && hidden >= 0, "chorus ", call,
                          ": max_tokens and hidden must be >= 0");
        check_ep(chorusEpBufferSizeHint(to_int(num_ranks, call, "num_ranks"),
                                        static_cast<size_t>(max_tokens),
                                        static_cast<size_t>(hidden), to_int(topk, call, "topk"),
                                        &bytes),
                 "chorusEpBufferSizeHint");
        return static_cast<int64_t>(bytes);
      },
      py::arg("num_ranks"), py::arg("max_tokens"), py::arg("hidden"), py::arg("topk"),
      "chorusEpBufferSizeHint: bytes for dispatches of up to max_tokens tokens per rank.");
  m.def(
      "ep_low_latency_size_hint",
      [](int64_t num_ranks, int64_t max_tokens, int64_t hidden, int64_t num_experts,
         int64_t topk) {
        size_t bytes = 0;
        const char* call = "get_low_latency_rdma_size_hint";
        TORCH_CHECK_VALUE(max_tokens >= 0 && hidden >= 0, "chorus ", call,
                          ": num_max_dispatch_tokens_per_rank and hidden must be >= 0");
        check_ep(chorusEpLowLatencySizeHint(
                     to_int(num_ranks, call, "num_ranks"), static_cast<size_t>(max_tokens),
                     static_cast<size_t>(hidden), to_int(num_experts, call, "num_experts"),
                     to_int(topk, call, "topk"), &bytes),
                 "chorusEpLowLatencySizeHint");
        return static_cast<int64_t>(bytes);
      },
      py::arg("num_ranks"), py::arg("max_tokens"), py::arg("hidden"), py::arg("num_experts"),
      py::arg("topk"),
      "chorusEpLowLatencySizeHint: bytes for low-latency calls of up to max_tokens tokens per "
      "rank, two in flight.");
  py::class_<EpHandle, std::shared_ptr<EpHandle>>(
      m, "EpHandle", "What combine needs of one dispatch (owns a chorusEpHandle_t).")
      .def_readonly("num_tokens", &EpHandle::num_tokens)
      .def_readonly("num_recv_tokens", &EpHandle::num_recv_tokens)
      .def_readonly("hidden", &EpHandle::hidden)
      .def_readonly("topk", &EpHandle::topk);
  py::class_<EpLowLatencyHandle, std::shared_ptr<EpLowLatencyHandle>>(
      m, "EpLowLatencyHandle",
      "What low_latency_combine needs of one low_latency_dispatch (owns a chorusEpHandle_t).")
      .def_readonly("num_tokens", &EpLowLatencyHandle::num_tokens)
      .def_readonly("topk", &EpLowLatencyHandle::topk)
      .def_readonly("hidden", &EpLowLatencyHandle::hidden)
      .def_readonly("num_experts", &EpLowLatencyHandle::num_experts)
      .def_readonly("num_local_experts", &EpLowLatencyHandle::num_local_experts)
      .def_readonly("num_max_dispatch_tokens_per_rank", &EpLowLatencyHandle::max_tokens);
  py::class_<EpEvent, std::shared_ptr<EpEvent>>(
      m, "EpEvent",
      "The work an asynchronous EP call (async_finish) queued: synchronize() waits for it (its "
      "outputs are then written) and raises its failure; query() is True once it is done.")
      .def("synchronize", &EpEvent::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("query", &EpEvent::query, py::call_guard<py::gil_scoped_release>());
  py::class_<EpHook, std::shared_ptr<EpHook>>(
      m, "EpHook",
      "DeepEP's recv hook: calling it waits for the call's data and writes its outputs "
      "(chorusEpHookWait); later calls do nothing.")
      .def("__call__", &EpHook::operator(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("done", &EpHook::done, py::call_guard<py::gil_scoped_release>());
  py::class_<EpBuffer>(m, "EpBuffer",
                       "An EP buffer (<chorus/ep.h>) on a communicator split from a chorus group.")
      .def(py::init<const c10::intrusive_ptr<ProcessGroupChorus>&, int64_t>(), py::arg("group"),
           py::arg("num_bytes"), py::call_guard<py::gil_scoped_release>())
      .def("destroy", &EpBuffer::destroy, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &EpBuffer::rank)
      .def_property_readonly("num_ranks", &EpBuffer::num_ranks)
      .def_property_readonly("num_bytes", &EpBuffer::num_bytes)
      .def("get_dispatch_layout", &EpBuffer::get_dispatch_layout, py::arg("topk_idx"),
           py::arg("num_experts"), py::call_guard<py::gil_scoped_release>())
      .def("dispatch", &EpBuffer::dispatch, py::arg("x"), py::arg("x_scales"), py::arg("topk_idx"),
           py::arg("topk_weights"), py::arg("num_tokens_per_rank"), py::arg("is_token_in_rank"),
           py::arg("num_tokens_per_expert"), py::arg("expert_alignment"),
           py::arg("previous_event"), py::arg("async_finish"),
           py::call_guard<py::gil_scoped_release>())
      .def("combine", &EpBuffer::combine, py::arg("x"), py::arg("handle"),
           py::arg("topk_weights"), py::arg("previous_event"), py::arg("async_finish"),
           py::call_guard<py::gil_scoped_release>())
      .def("low_latency_dispatch", &EpBuffer::low_latency_dispatch, py::arg("x"),
           py::arg("topk_idx"), py::arg("num_max_dispatch_tokens_per_rank"),
           py::arg("num_experts"), py::arg("use_fp8"), py::arg("round_scale"),
           py::arg("use_ue8m0"), py::arg("return_recv_hook"),
           py::call_guard<py::gil_scoped_release>())
      .def("low_latency_combine", &EpBuffer::low_latency_combine, py::arg("x"),
           py::arg("topk_idx"), py::arg("topk_weights"), py::arg("handle"),
           py::arg("return_recv_hook"), py::arg("out"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace chorus::torch_backend
