// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/ep.cc
#include "ep.h"

#include <chorus/ep.h>
#include <torch/python.h>

#include <ATen/ATen.h>
#include <cstdint>
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

// Throws Chorus's error for a failed EP call: the result and ncclGetLastError's text (the
// calling thread's last error, which names the token, the rank or the size needed).
void check_ep(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  const std::string detail = ncclGetLastError(nullptr);
  throw std::runtime_error(std::string("chorus: ") + what + " failed: " + ncclGetErrorString(r) +
                           (detail.empty() ? "" : ": " + detail));
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

// recv_x, recv_x_scales (FP8), recv_topk_idx, recv_topk_weights (when topk_weights were
// given), num_recv_tokens_per_expert, handle.
using DispatchResult =
    std::tuple<at::Tensor, c10::optional<at::Tensor>, at::Tensor, c10::optional<at::Tensor>,
               std::vector<int64_t>, std::shared_ptr<EpHandle>>;

class EpBuffer {
 public:
  EpBuffer(const c10::intrusive_ptr<ProcessGroupChorus>& group, int64_t bytes);
  ~EpBuffer() { destroy(); }
  EpBuffer(const EpBuffer&) = delete;
  EpBuffer& operator=(const EpBuffer&) = delete;

  // Frees the staging memory and the communicator; later calls raise. Local, idempotent.
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
                          const at::Tensor& num_tokens_per_expert, int64_t expert_alignment);
  std::tuple<at::Tensor, c10::optional<at::Tensor>> combine(
      const at::Tensor& x, const EpHandle& handle, const c10::optional<at::Tensor>& topk_weights);

 private:
  // The live buffer (under mu_), or a ValueError naming `call`.
  chorusEpBuffer_t live(const char* call) const;
  // check_ep, remembering a failure that broke the communicator (not an argument refusal).
  void check_call(ncclResult_t r, const char* what);
  // Rows arriving at this rank: every rank's count of its tokens bound here, summed by one
  // ncclReduceScatter. A rank whose topk_idx does not route announces none; its dispatch is
  // then refused on every rank by the C API, with its reason.
  size_t count_arrivals(const at::Tensor& topk_idx, int num_experts);

  c10::intrusive_ptr<ProcessGroupChorus> group_;  // held while comm_, split from it, lives
  int rank_ = 0;
  int nranks_ = 0;
  int64_t bytes_ = 0;
  std::mutex mu_;  // one call at a time, and destroy
  ncclComm_t comm_ = nullptr;
  chorusEpBuffer_t buffer_ = nullptr;
  bool broken_ = false;  // a call failed mid-way: destroy aborts comm_
};

EpBuffer::EpBuffer(const c10::intrusive_ptr<ProcessGroupChorus>& group, int64_t bytes)
    : group_(group), rank_(group->getRank()), nranks_(group->getSize()), bytes_(bytes) {
  TORCH_CHECK_VALUE(bytes > 0, "chorus Buffer: num_bytes is ", bytes,
                    " (Buffer.get_buffer_size_hint gives the size)");
  comm_ = group_->split_comm("EP buffer");
  try {
    check_ep(chorusEpBufferCreate(comm_, static_cast<size_t>(bytes), &buffer_),
             "chorusEpBufferCreate");
  } catch (...) {
    ncclCommDestroy(comm_);
    throw;
  }
}

void EpBuffer::destroy() {
  std::lock_guard<std::mutex> lock(mu_);
  if (buffer_ == nullptr) return;
  chorusEpBufferDestroy(buffer_);
  buffer_ = nullptr;
  broken_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
  comm_ = nullptr;
  group_.reset();
}

chorusEpBuffer_t EpBuffer::live(const char* call) const {
  TORCH_CHECK_VALUE(buffer_ != nullptr, "chorus ", call, ": the Buffer was destroyed");
  return buffer_;
}

void EpBuffer::check_call(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInvalidArgument && r != ncclInvalidUsage) broken_ = true;
  check_ep(r, what);
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
  std::lock_guard<std::mutex> lock(mu_);
  // isTokenInRank's 0/1 bytes are valid torch bools.
  check_call(chorusEpGetDispatchLayout(live(call), topk_idx.data_ptr<int64_t>(),
                                       static_cast<size_t>(tokens),
                                       to_int(topk_idx.size(1), call, "topk"), experts,
                                       per_rank.data_ptr<int>(), per_expert.data_ptr<int>(),
                                       reinterpret_cast<uint8_t*>(in_rank.data_ptr<bool>())),
             "chorusEpGetDispatchLayout");
  return {per_rank, per_expert, in_rank};
}

size_t EpBuffer::count_arrivals(const at::Tensor& topk_idx, int num_experts) {
  std::vector<int> per_rank(static_cast<size_t>(nranks_), 0);
  const ncclResult_t routed = chorusEpGetDispatchLayout(
      buffer_, topk_idx.data_ptr<int64_t>(), static_cast<size_t>(topk_idx.size(0)),
      static_cast<int>(topk_idx.size(1)), num_experts, per_rank.data(), nullptr, nullptr);
  std::vector<int64_t> counts(per_rank.size(), 0);
  if (routed == ncclSuccess) counts.assign(per_rank.begin(), per_rank.end());
  int64_t arriving = 0;
  check_call(ncclReduceScatter(counts.data(), &arriving, 1, ncclInt64, ncclSum, comm_, nullptr),
             "ncclReduceScatter (EP receive counts)");
  return static_cast<size_t>(arriving);
}

DispatchResult EpBuffer::dispatch(const at::Tensor& x, const c10::optional<at::Tensor>& x_scales,
                                  const at::Tensor& topk_idx,
                                  const c10::optional<at::Tensor>& topk_weights,
                                  const at::Tensor& num_tokens_per_rank,
                                  const at::Tensor& is_token_in_rank,
                                  const at::Tensor& num_tokens_per_expert,
                                  int64_t expert_alignment) {
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

  std::lock_guard<std::mutex> lock(mu_);
  live(call);
  // Outputs of exactly the rows that arrive (see count_arrivals).
  const auto rows = static_cast<int64_t>(count_arrivals(topk_idx, experts));
  const int64_t local_experts = nranks_ > 0 && experts % nranks_ == 0 ? experts / nranks_ : 0;
  at::Tensor recv_x = at::empty({rows, hidden}, x.options());
  c10::optional<at::Tensor> recv_scales;
  if (x_scales) recv_scales = at::empty({rows, hidden / CHORUS_EP_FP8_BLOCK}, at::kFloat);
  at::Tensor recv_idx = at::empty({rows, topk}, at::kLong);
  c10::optional<at::Tensor> recv_weights;
  if (topk_weights) recv_weights = at::empty({rows, topk}, at::kFloat);
  std::vector<int> per_expert(static_cast<size_t>(local_experts), 0);

  chorusEpDispatchOutput_t out{};
  out.recvX = recv_x.data_ptr();
  out.recvXScales = recv_scales ? recv_scales->data_ptr<float>() : nullptr;
  out.recvTopkIdx = recv_idx.data_ptr<int64_t>();
  out.recvTopkWeights = recv_weights ? recv_weights->data_ptr<float>() : nullptr;
  out.recvCapacity = static_cast<size_t>(rows);
  out.numRecvTokensPerExpert = per_expert.data();
  chorusEpHandle_t raw = nullptr;
  check_call(chorusEpDispatch(buffer_, &args, &out, &raw), "chorusEpDispatch");
  auto handle = std::make_shared<EpHandle>(raw, tokens, static_cast<int64_t>(out.numRecvTokens),
                                           hidden, topk);
  TORCH_INTERNAL_ASSERT(out.numRecvTokens == static_cast<size_t>(rows), "chorus dispatch: ",
                        out.numRecvTokens, " tokens arrived, ", rows, " were announced");
  return {recv_x, recv_scales, recv_idx, recv_weights,
          std::vector<int64_t>(per_expert.begin(), per_expert.end()), handle};
}

std::tuple<at::Tensor, c10::optional<at::Tensor>> EpBuffer::combine(
    const at::Tensor& x, const EpHandle& handle, const c10::optional<at::Tensor>& topk_weights) {
  const char* call = "combine";
  const ncclDataType_t type = row_type(x, false, call);
  check_arg(x, call, "x", x.scalar_type(), {handle.num_recv_tokens, handle.hidden});
  if (topk_weights)
    check_arg(*topk_weights, call, "topk_weights", at::kFloat,
              {handle.num_recv_tokens, handle.topk});
  at::Tensor combined = at::empty({handle.num_tokens, handle.hidden}, x.options());
  c10::optional<at::Tensor> combined_weights;
  if (topk_weights) combined_weights = at::empty({handle.num_tokens, handle.topk}, at::kFloat);
  std::lock_guard<std::mutex> lock(mu_);
  check_call(chorusEpCombine(live(call), handle.get(), x.data_ptr(), type,
                             topk_weights ? topk_weights->data_ptr<float>() : nullptr,
                             combined.data_ptr(),
                             combined_weights ? combined_weights->data_ptr<float>() : nullptr),
             "chorusEpCombine");
  return {combined, combined_weights};
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
  py::class_<EpHandle, std::shared_ptr<EpHandle>>(
      m, "EpHandle", "What combine needs of one dispatch (owns a chorusEpHandle_t).")
      .def_readonly("num_tokens", &EpHandle::num_tokens)
      .def_readonly("num_recv_tokens", &EpHandle::num_recv_tokens)
      .def_readonly("hidden", &EpHandle::hidden)
      .def_readonly("topk", &EpHandle::topk);
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
           py::call_guard<py::gil_scoped_release>())
      .def("combine", &EpBuffer::combine, py::arg("x"), py::arg("handle"),
           py::arg("topk_weights"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace chorus::torch_backend
