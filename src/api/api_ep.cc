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
  if (it == handles().end())
    return invalid_argument("handle {} is not a live chorusEpHandle_t (destroyed?)",
                            static_cast<void*>(handle));
  return it->second;
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
  if (!fp8 && (a.xScales != nullptr || out.recvXScales != nullptr))
    return invalid_argument(
        "xScales / recvXScales are for FP8 tokens only: pass NULL with datatype {}", datatype);
  const bool layout = a.numTokensPerRank != nullptr || a.numTokensPerExpert != nullptr ||
                      a.isTokenInRank != nullptr;
  if (layout && (a.numTokensPerRank == nullptr || a.numTokensPerExpert == nullptr ||
                 (a.isTokenInRank == nullptr && a.numTokens > 0)))
    return invalid_argument(
        "pass all three of numTokensPerRank, numTokensPerExpert and isTokenInRank, or none");
  if (out.recvCapacity > 0 && out.recvX == nullptr) return invalid_argument("recvX is NULL");
  if (out.recvCapacity > 0 && fp8 && out.recvXScales == nullptr)
    return invalid_argument("recvXScales is NULL with FP8 tokens");
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

CHORUS_API ncclResult_t chorusEpDispatch(chorusEpBuffer_t buffer,
                                         const chorusEpDispatchArgs_t* args,
                                         chorusEpDispatchOutput_t* out, chorusEpHandle_t* handle) {
  return guard("chorusEpDispatch", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    Status st;
    if (args == nullptr || out == nullptr || handle == nullptr)
      st = invalid_argument("args, out or handle is NULL");
    if (handle != nullptr) *handle = nullptr;
    const chorusEpDispatchArgs_t a = args != nullptr ? *args : chorusEpDispatchArgs_t{};
    chorusEpDispatchOutput_t dummy{};
    chorusEpDispatchOutput_t& o = out != nullptr ? *out : dummy;
    const int datatype = enum_bits(a.datatype);
    if (st.ok()) st = check_dispatch(*b, a, datatype, o);
    CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<ep::Handle> h,
                            b->dispatch(a, datatype, o, std::move(st)));
    auto key = reinterpret_cast<chorusEpHandle_t>(h.get());
    std::lock_guard<std::mutex> lock(g_mutex);
    handles()[key] = std::shared_ptr<ep::Handle>(std::move(h));
    *handle = key;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEpCombine(chorusEpBuffer_t buffer, chorusEpHandle_t handle,
                                        const void* x, ncclDataType_t datatype,
                                        const float* topkWeights, void* combinedX,
                                        float* combinedTopkWeights) {
  return guard("chorusEpCombine", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto b, find_buffer(buffer));
    // A bad handle is refused on this rank after the agreement, like every other argument.
    auto found = find_handle(handle);
    Status st = found.status();
    const int dtype = enum_bits(datatype);
    ep::Handle none;
    const ep::Handle& h = found.ok() ? *found.value() : none;
    if (st.ok() && h.buffer_id != b->id())
      st = invalid_argument("handle {} comes from the dispatch of another buffer",
                            static_cast<void*>(handle));
    if (st.ok() && dtype != ncclFloat32 && dtype != ncclBfloat16)
      st = invalid_argument("datatype {} is not supported by combine (ncclFloat32 or ncclBfloat16)",
                            dtype);
    if (st.ok() && h.num_recv_tokens > 0 && x == nullptr)
      st = invalid_argument("x is NULL with {} received tokens", h.num_recv_tokens);
    if (st.ok() && h.num_tokens > 0 && combinedX == nullptr)
      st = invalid_argument("combinedX is NULL with {} tokens", h.num_tokens);
    // Weights travel if either array is given; an array of no rows may be NULL.
    const bool weights = topkWeights != nullptr || combinedTopkWeights != nullptr;
    if (st.ok() && weights && h.num_recv_tokens > 0 && topkWeights == nullptr)
      st = invalid_argument(
          "combinedTopkWeights is given but topkWeights is NULL with {} received tokens",
          h.num_recv_tokens);
    if (st.ok() && weights && h.num_tokens > 0 && combinedTopkWeights == nullptr)
      st = invalid_argument("topkWeights is given but combinedTopkWeights is NULL with {} tokens",
                            h.num_tokens);
    if (!st.ok()) {
      ep::Handle empty;
      empty.send_offset.assign(static_cast<size_t>(b->nranks()) + 1, 0);
      empty.recv_offset = empty.send_offset;
      return b->combine(empty, nullptr, dtype, false, nullptr, nullptr, nullptr, std::move(st));
    }
    return b->combine(h, x, dtype, weights, topkWeights, combinedX, combinedTopkWeights, Status());
  });
}

CHORUS_API ncclResult_t chorusEpHandleDestroy(chorusEpHandle_t handle) {
  return guard("chorusEpHandleDestroy", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto h, find_handle(handle));
    std::lock_guard<std::mutex> lock(g_mutex);
    handles().erase(handle);
    return Status();
  });
}
