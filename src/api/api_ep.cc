// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_ep.cc
// The MoE expert-parallel entry points (include/chorus/ep.h): handles and the checks of the
// arguments that need no data; routing, agreement and the transfers are src/ep/.
#include <chorus/ep.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "api/api_util.h"
#include "ep/buffer.h"
#include "ep/low_latency.h"
#include "ep/routing.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

namespace {

constexpr int kMaxTopk = 1024;

// Live buffers and handles: a pointer is valid while it is in here.
std::mutex g_mutex;
std::unordered_map<chorusEpBuffer_t, std::shared_ptr<ep::Buffer>>& buffers() {
  static auto* map = new std::unordered_map<chorusEpBuffer_t, std::shared_ptr<ep::Buffer>>();
  return *map;
}
std::unordered_map<chorusEpHandle_t, std::shared_ptr<ep::Handle>>& handles() {
  static auto* map = new std::unordered_map<chorusEpHandle_t, std::shared_ptr<ep::Handle>>();
  return *map;
}

// Low-latency handles (chorusEpHandle_t too) and hooks.
std::unordered_map<chorusEpHandle_t, std::shared_ptr<ep::LowLatencyHandle>>& ll_handles() {
  static auto* map =
      new std::unordered_map<chorusEpHandle_t, std::shared_ptr<ep::LowLatencyHandle>>();
  return *map;
}
std::unordered_map<chorusEpHook_t, std::unique_ptr<ep::LowLatencyCall>>& hooks() {
  static auto* map = new std::unordered_map<chorusEpHook_t, std::unique_ptr<ep::LowLatencyCall>>();
  return *map;
}

Result<std::shared_ptr<ep::Buffer>> find_buffer(chorusEpBuffer_t handle) {
  if (handle == nullptr) return invalid_argument("buffer is NULL");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = buffers().find(handle);
  if (it == buffers().end())
    return invalid_argument("buffer {} is not a live chorusEpBuffer_t (destroyed?)",
                            static_cast<void*>(handle));
  return it->second;
}

Result<std::shared_ptr<ep::Handle>> find_handle(chorusEpHandle_t handle) {
  if (handle == nullptr) return invalid_argument("handle is NULL");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = handles().find(handle);
  if (it != handles().end()) return it->second;
  if (ll_handles().count(handle) != 0)
    return invalid_argument(
        "handle {} comes from a low-latency dispatch (chorusEpLowLatencyDispatch)",
        static_cast<void*>(handle));
  return invalid_argument("handle {} is not a live chorusEpHandle_t (destroyed?)",
                          static_cast<void*>(handle));
}

Result<std::shared_ptr<ep::LowLatencyHandle>> find_ll_handle(chorusEpHandle_t handle) {
  if (handle == nullptr) return invalid_argument("handle is NULL");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = ll_handles().find(handle);
  if (it != ll_handles().end()) return it->second;
  if (handles().count(handle) != 0)
    return invalid_argument("handle {} comes from a normal-mode dispatch (chorusEpDispatch)",
                            static_cast<void*>(handle));
  return invalid_argument("handle {} is not a live chorusEpHandle_t (destroyed?)",
                          static_cast<void*>(handle));
}

// Normal-mode calls share the staging area with low-latency calls in flight.
Status check_no_hook(const ep::Buffer& b) {
  if (b.any_slot_taken())
    return invalid_usage(
        "a low-latency call on this buffer is in flight (its hook not waited): normal-mode calls "
        "share its memory");
  return Status();
}

Status check_topk(int topk) {
  if (topk < 1 || topk > kMaxTopk)
    return invalid_argument("topk is {}: it must be in [1, {}]", topk, kMaxTopk);
  return Status();
}

// The checks that need no token data; the routing table is checked while routing.
Status check_dispatch(const ep::Buffer& b, const chorusEpDispatchArgs_t& a, int datatype,
                      const chorusEpDispatchOutput_t& out) {
  if (datatype != ncclFloat32 && datatype != ncclBfloat16 && datatype != ncclFloat8e4m3)
    return invalid_argument(
        "datatype {} is not supported by dispatch (ncclFloat32, ncclBfloat16 or ncclFloat8e4m3)",
        datatype);
  CHORUS_RETURN_IF_ERROR(check_topk(a.topk));
  CHORUS_RETURN_IF_ERROR(ep::check_experts(a.numExperts, b.nranks()));
  if (a.hidden == 0) return invalid_argument("hidden is 0");
  if (datatype == ncclFloat8e4m3 && a.hidden % CHORUS_EP_FP8_BLOCK != 0)
    return invalid_argument(
        "hidden {} is not a multiple of {}: FP8 tokens carry one scale per {} channels", a.hidden,
        CHORUS_EP_FP8_BLOCK, CHORUS_EP_FP8_BLOCK);
  if (a.numTokens > static_cast<size_t>(INT32_MAX))
    return invalid_argument("numTokens {} is more than {}", a.numTokens, INT32_MAX);
  if (a.hidden > (size_t{1} << 30))
    return invalid_argument("hidden {} is more than 2^30", a.hidden);
  if (a.expertAlignment < 1)
    return invalid_argument("expertAlignment is {}: it must be >= 1", a.expertAlignment);
  const bool fp8 = datatype == ncclFloat8e4m3;
  if (a.numTokens > 0 && (a.x == nullptr || a.topkIdx == nullptr))
    return invalid_argument("x or topkIdx is NULL with {} tokens", a.numTokens);
  if (a.numTokens > 0 && fp8 && a.xScales == nullptr)
    return invalid_argument("xScales is NULL with FP8 tokens");
  // With an allocate callback the output arrays are not read on entry (its outputs are checked
  // when it returns, in ep::Buffer::dispatch).
  const bool given = out.allocate == nullptr;
  if (!fp8 && (a.xScales != nullptr || (given && out.recvXScales != nullptr)))
    return invalid_argument(
        "xScales / recvXScales are for FP8 tokens only: pass NULL with datatype {}", datatype);
  const bool layout = a.numTokensPerRank != nullptr || a.numTokensPerExpert != nullptr ||
                      a.isTokenInRank != nullptr;
  if (layout && (a.numTokensPerRank == nullptr || a.numTokensPerExpert == nullptr ||
                 (a.isTokenInRank == nullptr && a.numTokens > 0)))
    return invalid_argument(
        "pass all three of numTokensPerRank, numTokensPerExpert and isTokenInRank, or none");
  if (given && out.recvCapacity > 0 && out.recvX == nullptr)
    return invalid_argument("recvX is NULL");
  if (given && out.recvCapacity > 0 && fp8 && out.recvXScales == nullptr)
    return invalid_argument("recvXScales is NULL with FP8 tokens");
  return Status();
}

// The low-latency dispatch checks that need no token data.
Status check_ll_dispatch(const ep::Buffer& b, const chorusEpLowLatencyDispatchArgs_t& a,
                         int datatype, const chorusEpLowLatencyDispatchOutput_t& out) {
  if (datatype != ncclFloat32 && datatype != ncclBfloat16)
    return invalid_argument(
        "datatype {} is not supported by low-latency dispatch (ncclBfloat16 or ncclFloat32)",
        datatype);
  CHORUS_RETURN_IF_ERROR(check_topk(a.topk));
  CHORUS_RETURN_IF_ERROR(ep::check_experts(a.numExperts, b.nranks()));
  if (a.hidden == 0 || a.hidden > (size_t{1} << 30))
    return invalid_argument("hidden {} is not in [1, 2^30]", a.hidden);
  if (a.maxTokensPerRank == 0 || a.maxTokensPerRank > static_cast<size_t>(INT32_MAX))
    return invalid_argument("maxTokensPerRank {} is not in [1, {}]", a.maxTokensPerRank, INT32_MAX);
  if (a.numTokens > a.maxTokensPerRank)
    return invalid_argument("numTokens {} is more than maxTokensPerRank {}", a.numTokens,
                            a.maxTokensPerRank);
  const bool fp8 = a.useFp8 != 0;
  if (fp8 && a.hidden % CHORUS_EP_FP8_BLOCK != 0)
    return invalid_argument(
        "hidden {} is not a multiple of {}: FP8 tokens carry one scale per {} channels", a.hidden,
        CHORUS_EP_FP8_BLOCK, CHORUS_EP_FP8_BLOCK);
  if (!fp8 && (a.roundScale != 0 || a.useUe8m0 != 0))
    return invalid_argument("roundScale and useUe8m0 apply to FP8 only (useFp8 is 0)");
  if (a.numTokens > 0 && (a.x == nullptr || a.topkIdx == nullptr))
    return invalid_argument("x or topkIdx is NULL with {} tokens", a.numTokens);
  if (out.recvX == nullptr || out.recvCount == nullptr)
    return invalid_argument("recvX or recvCount is NULL");
  if (fp8 != (out.recvXScales != nullptr))
    return invalid_argument("recvXScales must be given with useFp8, and only then");
  return Status();
}

}  // namespace

CHORUS_API ncclResult_t chorusEpBufferSizeHint(int nranks, size_t maxTokens, size_t hidden,
                                               int topk, size_t* bytes) {
  return guard("chorusEpBufferSizeHint", [&]() -> Status {
    if (bytes == nullptr) return invalid_argument("bytes is NULL");
    if (nranks < 1) return invalid_argument("nranks is {}", nranks);
    CHORUS_RETURN_IF_ERROR(check_topk(topk));
    if (hidden == 0 || hidden > (size_t{1} << 30))
      return invalid_argument("hidden {} is not in [1, 2^30]", hidden);
    if (maxTokens > static_cast<size_t>(INT32_MAX))
      return invalid_argument("maxTokens {} is more than {}", maxTokens, INT32_MAX);
    CHORUS_ASSIGN_OR_RETURN(*bytes, ep::Buffer::size_hint(nranks, maxTokens, hidden, topk));
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpBufferCreate(ncclComm_t comm, size_t bytes,
                                             chorusEpBuffer_t* buffer) {
  return guard("chorusEpBufferCreate", [&]() -> Status {
    if (buffer == nullptr) return invalid_argument("buffer is NULL");
    *buffer = nullptr;
    CHORUS_RETURN_IF_ERROR(usable_comm(comm).status());
    CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<ep::Buffer> b, ep::Buffer::create(comm, bytes));
    auto handle = reinterpret_cast<chorusEpBuffer_t>(b.get());
    std::lock_guard<std::mutex> lock(g_mutex);
    buffers()[handle] = std::shared_ptr<ep::Buffer>(std::move(b));
    *buffer = handle;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpBufferDestroy(chorusEpBuffer_t buffer) {
  return guard("chorusEpBufferDestroy", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    b->drain();  // what an asynchronous call queued is done before the memory goes
    std::lock_guard<std::mutex> lock(g_mutex);
    buffers().erase(buffer);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpGetDispatchLayout(chorusEpBuffer_t buffer, const int64_t* topkIdx,
                                                  size_t numTokens, int topk, int numExperts,
                                                  int* numTokensPerRank, int* numTokensPerExpert,
                                                  uint8_t* isTokenInRank) {
  return guard("chorusEpGetDispatchLayout", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    CHORUS_RETURN_IF_ERROR(check_topk(topk));
    CHORUS_RETURN_IF_ERROR(ep::check_experts(numExperts, b->nranks()));
    if (numTokens > static_cast<size_t>(INT32_MAX))
      return invalid_argument("numTokens {} is more than {}", numTokens, INT32_MAX);
    if (numTokens > 0 && topkIdx == nullptr)
      return invalid_argument("topkIdx is NULL with {} tokens", numTokens);
    CHORUS_ASSIGN_OR_RETURN(ep::Routing r,
                            ep::route(topkIdx, numTokens, topk, numExperts, b->nranks()));
    if (numTokensPerRank != nullptr)
      std::copy(r.per_rank.begin(), r.per_rank.end(), numTokensPerRank);
    if (numTokensPerExpert != nullptr)
      std::copy(r.per_expert.begin(), r.per_expert.end(), numTokensPerExpert);
    if (isTokenInRank != nullptr) std::copy(r.in_rank.begin(), r.in_rank.end(), isTokenInRank);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpDispatchAsync(chorusEpBuffer_t buffer,
                                              const chorusEpDispatchArgs_t* args,
                                              chorusEpDispatchOutput_t* out,
                                              chorusEpHandle_t* handle, cudaStream_t stream) {
  return guard("chorusEpDispatch", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    // A bad stream is refused on this rank after the agreement, like every other argument.
    auto s = find_stream(stream);
    Status st = s.status();
    if (st.ok() && (args == nullptr || out == nullptr || handle == nullptr))
      st = invalid_argument("args, out or handle is NULL");
    if (handle != nullptr) *handle = nullptr;
    const chorusEpDispatchArgs_t a = args != nullptr ? *args : chorusEpDispatchArgs_t{};
    chorusEpDispatchOutput_t dummy{};
    chorusEpDispatchOutput_t& o = out != nullptr ? *out : dummy;
    const int datatype = enum_bits(a.datatype);
    if (st.ok()) st = check_dispatch(*b, a, datatype, o);
    if (st.ok()) st = check_no_hook(*b);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<ep::Handle> h,
                            b->dispatch(a, datatype, o, std::move(st), s.ok() ? s.value() : nullptr));
    auto key = reinterpret_cast<chorusEpHandle_t>(h.get());
    std::lock_guard<std::mutex> lock(g_mutex);
    handles()[key] = std::move(h);
    *handle = key;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpDispatch(chorusEpBuffer_t buffer,
                                         const chorusEpDispatchArgs_t* args,
                                         chorusEpDispatchOutput_t* out, chorusEpHandle_t* handle) {
  return chorusEpDispatchAsync(buffer, args, out, handle, nullptr);
}

CHORUS_API ncclResult_t chorusEpCombineAsync(chorusEpBuffer_t buffer, chorusEpHandle_t handle,
                                             const void* x, ncclDataType_t datatype,
                                             const float* topkWeights, void* combinedX,
                                             float* combinedTopkWeights, cudaStream_t stream) {
  return guard("chorusEpCombine", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    // A bad handle or stream is refused on this rank after the agreement, like every other
    // argument.
    auto s = find_stream(stream);
    auto found = find_handle(handle);
    Status st = s.ok() ? found.status() : s.status();
    const int dtype = enum_bits(datatype);
    std::shared_ptr<const ep::Handle> h;
    if (found.ok()) h = found.value();
    if (st.ok() && h->buffer_id != b->id())
      st = invalid_argument("handle {} comes from the dispatch of another buffer",
                            static_cast<void*>(handle));
    if (st.ok() && dtype != ncclFloat32 && dtype != ncclBfloat16)
      st = invalid_argument("datatype {} is not supported by combine (ncclFloat32 or ncclBfloat16)",
                            dtype);
    if (st.ok()) st = check_no_hook(*b);
    if (st.ok() && h->num_recv_tokens > 0 && x == nullptr)
      st = invalid_argument("x is NULL with {} received tokens", h->num_recv_tokens);
    if (st.ok() && h->num_tokens > 0 && combinedX == nullptr)
      st = invalid_argument("combinedX is NULL with {} tokens", h->num_tokens);
    // Weights travel if either array is given; an array of no rows may be NULL.
    const bool weights = topkWeights != nullptr || combinedTopkWeights != nullptr;
    if (st.ok() && weights && h->num_recv_tokens > 0 && topkWeights == nullptr)
      st = invalid_argument(
          "combinedTopkWeights is given but topkWeights is NULL with {} received tokens",
          h->num_recv_tokens);
    if (st.ok() && weights && h->num_tokens > 0 && combinedTopkWeights == nullptr)
      st = invalid_argument("topkWeights is given but combinedTopkWeights is NULL with {} tokens",
                            h->num_tokens);
    if (!st.ok()) {
      auto empty = std::make_shared<ep::Handle>();
      empty->send_offset.assign(static_cast<size_t>(b->nranks()) + 1, 0);
      empty->recv_offset = empty->send_offset;
      return b->combine(std::move(empty), nullptr, dtype, false, nullptr, nullptr, nullptr,
                        std::move(st), nullptr);
    }
    return b->combine(std::move(h), x, dtype, weights, topkWeights, combinedX, combinedTopkWeights,
                      Status(), s.value());
  });
}

CHORUS_API ncclResult_t chorusEpCombine(chorusEpBuffer_t buffer, chorusEpHandle_t handle,
                                        const void* x, ncclDataType_t datatype,
                                        const float* topkWeights, void* combinedX,
                                        float* combinedTopkWeights) {
  return chorusEpCombineAsync(buffer, handle, x, datatype, topkWeights, combinedX,
                              combinedTopkWeights, nullptr);
}

CHORUS_API ncclResult_t chorusEpHandleDestroy(chorusEpHandle_t handle) {
  return guard("chorusEpHandleDestroy", [&]() -> Status {
    if (handle == nullptr) return Status();  // as free(NULL) (ep.h)
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (ll_handles().erase(handle) != 0) return Status();
    }
    CHORUS_ASSIGN_OR_RETURN(auto h, find_handle(handle));
    std::lock_guard<std::mutex> lock(g_mutex);
    handles().erase(handle);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpLowLatencySizeHint(int nranks, size_t maxTokensPerRank,
                                                   size_t hidden, int numExperts, int topk,
                                                   size_t* bytes) {
  return guard("chorusEpLowLatencySizeHint", [&]() -> Status {
    if (bytes == nullptr) return invalid_argument("bytes is NULL");
    if (nranks < 1) return invalid_argument("nranks is {}", nranks);
    CHORUS_RETURN_IF_ERROR(check_topk(topk));
    CHORUS_RETURN_IF_ERROR(ep::check_experts(numExperts, nranks));
    if (hidden == 0 || hidden > (size_t{1} << 30))
      return invalid_argument("hidden {} is not in [1, 2^30]", hidden);
    if (maxTokensPerRank == 0 || maxTokensPerRank > static_cast<size_t>(INT32_MAX))
      return invalid_argument("maxTokensPerRank {} is not in [1, {}]", maxTokensPerRank, INT32_MAX);
    CHORUS_ASSIGN_OR_RETURN(
        *bytes, ep::low_latency_size_hint(nranks, maxTokensPerRank, hidden, numExperts, topk));
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpLowLatencyDispatch(chorusEpBuffer_t buffer,
                                                   const chorusEpLowLatencyDispatchArgs_t* args,
                                                   chorusEpLowLatencyDispatchOutput_t* out,
                                                   int returnRecvHook, chorusEpHandle_t* handle,
                                                   chorusEpHook_t* hook) {
  return guard("chorusEpLowLatencyDispatch", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    b->drain();  // a normal-mode call's queued work uses the same memory
    Status st;
    if (args == nullptr || out == nullptr || handle == nullptr)
      st = invalid_argument("args, out or handle is NULL");
    else if (returnRecvHook != 0 && hook == nullptr)
      st = invalid_argument("hook is NULL with returnRecvHook");
    if (handle != nullptr) *handle = nullptr;
    if (hook != nullptr) *hook = nullptr;
    const chorusEpLowLatencyDispatchArgs_t a =
        args != nullptr ? *args : chorusEpLowLatencyDispatchArgs_t{};
    const chorusEpLowLatencyDispatchOutput_t o =
        out != nullptr ? *out : chorusEpLowLatencyDispatchOutput_t{};
    const int datatype = enum_bits(a.datatype);
    if (st.ok()) st = check_ll_dispatch(*b, a, datatype, o);
    std::shared_ptr<ep::LowLatencyHandle> h;
    std::unique_ptr<ep::LowLatencyCall> call;
    CHORUS_RETURN_IF_ERROR(ep::low_latency_dispatch(b, a, datatype, o, std::move(st), &h, &call));
    // Blocking, the handle is handed out only once the outputs are complete.
    if (returnRecvHook == 0) CHORUS_RETURN_IF_ERROR(call->complete());
    auto key = reinterpret_cast<chorusEpHandle_t>(h.get());
    std::lock_guard<std::mutex> lock(g_mutex);
    ll_handles()[key] = std::move(h);
    *handle = key;
    if (returnRecvHook != 0) {
      *hook = reinterpret_cast<chorusEpHook_t>(call.get());
      hooks()[*hook] = std::move(call);
    }
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpLowLatencyCombine(chorusEpBuffer_t buffer, chorusEpHandle_t handle,
                                                  const void* x, ncclDataType_t datatype,
                                                  const float* topkWeights, void* combinedX,
                                                  int returnRecvHook, chorusEpHook_t* hook) {
  return guard("chorusEpLowLatencyCombine", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    b->drain();  // a normal-mode call's queued work uses the same memory
    if (hook != nullptr) *hook = nullptr;
    // A bad handle is refused on this rank after the agreement, like every other argument.
    auto found = find_ll_handle(handle);
    Status st = found.status();
    std::shared_ptr<ep::LowLatencyHandle> h = found.ok() ? found.value() : nullptr;
    const int dtype = enum_bits(datatype);
    if (st.ok() && h->buffer_id != b->id())
      st = invalid_argument("handle {} comes from the dispatch of another buffer",
                            static_cast<void*>(handle));
    if (st.ok() && !h->complete)
      st = invalid_usage("handle {}: its dispatch's hook has not been waited",
                         static_cast<void*>(handle));
    if (st.ok() && dtype != ncclFloat32 && dtype != ncclBfloat16)
      st = invalid_argument(
          "datatype {} is not supported by low-latency combine (ncclBfloat16 or ncclFloat32)",
          dtype);
    if (st.ok() && !h->recv_rows.empty() && x == nullptr)
      st = invalid_argument("x is NULL with {} rows received", h->recv_rows.size());
    if (st.ok() && h->num_tokens > 0 && (topkWeights == nullptr || combinedX == nullptr))
      st = invalid_argument("topkWeights or combinedX is NULL with {} tokens", h->num_tokens);
    if (st.ok() && returnRecvHook != 0 && hook == nullptr)
      st = invalid_argument("hook is NULL with returnRecvHook");
    std::unique_ptr<ep::LowLatencyCall> call;
    CHORUS_RETURN_IF_ERROR(
        ep::low_latency_combine(b, h, x, dtype, topkWeights, combinedX, std::move(st), &call));
    if (returnRecvHook == 0) return call->complete();
    *hook = reinterpret_cast<chorusEpHook_t>(call.get());
    std::lock_guard<std::mutex> lock(g_mutex);
    hooks()[*hook] = std::move(call);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpHookWait(chorusEpHook_t hook) {
  return guard("chorusEpHookWait", [&]() -> Status {
    if (hook == nullptr) return invalid_argument("hook is NULL");
    std::unique_ptr<ep::LowLatencyCall> call;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      auto it = hooks().find(hook);
      if (it == hooks().end())
        return invalid_argument("hook {} is not a live chorusEpHook_t (waited already?)",
                                static_cast<void*>(hook));
      call = std::move(it->second);
      hooks().erase(it);
    }
    return call->complete();
  });
}
