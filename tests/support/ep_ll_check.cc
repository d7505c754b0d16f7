// SPDX-License-Identifier: Apache-2.0
// File: tests/support/ep_ll_check.cc
// Low-latency MoE dispatch/combine checks (ep_ll_check.h). The reference is plain loops over
// every rank's regenerated inputs: the rows of local expert e are the tokens naming it, by source
// rank, then token index. The "experts" write a value computed from the row's expert and source
// info, so each source knows every row that comes back to it, even from FP8 tokens.
#include "support/ep_ll_check.h"
#include "support/ep_routing.h"

#include <chorus/compress.h>
#include <chorus/ep.h>
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8/convert.h"

namespace chorus::test {
namespace {

using kernels::bf16_to_float;
using kernels::float_to_bf16;

enum class Routing { kUniform, kSkewed, kHotExpert, kMinusOneSlots, kRanksWithoutTokens };
enum class Fp8 { kNone, kFloatScales, kRoundScale, kUe8m0 };

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform:
      return "uniform";
    case Routing::kSkewed:
      return "skewed";
    case Routing::kHotExpert:
      return "hot expert";
    case Routing::kMinusOneSlots:
      return "-1 slots";
    case Routing::kRanksWithoutTokens:
      return "ranks without tokens";
  }
  return "?";
}

const char* fp8_name(Fp8 f) {
  switch (f) {
    case Fp8::kNone:
      return "no fp8";
    case Fp8::kFloatScales:
      return "fp8 float scales";
    case Fp8::kRoundScale:
      return "fp8 roundScale";
    case Fp8::kUe8m0:
      return "fp8 ue8m0";
  }
  return "?";
}

const char* dtype_name(ncclDataType_t t) { return t == ncclFloat32 ? "fp32" : "bf16"; }
size_t elem_size(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }

struct LlCase {
  Routing routing;
  ncclDataType_t dtype;
  ncclDataType_t combine_dtype;
  Fp8 fp8;
  size_t hidden;
  int topk;
  int local_experts;
  size_t max_tokens;
  bool hook;
  uint64_t seed;
  std::string describe() const {
    return fmt::format("{} {} {} -> {} hidden {} topk {} experts/rank {} max {}{}",
                       routing_name(routing), dtype_name(dtype), fp8_name(fp8),
                       dtype_name(combine_dtype), hidden, topk, local_experts, max_tokens,
                       hook ? " with hooks" : "");
  }
  size_t blocks() const { return hidden / CHORUS_EP_FP8_BLOCK; }
  size_t scale_bytes() const { return fp8 == Fp8::kUe8m0 ? 1 : 4; }
};

// One rank's tokens: the same wherever they are generated.
struct RankInput {
  size_t num_tokens = 0;
  std::vector<float> v;    // [num_tokens, hidden]: the values, exact in the datatype
  std::vector<uint8_t> x;  // the same in the datatype
  std::vector<int64_t> idx;
  std::vector<float> w;
};

std::vector<int64_t> route_token(const LlCase& c, int nranks, std::mt19937_64& gen) {
  TokenRouting r;
  r.topk = c.topk;
  r.experts = static_cast<int64_t>(c.local_experts) * nranks;
  r.skewed = c.routing == Routing::kSkewed;
  r.fewer_than_topk = c.routing == Routing::kMinusOneSlots;
  r.hot = c.routing == Routing::kHotExpert ? r.experts - 1 : -1;  // on the last rank
  return chorus::test::route_token(r, gen);
}

RankInput make_input(const LlCase& c, int rank, int nranks) {
  std::mt19937_64 gen(c.seed * 1000003 + static_cast<uint64_t>(rank) * 7919 + 29);
  RankInput in;
  in.num_tokens = c.max_tokens - gen() % (c.max_tokens / 2 + 1);
  if (c.routing == Routing::kRanksWithoutTokens && rank % 2 == 1) in.num_tokens = 0;
  if (c.routing == Routing::kRanksWithoutTokens && rank == 0) in.num_tokens = c.max_tokens;
  const size_t h = c.hidden;
  std::uniform_real_distribution<float> value(-3.0f, 3.0f), weight(0.05f, 1.0f);
  in.v.resize(in.num_tokens * h);
  in.x.resize(in.num_tokens * h * elem_size(c.dtype));
  for (size_t i = 0; i < in.v.size(); ++i) {
    // Magnitudes from 2^-12 to 2^6 per 16 channels, so FP8 blocks have varied scales.
    const float mag = std::ldexp(1.0f, static_cast<int>((i / 16 * 7 + c.seed) % 19) - 12);
    float f = value(gen) * mag;
    // With FP8, the first block of the first token is all zeros and the last block of the
    // second holds an Inf (their defined scales).
    if (c.fp8 != Fp8::kNone && i < CHORUS_EP_FP8_BLOCK) f = 0.0f;
    if (c.fp8 != Fp8::kNone && i == 2 * h - 1) f = INFINITY;
    if (c.dtype == ncclBfloat16) {
      const uint16_t b = float_to_bf16(f);
      f = bf16_to_float(b);
      std::memcpy(&in.x[i * 2], &b, 2);
    } else {
      std::memcpy(&in.x[i * 4], &f, 4);
    }
    in.v[i] = f;
  }
  for (size_t t = 0; t < in.num_tokens; ++t)
    for (int64_t e : route_token(c, nranks, gen)) {
      in.idx.push_back(e);
      in.w.push_back(weight(gen));
    }
  return in;
}

// What expert g writes for channel ch of token `token` of rank `src`: exact in BF16 and FP32.
float expert_out(int64_t g, int64_t src, int64_t token, size_t ch) {
  const int64_t v = (g * 131 + src * 17 + token * 7 + static_cast<int64_t>(ch) * 3) % 97;
  return static_cast<float>(v - 48) * 0.0625f;
}

std::string nccl_error(const char* what, ncclResult_t r) {
  return fmt::format("{}: {} ({})\n", what, ncclGetErrorString(r), ncclGetLastError(nullptr));
}

// One dispatch on this rank, its outputs, and the inputs of every rank.
struct Run {
  LlCase c;
  int rank = 0;
  int nranks = 0;
  std::vector<RankInput> all;
  std::vector<uint8_t> recv_x;
  std::vector<uint8_t> recv_scales;
  std::vector<int> recv_count;
  std::vector<int64_t> src_info;
  std::vector<uint8_t> combined;
  chorusEpHandle_t handle = nullptr;

  const RankInput& mine() const { return all[static_cast<size_t>(rank)]; }
  size_t rows() const { return static_cast<size_t>(nranks) * c.max_tokens; }  // R
  int experts() const { return c.local_experts * nranks; }
};

Run make_run(const LlCase& c, int rank, int nranks) {
  Run run;
  run.c = c;
  run.rank = rank;
  run.nranks = nranks;
  for (int q = 0; q < nranks; ++q) run.all.push_back(make_input(c, q, nranks));
  const size_t cells = static_cast<size_t>(c.local_experts) * run.rows();
  run.recv_x.assign(cells * c.hidden * (c.fp8 != Fp8::kNone ? 1 : elem_size(c.dtype)), 0xee);
  if (c.fp8 != Fp8::kNone) run.recv_scales.assign(cells * c.blocks() * c.scale_bytes(), 0xee);
  run.recv_count.assign(static_cast<size_t>(c.local_experts), -3);
  run.src_info.assign(cells, -9);
  return run;
}

size_t hint(const LlCase& c, int nranks) {
  size_t bytes = 0;
  if (chorusEpLowLatencySizeHint(nranks, c.max_tokens, c.hidden, c.local_experts * nranks, c.topk,
                                 &bytes) != ncclSuccess)
    return 0;
  return bytes;
}

chorusEpLowLatencyDispatchArgs_t dispatch_args(const Run& run) {
  const auto& in = run.mine();
  chorusEpLowLatencyDispatchArgs_t a{};
  a.x = in.x.data();
  a.datatype = run.c.dtype;
  a.numTokens = in.num_tokens;
  a.hidden = run.c.hidden;
  a.topkIdx = in.idx.data();
  a.topk = run.c.topk;
  a.numExperts = run.experts();
  a.maxTokensPerRank = run.c.max_tokens;
  a.useFp8 = run.c.fp8 != Fp8::kNone;
  a.roundScale = run.c.fp8 == Fp8::kRoundScale;
  a.useUe8m0 = run.c.fp8 == Fp8::kUe8m0;
  return a;
}

chorusEpLowLatencyDispatchOutput_t dispatch_out(Run& run) {
  chorusEpLowLatencyDispatchOutput_t o{};
  o.recvX = run.recv_x.data();
  o.recvXScales = run.c.fp8 != Fp8::kNone ? run.recv_scales.data() : nullptr;
  o.recvCount = run.recv_count.data();
  o.recvSrcInfo = run.src_info.data();
  return o;
}

// Posts the dispatch of `run`; with `hook` non-NULL it returns a hook.
std::string dispatch(chorusEpBuffer_t b, Run& run, chorusEpHook_t* hook) {
  const auto a = dispatch_args(run);
  auto o = dispatch_out(run);
  ncclResult_t r = chorusEpLowLatencyDispatch(b, &a, &o, hook != nullptr, &run.handle, hook);
  return r == ncclSuccess ? "" : nccl_error("chorusEpLowLatencyDispatch", r);
}

// Block `blk` of a received FP8 row against the original values: the scale as defined, each
// decoded value within E4M3's bound.
std::string check_fp8_block(const Run& run, size_t row, size_t blk, const float* v) {
  const auto& c = run.c;
  float amax = 0.0f;
  for (size_t i = 0; i < CHORUS_EP_FP8_BLOCK; ++i) amax = std::max(amax, std::fabs(v[i]));
  float s = 0.0f;
  const size_t at = row * c.blocks() + blk;
  if (c.fp8 == Fp8::kUe8m0) {
    const uint8_t e = run.recv_scales[at];
    s = e == 0xff ? NAN : std::ldexp(1.0f, static_cast<int>(e) - 127);
  } else {
    std::memcpy(&s, &run.recv_scales[at * 4], 4);
  }
  const uint8_t* codes = &run.recv_x[row * c.hidden + blk * CHORUS_EP_FP8_BLOCK];
  if (!std::isfinite(amax)) {  // an Inf in the block: a NaN scale and NaN codes, not clipped
    for (size_t i = 0; i < CHORUS_EP_FP8_BLOCK; ++i)
      if (!std::isnan(s) || !std::isnan(kernels::fp8e4m3_to_float(codes[i])))
        return fmt::format("channel {} of a block holding Inf: scale {}, code {:#x}, not NaN", i, s,
                           codes[i]);
    return "";
  }
  if (c.fp8 == Fp8::kFloatScales && s != std::max(amax / 448.0f, FLT_MIN))
    return fmt::format("scale {} for amax {}: expected max(amax / 448, FLT_MIN)", s, amax);
  if (c.fp8 != Fp8::kFloatScales) {
    int e = 0;
    const float m = std::frexp(s, &e);  // s = m * 2^e; a power of two has m = 0.5
    const bool smallest =
        amax == 0.0f ? s == std::ldexp(1.0f, -127) : amax <= 448.0f * s && amax > 224.0f * s;
    if (m != 0.5f || !smallest)
      return fmt::format("scale {} for amax {}: not the least power of two >= amax / 448", s, amax);
  }
  for (size_t i = 0; i < CHORUS_EP_FP8_BLOCK; ++i) {
    const double got = static_cast<double>(kernels::fp8e4m3_to_float(codes[i])) * s;
    const double x = v[i];
    const double bound = (0x1p-4 + 0x1p-20) * std::fabs(x) + 0x1p-10 * s + 0x1p-149;
    if (std::fabs(got - x) > bound)
      return fmt::format("channel {}: decoded {} is not within {} of {}", i, got, bound, x);
  }
  return "";
}

// What each local expert must have received, in order, compared with what it did.
std::string check_received(const Run& run) {
  const auto& c = run.c;
  const size_t k = static_cast<size_t>(c.topk), h = c.hidden, xb = h * elem_size(c.dtype);
  for (int e = 0; e < c.local_experts; ++e) {
    const int64_t g = static_cast<int64_t>(c.local_experts) * run.rank + e;
    size_t j = 0;
    for (int s = 0; s < run.nranks; ++s) {
      const auto& src = run.all[static_cast<size_t>(s)];
      for (size_t t = 0; t < src.num_tokens; ++t) {
        if (std::find(&src.idx[t * k], &src.idx[t * k] + k, g) == &src.idx[t * k] + k) continue;
        const size_t row = static_cast<size_t>(e) * run.rows() + j;
        const auto where = fmt::format("expert {} row {} (token {} of rank {})", e, j, t, s);
        if (j >= run.rows()) return where + ": more rows than R\n";
        const int64_t info =
            static_cast<int64_t>(s) * static_cast<int64_t>(c.max_tokens) + static_cast<int64_t>(t);
        if (run.src_info[row] != info)
          return fmt::format("{}: source info {}, expected {}\n", where, run.src_info[row], info);
        if (c.fp8 == Fp8::kNone && std::memcmp(&run.recv_x[row * xb], &src.x[t * xb], xb) != 0)
          return where + ": x differs\n";
        for (size_t blk = 0; c.fp8 != Fp8::kNone && blk < c.blocks(); ++blk) {
          std::string f = check_fp8_block(run, row, blk, &src.v[t * h + blk * 128]);
          if (!f.empty()) return fmt::format("{} block {}: {}\n", where, blk, f);
        }
        ++j;
      }
    }
    if (run.recv_count[static_cast<size_t>(e)] != static_cast<int>(j))
      return fmt::format("recvCount[{}] is {}, expected {}\n", e,
                         run.recv_count[static_cast<size_t>(e)], j);
  }
  return "";
}

// The experts' outputs for what arrived: [L, R, hidden] in the combine datatype, the rows past
// recvCount NaN (combine must not read them).
std::vector<uint8_t> expert_outputs(const Run& run) {
  const auto& c = run.c;
  const size_t ce = elem_size(c.combine_dtype);
  std::vector<uint8_t> y(static_cast<size_t>(c.local_experts) * run.rows() * c.hidden * ce, 0xff);
  for (int e = 0; e < c.local_experts; ++e) {
    const int64_t g = static_cast<int64_t>(c.local_experts) * run.rank + e;
    for (int j = 0; j < run.recv_count[static_cast<size_t>(e)]; ++j) {
      const size_t row = static_cast<size_t>(e) * run.rows() + static_cast<size_t>(j);
      const int64_t info = run.src_info[row];
      const auto m = static_cast<int64_t>(c.max_tokens);
      for (size_t ch = 0; ch < c.hidden; ++ch) {
        const float f = expert_out(g, info / m, info % m, ch);
        if (c.combine_dtype == ncclFloat32) {
          std::memcpy(&y[(row * c.hidden + ch) * 4], &f, 4);
        } else {
          const uint16_t b = float_to_bf16(f);
          std::memcpy(&y[(row * c.hidden + ch) * 2], &b, 2);
        }
      }
    }
  }
  return y;
}

// Posts the combine of `run` (its experts' outputs) into run.combined.
std::string combine(chorusEpBuffer_t b, Run& run, chorusEpHook_t* hook) {
  const std::vector<uint8_t> y = expert_outputs(run);
  run.combined.assign(run.mine().num_tokens * run.c.hidden * elem_size(run.c.combine_dtype), 0xee);
  ncclResult_t r =
      chorusEpLowLatencyCombine(b, run.handle, y.data(), run.c.combine_dtype, run.mine().w.data(),
                                run.combined.data(), hook != nullptr, hook);
  return r == ncclSuccess ? "" : nccl_error("chorusEpLowLatencyCombine", r);
}

// combined[t] = sum over slots in order of fl(w * row), in float, rounded once: bit for bit.
std::string check_combined(const Run& run) {
  const auto& c = run.c;
  const auto& in = run.mine();
  const size_t k = static_cast<size_t>(c.topk), h = c.hidden;
  for (size_t t = 0; t < in.num_tokens; ++t)
    for (size_t ch = 0; ch < h; ++ch) {
      float acc = 0.0f;
      for (size_t s = 0; s < k; ++s) {
        const int64_t g = in.idx[t * k + s];
        if (g < 0) continue;
        float v = expert_out(g, run.rank, static_cast<int64_t>(t), ch);
        if (c.combine_dtype == ncclBfloat16) v = bf16_to_float(float_to_bf16(v));
        volatile float product = in.w[t * k + s] * v;  // no fused multiply-add
        acc = acc + product;
      }
      float got = 0.0f;
      if (c.combine_dtype == ncclFloat32) {
        std::memcpy(&got, &run.combined[(t * h + ch) * 4], 4);
      } else {
        uint16_t b;
        std::memcpy(&b, &run.combined[(t * h + ch) * 2], 2);
        got = bf16_to_float(b);
        acc = bf16_to_float(float_to_bf16(acc));
      }
      if (std::memcmp(&got, &acc, 4) != 0)
        return fmt::format("combined token {} channel {}: {}, expected {}\n", t, ch, got, acc);
    }
  return "";
}

std::string wait(chorusEpHook_t hook, const char* what) {
  const ncclResult_t r = chorusEpHookWait(hook);
  return r == ncclSuccess ? "" : nccl_error(what, r);
}

std::string make_buffer(ncclComm_t comm, size_t bytes, chorusEpBuffer_t* b) {
  if (bytes == 0) return "chorusEpLowLatencySizeHint failed\n";
  const ncclResult_t r = chorusEpBufferCreate(comm, bytes, b);
  return r == ncclSuccess ? "" : nccl_error("chorusEpBufferCreate", r);
}

// Dispatch, check, combine, check: blocking or with a hook waited at once.
std::string run_case(ncclComm_t comm, const LlCase& c, int rank, int nranks) {
  Run run = make_run(c, rank, nranks);
  chorusEpBuffer_t b = nullptr;
  chorusEpHook_t hook = nullptr;
  chorusEpHook_t* hp = c.hook ? &hook : nullptr;
  std::string f = make_buffer(comm, hint(c, nranks), &b);
  if (f.empty()) f = dispatch(b, run, hp);
  if (f.empty() && c.hook) f = wait(hook, "dispatch hook");
  if (f.empty()) f = check_received(run);
  if (f.empty()) f = combine(b, run, hp);
  if (f.empty() && c.hook) f = wait(hook, "combine hook");
  if (f.empty()) f = check_combined(run);
  if (run.handle != nullptr && chorusEpHandleDestroy(run.handle) != ncclSuccess && f.empty())
    f = "handle destroy\n";
  if (b != nullptr && chorusEpBufferDestroy(b) != ncclSuccess && f.empty()) f = "buffer destroy\n";
  return f.empty() ? "" : c.describe() + ": " + f;
}

std::vector<LlCase> matrix_cases(int nranks, uint64_t seed) {
  std::vector<LlCase> cases;
  const Routing routings[] = {Routing::kUniform, Routing::kSkewed, Routing::kHotExpert,
                              Routing::kMinusOneSlots, Routing::kRanksWithoutTokens};
  const Fp8 fp8s[] = {Fp8::kNone, Fp8::kFloatScales, Fp8::kRoundScale, Fp8::kUe8m0};
  int n = 0;
  for (auto dt : {ncclBfloat16, ncclFloat32})
    for (auto f : fp8s)
      for (auto r : routings) {
        const int i = n++;
        if (f != Fp8::kNone && i % 2 != 0) continue;  // every other routing of each FP8 kind
        LlCase c{};
        c.routing = r;
        c.dtype = dt;
        c.combine_dtype = i % 3 == 0 ? ncclFloat32 : ncclBfloat16;
        c.fp8 = f;
        c.hidden = f != Fp8::kNone ? 256 : (i % 2 ? 136 : 40);
        c.local_experts = i % 2 ? 3 : 2;
        c.topk = std::min(i % 3 == 0 ? 1 : (i % 3 == 1 ? 4 : 6), c.local_experts * nranks);
        c.max_tokens = 8 + static_cast<size_t>(i % 4) * 5;
        c.hook = i % 2 == 0;
        c.seed = seed + static_cast<uint64_t>(i) * 31;
        cases.push_back(c);
      }
  return cases;
}

// A refused call: the `culprit` rank (-1: every rank) fails with `code` and a message containing
// `text`; the others with ncclInvalidArgument naming the culprit.
std::string expect_refused(const char* what, ncclResult_t r, int rank, int culprit,
                           const std::string& text, ncclResult_t code = ncclInvalidArgument) {
  const std::string msg = ncclGetLastError(nullptr);
  const bool mine = culprit < 0 || culprit == rank;
  const std::string want = mine ? text : fmt::format("refused on rank(s) {}", culprit);
  const ncclResult_t want_code = mine ? code : ncclInvalidArgument;
  if (r != want_code || msg.find(want) == std::string::npos)
    return fmt::format("{}: got {} \"{}\", expected {} with \"{}\"\n", what, ncclGetErrorString(r),
                       msg, ncclGetErrorString(want_code), want);
  return "";
}

LlCase small_case(uint64_t seed) {
  LlCase c{};
  c.routing = Routing::kUniform;
  c.dtype = ncclFloat32;
  c.combine_dtype = ncclFloat32;
  c.fp8 = Fp8::kNone;
  c.hidden = 128;
  c.topk = 2;
  c.local_experts = 2;
  c.max_tokens = 16;
  c.seed = seed;
  return c;
}

// A dispatch of `run` with `edit` applied to its arguments first; its result.
template <typename Edit>
ncclResult_t bad_dispatch(chorusEpBuffer_t b, Run& run, Edit edit) {
  auto a = dispatch_args(run);
  auto o = dispatch_out(run);
  edit(a);
  chorusEpHandle_t h = nullptr;
  const ncclResult_t r = chorusEpLowLatencyDispatch(b, &a, &o, 0, &h, nullptr);
  if (h != nullptr) chorusEpHandleDestroy(h);
  return r;
}

// A normal-mode dispatch of no tokens (valid arguments).
ncclResult_t empty_normal_dispatch(chorusEpBuffer_t b, int nranks) {
  chorusEpDispatchArgs_t a{};
  a.datatype = ncclFloat32;
  a.hidden = 8;
  a.topk = 1;
  a.numExperts = nranks;
  a.expertAlignment = 1;
  chorusEpDispatchOutput_t o{};
  chorusEpHandle_t h = nullptr;
  const ncclResult_t r = chorusEpDispatch(b, &a, &o, &h);
  if (h != nullptr) chorusEpHandleDestroy(h);
  return r;
}

}  // namespace

std::string check_ep_ll_matrix(ncclComm_t comm, uint64_t seed) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  std::string f;
  for (const auto& c : matrix_cases(nranks, seed)) f += run_case(comm, c, rank, nranks);
  return f;
}

std::string check_ep_ll_hooks(ncclComm_t comm, uint64_t seed) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  LlCase ca = small_case(seed), cb = small_case(seed + 1);
  ca.dtype = ncclBfloat16, ca.fp8 = Fp8::kUe8m0, ca.hidden = 256, ca.routing = Routing::kSkewed;
  cb.combine_dtype = ncclBfloat16, cb.routing = Routing::kMinusOneSlots, cb.topk = 3;
  Run a = make_run(ca, rank, nranks), bb = make_run(cb, rank, nranks);
  chorusEpBuffer_t b = nullptr;
  std::string f = make_buffer(comm, std::max(hint(ca, nranks), hint(cb, nranks)), &b);
  if (!f.empty()) return f;
  chorusEpHook_t ha = nullptr, hb = nullptr;
  f = dispatch(b, a, &ha);
  const auto untouched = [](int c) { return c == -3; };
  if (f.empty() && !std::all_of(a.recv_count.begin(), a.recv_count.end(), untouched))
    f = "dispatch A wrote its outputs before its hook\n";
  if (f.empty()) f = dispatch(b, bb, &hb);
  if (f.empty()) {
    // Both slots taken: a third call, a normal-mode call, a handle before its hook: refused.
    Run c3 = make_run(ca, rank, nranks);
    f += expect_refused("a third dispatch in flight", bad_dispatch(b, c3, [](auto&) {}), rank, -1,
                        "two low-latency calls are in flight", ncclInvalidUsage);
    f += expect_refused("a normal-mode dispatch with hooks pending",
                        empty_normal_dispatch(b, nranks), rank, -1,
                        "a low-latency call on this buffer is in flight", ncclInvalidUsage);
    std::vector<uint8_t> y(1), out(1);
    f += expect_refused("a combine before its dispatch's hook",
                        chorusEpLowLatencyCombine(b, a.handle, y.data(), ncclFloat32,
                                                  a.mine().w.data(), out.data(), 0, nullptr),
                        rank, -1, "its dispatch's hook has not been waited", ncclInvalidUsage);
    // The hooks in reverse order.
    f += wait(hb, "hook B") + wait(ha, "hook A");
  }
  if (f.empty()) f = check_received(a) + check_received(bb);
  // Combine: A, B, then the hooks in order; A's handle destroyed while its combine is in flight.
  if (f.empty()) f = combine(b, a, &ha);
  if (f.empty()) f = combine(b, bb, &hb);
  if (f.empty()) {
    if (!a.combined.empty() && a.combined[0] != 0xee)
      f += "combine A wrote its output before its hook\n";
    if (chorusEpHandleDestroy(a.handle) != ncclSuccess) f += "handle A destroy\n";
    a.handle = nullptr;
    f += wait(ha, "combine hook A") + wait(hb, "combine hook B");
  }
  if (f.empty()) f = check_combined(a) + check_combined(bb);
  // A low-latency handle is no normal-mode handle (and the slots are free again).
  if (f.empty()) {
    std::vector<float> y(1), out(1);
    f = expect_refused(
        "a normal-mode combine of a low-latency handle",
        chorusEpCombine(b, bb.handle, y.data(), ncclFloat32, nullptr, out.data(), nullptr), rank,
        -1, "comes from a low-latency dispatch");
  }
  // Blocking again on the same buffer: both slots are free.
  if (f.empty()) f = combine(b, bb, nullptr);
  if (f.empty()) f = check_combined(bb);
  for (Run* r : {&a, &bb})
    if (r->handle != nullptr && chorusEpHandleDestroy(r->handle) != ncclSuccess && f.empty())
      f = "handle destroy\n";
  if (chorusEpBufferDestroy(b) != ncclSuccess && f.empty()) f = "buffer destroy\n";
  return f.empty() ? "" : "two micro-batches: " + f;
}

namespace {

// Data bytes this rank's communicator sent, to every peer.
unsigned long long comm_bytes_sent(ncclComm_t comm) {
  chorusByteCounters_t c{};
  if (chorusCommGetByteCounters(comm, -1, &c) != ncclSuccess) return ~0ull;
  return c.dataBytesSent;
}

}  // namespace

std::string check_ep_ll_paths(ncclComm_t comm, uint64_t seed, bool mapped) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  if (nranks < 2) return "";
  // Messages of 256 KiB: the agreements' few hundred bytes are far below one.
  LlCase c = small_case(seed);
  c.hidden = 1024, c.max_tokens = 64;
  const size_t record = (c.hidden * 4 + 4 + 4 * static_cast<size_t>(c.topk) + 7) / 8 * 8;
  const unsigned long long message = 8 + c.max_tokens * record;  // ep.h, Cost
  const unsigned long long peers = static_cast<unsigned long long>(nranks) - 1;
  LlCase cb = c, cc = c;
  cb.seed = seed + 1, cb.routing = Routing::kSkewed;
  cc.seed = seed + 2, cc.routing = Routing::kMinusOneSlots;
  Run w = make_run(c, rank, nranks), a = make_run(c, rank, nranks), bb = make_run(cb, rank, nranks),
      cr = make_run(cc, rank, nranks);
  chorusEpBuffer_t b = nullptr;
  std::string f = make_buffer(comm, hint(c, nranks), &b);
  const auto expect = [&](const char* what, unsigned long long sent, unsigned long long low,
                          unsigned long long high) {
    if (sent < low || sent >= high)
      f += fmt::format("{}: the communicator sent {} bytes, expected [{}, {}) ({} path, messages "
                       "of {} bytes)\n",
                       what, sent, low, high, mapped ? "mapped" : "communicator", message);
  };
  // Blocking (the first call also maps the peers' buffers).
  unsigned long long before = comm_bytes_sent(comm);
  if (f.empty()) f = dispatch(b, w, nullptr);
  if (f.empty()) {
    const unsigned long long sent = comm_bytes_sent(comm) - before;
    if (mapped)
      expect("a blocking dispatch", sent, 0, message / 2);
    else
      expect("a blocking dispatch", sent, peers * message, peers * message + message / 2);
  }
  if (f.empty()) f = check_received(w);
  // Combine sends one row of hidden * 4 bytes back per row received from another rank.
  const auto rows_back = [&](const Run& r) {
    unsigned long long bytes = 0;
    for (int e = 0; e < c.local_experts; ++e)
      for (int j = 0; j < r.recv_count[static_cast<size_t>(e)]; ++j) {
        const int64_t info = r.src_info[static_cast<size_t>(e) * r.rows() + static_cast<size_t>(j)];
        if (info / static_cast<int64_t>(c.max_tokens) != rank) bytes += c.hidden * 4;
      }
    return bytes;
  };
  const unsigned long long back = rows_back(w);
  const unsigned long long slack = 16384;  // the agreements' bytes, far below the rows
  before = comm_bytes_sent(comm);
  if (f.empty()) f = combine(b, w, nullptr);
  if (f.empty()) {
    const unsigned long long sent = comm_bytes_sent(comm) - before;
    if (mapped)
      expect("a blocking combine", sent, 0, slack);
    else
      expect("a blocking combine", sent, back, back + slack);
  }
  if (f.empty()) f = check_combined(w);
  // A and B on slots 0 and 1 everywhere; then even ranks wait A, odd ranks B, so C takes slot 0
  // on even ranks and 1 on odd ones: it must go through the communicator (a write into the
  // slot of an odd rank would land on A's rows, not yet read there).
  chorusEpHook_t ha = nullptr, hb = nullptr, hc = nullptr;
  before = comm_bytes_sent(comm);
  if (f.empty()) f = dispatch(b, a, &ha);
  if (f.empty()) f = dispatch(b, bb, &hb);
  const bool even = rank % 2 == 0;
  if (f.empty()) f = even ? wait(ha, "hook A") : wait(hb, "hook B");
  if (f.empty()) f = dispatch(b, cr, &hc);
  if (f.empty()) f = even ? wait(hb, "hook B") : wait(ha, "hook A");
  if (f.empty()) f = wait(hc, "hook C");
  if (f.empty()) {
    const unsigned long long sent = comm_bytes_sent(comm) - before;
    if (mapped)  // C's messages only
      expect("dispatches A, B (same slots) and C (different slots)", sent, peers * message,
             peers * message + message / 2);
    else
      expect("dispatches A, B and C", sent, 3 * peers * message, 3 * peers * message + message / 2);
  }
  if (f.empty()) f = check_received(a) + check_received(bb) + check_received(cr);
  // The same for combine: A and C on slots 0 and 1, even ranks wait A and odd ranks C, so B
  // takes different slots and goes through the communicator.
  before = comm_bytes_sent(comm);
  if (f.empty()) f = combine(b, a, &ha);
  if (f.empty()) f = combine(b, cr, &hc);
  if (f.empty()) f = even ? wait(ha, "combine hook A") : wait(hc, "combine hook C");
  if (f.empty()) f = combine(b, bb, &hb);
  if (f.empty()) f = even ? wait(hc, "combine hook C") : wait(ha, "combine hook A");
  if (f.empty()) f = wait(hb, "combine hook B");
  if (f.empty()) {
    const unsigned long long sent = comm_bytes_sent(comm) - before;
    const unsigned long long all = rows_back(a) + rows_back(bb) + rows_back(cr);
    if (mapped)  // B's rows only
      expect("combines A, C (same slots) and B (different slots)", sent, rows_back(bb),
             rows_back(bb) + slack);
    else
      expect("combines A, C and B", sent, all, all + slack);
  }
  if (f.empty()) f = check_combined(a) + check_combined(bb) + check_combined(cr);
  for (Run* r : {&w, &a, &bb, &cr})
    if (r->handle != nullptr && chorusEpHandleDestroy(r->handle) != ncclSuccess && f.empty())
      f = "handle destroy\n";
  if (b != nullptr && chorusEpBufferDestroy(b) != ncclSuccess && f.empty()) f = "buffer destroy\n";
  return f.empty() ? "" : "low-latency data paths: " + f;
}

std::string check_ep_ll_bad_input(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  const LlCase c = small_case(5);
  Run run = make_run(c, rank, nranks);
  const int experts = run.experts();
  chorusEpBuffer_t b = nullptr;
  std::string f = make_buffer(comm, hint(c, nranks), &b);
  if (!f.empty()) return f;
  std::vector<float> big((c.max_tokens + 1) * c.hidden, 1.0f);
  std::vector<int64_t> idx((c.max_tokens + 1) * 2, 0);
  for (size_t t = 0; t < c.max_tokens + 1; ++t) idx[t * 2 + 1] = 1;
  f += expect_refused("numTokens > maxTokensPerRank on rank 0",
                      bad_dispatch(b, run,
                                   [&](auto& a) {
                                     if (rank != 0) return;
                                     a.x = big.data(), a.topkIdx = idx.data();
                                     a.numTokens = c.max_tokens + 1;
                                   }),
                      rank, 0, "numTokens 17 is more than maxTokensPerRank 16");
  std::vector<int64_t> bad = run.mine().idx;
  bad[3 * 2 + 1] = experts;
  f += expect_refused(
      "expert index numExperts on rank 0",
      bad_dispatch(b, run,
                   [&](auto& a) {
                     if (rank == 0) a.topkIdx = bad.data();
                   }),
      rank, 0,
      fmt::format("token 3 slot 1: expert index {} is outside [-1, {})", experts, experts));
  bad = run.mine().idx;
  bad[2 * 2 + 1] = bad[2 * 2];
  f += expect_refused("an expert named twice",
                      bad_dispatch(b, run, [&](auto& a) { a.topkIdx = bad.data(); }), rank, -1,
                      fmt::format("token 2 names expert {} twice (slots 0 and 1)", bad[4]));
  f += expect_refused("FP8 with hidden 100",
                      bad_dispatch(b, run,
                                   [&](auto& a) {
                                     a.useFp8 = 1;
                                     a.hidden = 100;
                                   }),
                      rank, -1, "hidden 100 is not a multiple of 128");
  f += expect_refused("float16", bad_dispatch(b, run, [&](auto& a) { a.datatype = ncclFloat16; }),
                      rank, -1, "datatype 6 is not supported");
  if (nranks > 1)
    f += expect_refused("maxTokensPerRank differs",
                        bad_dispatch(b, run,
                                     [&](auto& a) {
                                       if (rank != 1) return;
                                       a.maxTokensPerRank = 15;
                                       a.numTokens = std::min<size_t>(a.numTokens, 15);
                                     }),
                        rank, -1,
                        "maxTokensPerRank differs between ranks: 16 on rank 0, 15 on rank 1");
  chorusEpBufferDestroy(b);
  // A buffer of half the hint names the hint.
  f += make_buffer(comm, hint(c, nranks) / 2, &b);
  f += expect_refused("a buffer of half the hint", bad_dispatch(b, run, [](auto&) {}), rank, -1,
                      fmt::format("chorusEpLowLatencySizeHint(nranks {}, maxTokensPerRank 16, "
                                  "hidden 128, numExperts {}, topk 2) = {} bytes",
                                  nranks, experts, hint(c, nranks)));
  chorusEpBufferDestroy(b);
  // Still usable: a whole dispatch and combine, and a plain collective.
  f += run_case(comm, small_case(21), rank, nranks);
  float x = 1.5f;
  if (ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr) != ncclSuccess ||
      x != 1.5f * static_cast<float>(nranks))
    f += "AllReduce after the refused calls failed\n";
  return f;
}

}  // namespace chorus::test
