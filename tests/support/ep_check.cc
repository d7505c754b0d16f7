// SPDX-License-Identifier: Apache-2.0
// File: tests/support/ep_check.cc
// MoE dispatch/combine checks (ep_check.h). The reference is plain loops over every rank's
// regenerated inputs: which tokens reach this rank, in which order (source rank, then token
// index), with which local indices and weights; and, at the source, each token's weighted sum
// of expert outputs over the ranks it went to.
#include "support/ep_check.h"
#include "support/ep_routing.h"

#include <chorus/ep.h>
#include <chorus/stream.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/fp8/convert.h"

namespace chorus::test {
namespace {

using kernels::bf16_to_float;
using kernels::float_to_bf16;

enum class Routing { kUniform, kSkewed, kHotExpert, kFewerThanTopk, kSomeReceiveNothing };

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform:
      return "uniform";
    case Routing::kSkewed:
      return "skewed";
    case Routing::kHotExpert:
      return "hot expert";
    case Routing::kFewerThanTopk:
      return "fewer than topk";
    case Routing::kSomeReceiveNothing:
      return "some ranks receive nothing";
  }
  return "?";
}

const char* dtype_name(ncclDataType_t t) {
  return t == ncclFloat32 ? "fp32" : t == ncclBfloat16 ? "bf16" : "fp8e4m3";
}

size_t elem_size(ncclDataType_t t) { return t == ncclFloat32 ? 4 : t == ncclBfloat16 ? 2 : 1; }

struct EpCase {
  Routing routing;
  ncclDataType_t dtype;
  ncclDataType_t combine_dtype;
  size_t hidden;
  int topk;
  int local_experts;
  size_t max_tokens;
  int alignment;
  bool pass_layout;
  uint64_t seed;
  std::string describe() const {
    return fmt::format("{} {} -> {} hidden {} topk {} experts/rank {} align {}{}",
                       routing_name(routing), dtype_name(dtype), dtype_name(combine_dtype), hidden,
                       topk, local_experts, alignment, pass_layout ? " layout given" : "");
  }
};

// One rank's tokens: the same wherever they are generated.
struct RankInput {
  size_t num_tokens = 0;
  std::vector<uint8_t> x;  // [num_tokens, hidden] of the dispatch datatype
  std::vector<float> scales;
  std::vector<int64_t> idx;
  std::vector<float> w;
};

std::vector<int64_t> route_token(const EpCase& c, int nranks, std::mt19937_64& gen) {
  const int64_t experts = static_cast<int64_t>(c.local_experts) * nranks;
  TokenRouting r;
  r.topk = c.topk;
  r.experts = c.routing == Routing::kSomeReceiveNothing
                  ? static_cast<int64_t>(c.local_experts) * ((nranks + 1) / 2)
                  : experts;
  r.skewed = c.routing == Routing::kSkewed;
  r.fewer_than_topk = c.routing == Routing::kFewerThanTopk;
  r.hot = c.routing == Routing::kHotExpert ? experts - 1 : -1;  // on the last rank
  return chorus::test::route_token(r, gen);
}

RankInput make_input(const EpCase& c, int rank, int nranks) {
  std::mt19937_64 gen(c.seed * 1000003 + static_cast<uint64_t>(rank) * 7919 + 17);
  RankInput in;
  in.num_tokens = c.max_tokens - gen() % (c.max_tokens / 2 + 1);
  if (c.routing == Routing::kSomeReceiveNothing && rank == nranks - 1) in.num_tokens = 0;
  const size_t h = c.hidden;
  std::uniform_real_distribution<float> value(-3.0f, 3.0f), weight(0.05f, 1.0f);
  in.x.resize(in.num_tokens * h * elem_size(c.dtype));
  if (c.dtype == ncclFloat8e4m3) in.scales.resize(in.num_tokens * h / CHORUS_EP_FP8_BLOCK);
  std::vector<float> v(h);
  for (size_t t = 0; t < in.num_tokens; ++t) {
    for (float& f : v) f = value(gen);
    if (c.dtype == ncclFloat32) std::memcpy(&in.x[t * h * 4], v.data(), h * 4);
    for (size_t i = 0; c.dtype == ncclBfloat16 && i < h; ++i) {
      const uint16_t b = float_to_bf16(v[i]);
      std::memcpy(&in.x[(t * h + i) * 2], &b, 2);
    }
    for (size_t blk = 0; c.dtype == ncclFloat8e4m3 && blk < h / CHORUS_EP_FP8_BLOCK; ++blk) {
      float amax = 0;
      for (size_t i = 0; i < CHORUS_EP_FP8_BLOCK; ++i)
        amax = std::max(amax, std::fabs(v[blk * 128 + i]));
      const float scale = amax / 448.0f;
      in.scales[t * (h / CHORUS_EP_FP8_BLOCK) + blk] = scale;
      for (size_t i = 0; i < CHORUS_EP_FP8_BLOCK; ++i)
        in.x[t * h + blk * 128 + i] = kernels::float_to_fp8e4m3(v[blk * 128 + i] / scale);
    }
    for (int64_t e : route_token(c, nranks, gen)) {
      in.idx.push_back(e);
      in.w.push_back(weight(gen));
    }
  }
  return in;
}

// Channel i of token t as a float.
float load(const EpCase& c, const uint8_t* x, const float* scales, size_t t, size_t i) {
  const size_t h = c.hidden;
  if (c.dtype == ncclFloat32) {
    float f;
    std::memcpy(&f, x + (t * h + i) * 4, 4);
    return f;
  }
  if (c.dtype == ncclBfloat16) {
    uint16_t b;
    std::memcpy(&b, x + (t * h + i) * 2, 2);
    return bf16_to_float(b);
  }
  return kernels::fp8e4m3_to_float(x[t * h + i]) * scales[t * (h / CHORUS_EP_FP8_BLOCK) + i / 128];
}

// The "expert" g applied to one channel.
float expert(int64_t g, float v) {
  return v * (0.75f + 0.03125f * static_cast<float>(g)) + 0.0078125f * static_cast<float>(g % 5);
}

// One rank's result for a token: the weighted sum, in slot order, of the experts `global`
// (-1: not on that rank) applied to the token, rounded to the combine datatype; out gets the
// rounded values as floats.
void partial(const EpCase& c, const std::vector<float>& v, const int64_t* global, const float* w,
             std::vector<float>& out) {
  for (size_t i = 0; i < c.hidden; ++i) {
    float acc = 0.0f;
    for (int k = 0; k < c.topk; ++k)
      if (global[k] >= 0) acc += w[k] * expert(global[k], v[i]);
    out[i] = c.combine_dtype == ncclBfloat16 ? bf16_to_float(float_to_bf16(acc)) : acc;
  }
}

void store(ncclDataType_t t, std::vector<uint8_t>& bytes, size_t i, float f) {
  if (t == ncclFloat32) {
    std::memcpy(&bytes[i * 4], &f, 4);
  } else {
    const uint16_t b = float_to_bf16(f);
    std::memcpy(&bytes[i * 2], &b, 2);
  }
}

std::string nccl_error(const char* what, ncclResult_t r) {
  return fmt::format("{}: {} ({})\n", what, ncclGetErrorString(r), ncclGetLastError(nullptr));
}

// Waits, through an event, for what the last call queued on run.stream (if any).
template <typename R>
std::string wait_queued(const R& run) {
  if (run.stream == nullptr) return "";
  chorusEvent_t ev = nullptr;
  ncclResult_t r = chorusEventCreate(&ev);
  if (r == ncclSuccess) r = chorusEventRecord(ev, run.stream);
  if (r == ncclSuccess) r = chorusEventSynchronize(ev);
  if (ev != nullptr) chorusEventDestroy(ev);
  return r == ncclSuccess ? "" : nccl_error("the stream of an asynchronous EP call", r);
}

// One dispatch on this rank, its outputs, and the inputs of every rank.
struct Run {
  EpCase c;
  int rank = 0;
  int nranks = 0;
  std::vector<RankInput> all;
  std::vector<uint8_t> recv_x;
  std::vector<float> recv_scales;
  std::vector<int64_t> recv_idx;
  std::vector<float> recv_w;
  std::vector<int> recv_per_expert;
  size_t num_recv = 0;
  chorusEpHandle_t handle = nullptr;
  chorusStream_t stream = nullptr;  // non-NULL: the calls are queued on it (chorusEp*Async)
  // The outputs above allocated during the dispatch by allocate_outputs (out.allocate), which
  // records its calls, fails returning fail_allocate when that is not 0, and with
  // short_capacity announces one row fewer than arrive.
  bool allocate = false;
  int fail_allocate = 0;
  bool short_capacity = false;
  int allocate_calls = 0;
  size_t allocated = 0;
  std::thread::id allocate_thread;

  const RankInput& mine() const { return all[static_cast<size_t>(rank)]; }
  int rank_of(int64_t e) const { return static_cast<int>(e / c.local_experts); }
};

// chorusEpDispatchOutput_t's allocate for a Run: outputs of exactly the rows that arrive, filled
// with markers as prepare's are.
int allocate_outputs(void* ctx, size_t rows, chorusEpDispatchOutput_t* o) {
  Run& run = *static_cast<Run*>(ctx);
  ++run.allocate_calls;
  run.allocated = rows;
  run.allocate_thread = std::this_thread::get_id();
  if (run.fail_allocate != 0) return run.fail_allocate;
  const auto& c = run.c;
  const size_t k = static_cast<size_t>(c.topk);
  run.recv_x.assign(rows * c.hidden * elem_size(c.dtype), 0xee);
  run.recv_scales.assign(c.dtype == ncclFloat8e4m3 ? rows * c.hidden / 128 : 0, -1.0f);
  run.recv_idx.assign(rows * k, 77);
  run.recv_w.assign(rows * k, -5.0f);
  o->recvX = run.recv_x.data();
  o->recvXScales = c.dtype == ncclFloat8e4m3 ? run.recv_scales.data() : nullptr;
  o->recvTopkIdx = run.recv_idx.data();
  o->recvTopkWeights = run.recv_w.data();
  o->recvCapacity = run.short_capacity && rows > 0 ? rows - 1 : rows;
  return 0;
}

Run make_run(const EpCase& c, int rank, int nranks) {
  Run run;
  run.c = c;
  run.rank = rank;
  run.nranks = nranks;
  for (int q = 0; q < nranks; ++q) run.all.push_back(make_input(c, q, nranks));
  return run;
}

size_t max_tokens(const Run& run) {
  size_t m = 0;
  for (const auto& in : run.all) m = std::max(m, in.num_tokens);
  return m;
}

std::string check_layout(chorusEpBuffer_t b, const Run& run, std::vector<int>& per_rank,
                         std::vector<int>& per_expert, std::vector<uint8_t>& in_rank) {
  const auto& in = run.mine();
  const int n = run.nranks, experts = run.c.local_experts * n;
  per_rank.assign(static_cast<size_t>(n), -7);
  per_expert.assign(static_cast<size_t>(experts), -7);
  in_rank.assign(in.num_tokens * static_cast<size_t>(n), 9);
  ncclResult_t r = chorusEpGetDispatchLayout(b, in.idx.data(), in.num_tokens, run.c.topk, experts,
                                             per_rank.data(), per_expert.data(), in_rank.data());
  if (r != ncclSuccess) return nccl_error("chorusEpGetDispatchLayout", r);
  std::vector<int> want_rank(static_cast<size_t>(n), 0),
      want_expert(static_cast<size_t>(experts), 0);
  std::vector<uint8_t> want_in(in_rank.size(), 0);
  for (size_t t = 0; t < in.num_tokens; ++t)
    for (int k = 0; k < run.c.topk; ++k) {
      const int64_t e = in.idx[t * static_cast<size_t>(run.c.topk) + static_cast<size_t>(k)];
      if (e < 0) continue;
      ++want_expert[static_cast<size_t>(e)];
      want_in[t * static_cast<size_t>(n) + static_cast<size_t>(run.rank_of(e))] = 1;
    }
  for (size_t t = 0; t < in.num_tokens; ++t)
    for (int q = 0; q < n; ++q)
      want_rank[static_cast<size_t>(q)] +=
          want_in[t * static_cast<size_t>(n) + static_cast<size_t>(q)];
  if (per_rank != want_rank || per_expert != want_expert || in_rank != want_in)
    return "layout differs from the reference\n";
  return "";
}

// A dispatch's arguments and output descriptors for run (outputs sized for the most that can
// arrive), the layout computed by chorusEpGetDispatchLayout and checked.
struct Prepared {
  std::vector<int> per_rank, per_expert;
  std::vector<uint8_t> in_rank;
  chorusEpDispatchArgs_t a{};
  chorusEpDispatchOutput_t o{};
};

std::string prepare(chorusEpBuffer_t b, Run& run, Prepared& p) {
  const auto& in = run.mine();
  const auto& c = run.c;
  std::string f = check_layout(b, run, p.per_rank, p.per_expert, p.in_rank);
  if (!f.empty()) return f;
  size_t capacity = 0;
  for (const auto& other : run.all) capacity += other.num_tokens;
  const size_t k = static_cast<size_t>(c.topk);
  run.recv_x.assign(capacity * c.hidden * elem_size(c.dtype), 0xee);
  if (c.dtype == ncclFloat8e4m3) run.recv_scales.assign(capacity * c.hidden / 128, -1.0f);
  run.recv_idx.assign(capacity * k, 77);
  run.recv_w.assign(capacity * k, -5.0f);
  run.recv_per_expert.assign(static_cast<size_t>(c.local_experts), -3);
  chorusEpDispatchArgs_t& a = p.a;
  a.x = in.x.data();
  a.xScales = c.dtype == ncclFloat8e4m3 ? in.scales.data() : nullptr;
  a.datatype = c.dtype;
  a.numTokens = in.num_tokens;
  a.hidden = c.hidden;
  a.topkIdx = in.idx.data();
  a.topkWeights = in.w.data();
  a.topk = c.topk;
  a.numExperts = c.local_experts * run.nranks;
  if (c.pass_layout) {
    a.numTokensPerRank = p.per_rank.data();
    a.numTokensPerExpert = p.per_expert.data();
    a.isTokenInRank = p.in_rank.data();
  }
  a.expertAlignment = c.alignment;
  chorusEpDispatchOutput_t& o = p.o;
  o.recvX = run.recv_x.data();
  o.recvXScales = c.dtype == ncclFloat8e4m3 ? run.recv_scales.data() : nullptr;
  o.recvTopkIdx = run.recv_idx.data();
  o.recvTopkWeights = run.recv_w.data();
  o.recvCapacity = capacity;
  o.numRecvTokensPerExpert = run.recv_per_expert.data();
  if (run.allocate) {
    // No arrays on entry: allocate_outputs gives them during the call.
    o.recvX = nullptr;
    o.recvXScales = nullptr;
    o.recvTopkIdx = nullptr;
    o.recvTopkWeights = nullptr;
    o.recvCapacity = 0;
    o.allocate = allocate_outputs;
    o.allocateCtx = &run;
    run.allocate_calls = 0;
  }
  return "";
}

std::string dispatch(chorusEpBuffer_t b, Run& run) {
  Prepared p;
  std::string f = prepare(b, run, p);
  if (!f.empty()) return f;
  ncclResult_t r = chorusEpDispatchAsync(b, &p.a, &p.o, &run.handle, run.stream);
  if (r != ncclSuccess) return nccl_error("chorusEpDispatch", r);
  run.num_recv = p.o.numRecvTokens;  // set on return, also when queued on a stream
  if (run.allocate && (run.allocate_calls != 1 || run.allocated != run.num_recv ||
                       run.allocate_thread != std::this_thread::get_id()))
    return fmt::format(
        "allocate was called {} times, last for {} tokens, {} the calling thread; {} arrived\n",
        run.allocate_calls, run.allocated,
        run.allocate_thread == std::this_thread::get_id() ? "on" : "not on", run.num_recv);
  return wait_queued(run);
}

// What this rank must have received, in order, compared with what it did.
std::string check_received(const Run& run) {
  const auto& c = run.c;
  const size_t k = static_cast<size_t>(c.topk), h = c.hidden, xb = h * elem_size(c.dtype);
  const int64_t first = static_cast<int64_t>(c.local_experts) * run.rank;
  std::vector<size_t> per_expert(static_cast<size_t>(c.local_experts), 0);
  size_t i = 0;
  for (int s = 0; s < run.nranks; ++s) {
    const auto& src = run.all[static_cast<size_t>(s)];
    for (size_t t = 0; t < src.num_tokens; ++t) {
      bool here = false;
      for (size_t q = 0; q < k; ++q)
        here = here || (src.idx[t * k + q] >= 0 && run.rank_of(src.idx[t * k + q]) == run.rank);
      if (!here) continue;
      if (i >= run.num_recv)
        return fmt::format("received {} tokens, fewer than expected\n", run.num_recv);
      const auto where = fmt::format("received token {} (token {} of rank {})", i, t, s);
      if (std::memcmp(&run.recv_x[i * xb], &src.x[t * xb], xb) != 0) return where + ": x differs\n";
      const size_t ns = h / CHORUS_EP_FP8_BLOCK;
      if (c.dtype == ncclFloat8e4m3 &&
          std::memcmp(&run.recv_scales[i * ns], &src.scales[t * ns], ns * 4) != 0)
        return where + ": scales differ\n";
      for (size_t q = 0; q < k; ++q) {
        const int64_t e = src.idx[t * k + q];
        const bool local = e >= 0 && run.rank_of(e) == run.rank;
        const int64_t want_idx = local ? e - first : -1;
        const float want_w = local ? src.w[t * k + q] : 0.0f;
        if (run.recv_idx[i * k + q] != want_idx || run.recv_w[i * k + q] != want_w)
          return fmt::format("{} slot {}: index {} weight {}, expected {} {}\n", where, q,
                             run.recv_idx[i * k + q], run.recv_w[i * k + q], want_idx, want_w);
        if (local) ++per_expert[static_cast<size_t>(want_idx)];
      }
      ++i;
    }
  }
  if (i != run.num_recv) return fmt::format("received {} tokens, expected {}\n", run.num_recv, i);
  const auto a = static_cast<size_t>(c.alignment);
  for (size_t e = 0; e < per_expert.size(); ++e)
    if (static_cast<size_t>(run.recv_per_expert[e]) != (per_expert[e] + a - 1) / a * a)
      return fmt::format("numRecvTokensPerExpert[{}] is {}, expected {} ({} aligned to {})\n", e,
                         run.recv_per_expert[e], (per_expert[e] + a - 1) / a * a, per_expert[e], a);
  return "";
}

// The experts of this rank on what arrived, then combine; checked against the sum at the source.
std::string combine(chorusEpBuffer_t b, const Run& run, bool with_weights) {
  const auto& c = run.c;
  const size_t k = static_cast<size_t>(c.topk), h = c.hidden, ce = elem_size(c.combine_dtype);
  const int64_t first = static_cast<int64_t>(c.local_experts) * run.rank;
  std::vector<uint8_t> y(std::max<size_t>(run.num_recv, 1) * h * ce);
  std::vector<float> v(h), out(h);
  std::vector<int64_t> global(k);
  for (size_t i = 0; i < run.num_recv; ++i) {
    for (size_t ch = 0; ch < h; ++ch)
      v[ch] = load(c, run.recv_x.data(), run.recv_scales.data(), i, ch);
    for (size_t q = 0; q < k; ++q)
      global[q] = run.recv_idx[i * k + q] >= 0 ? first + run.recv_idx[i * k + q] : -1;
    partial(c, v, global.data(), &run.recv_w[i * k], out);
    for (size_t ch = 0; ch < h; ++ch) store(c.combine_dtype, y, i * h + ch, out[ch]);
  }
  const auto& in = run.mine();
  std::vector<uint8_t> got(std::max<size_t>(in.num_tokens, 1) * h * ce, 0xcd);
  std::vector<float> got_w(std::max<size_t>(in.num_tokens, 1) * k, -9.0f);
  ncclResult_t r = chorusEpCombineAsync(b, run.handle, y.data(), c.combine_dtype,
                                        with_weights ? run.recv_w.data() : nullptr, got.data(),
                                        with_weights ? got_w.data() : nullptr, run.stream);
  if (r != ncclSuccess) return nccl_error("chorusEpCombine", r);
  if (std::string f = wait_queued(run); !f.empty()) return f;
  // The reference: each token's rank results added in float in ascending rank order.
  std::vector<uint8_t> want(got.size(), 0);
  std::vector<float> acc(h);
  for (size_t t = 0; t < in.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t ch = 0; ch < h; ++ch) v[ch] = load(c, in.x.data(), in.scales.data(), t, ch);
    for (int q = 0; q < run.nranks; ++q) {
      bool any = false;
      for (size_t s = 0; s < k; ++s) {
        const int64_t e = in.idx[t * k + s];
        global[s] = e >= 0 && run.rank_of(e) == q ? e : -1;
        any = any || global[s] >= 0;
      }
      if (!any) continue;
      partial(c, v, global.data(), &in.w[t * k], out);
      for (size_t ch = 0; ch < h; ++ch) acc[ch] += out[ch];
    }
    for (size_t ch = 0; ch < h; ++ch) store(c.combine_dtype, want, t * h + ch, acc[ch]);
    // And the weighted sum itself, in double: within the roundings' bound.
    for (size_t ch = 0; ch < h; ++ch) {
      double sum = 0, mag = 0;
      for (size_t s = 0; s < k; ++s) {
        const int64_t e = in.idx[t * k + s];
        if (e < 0) continue;
        const double term = static_cast<double>(in.w[t * k + s]) * expert(e, v[ch]);
        sum += term;
        mag += std::fabs(term);
      }
      const double tol = (c.combine_dtype == ncclBfloat16 ? 0x1p-6 : 0x1p-17) * mag + 1e-30;
      if (std::fabs(static_cast<double>(acc[ch]) - sum) > tol)
        return fmt::format("token {} channel {}: combined {} is not the weighted sum {}\n", t, ch,
                           acc[ch], sum);
    }
    for (size_t s = 0; with_weights && s < k; ++s) {
      const float want_w = in.idx[t * k + s] >= 0 ? in.w[t * k + s] : 0.0f;
      if (got_w[t * k + s] != want_w)
        return fmt::format("token {} slot {}: combined weight {}, expected {}\n", t, s,
                           got_w[t * k + s], want_w);
    }
  }
  if (in.num_tokens > 0 && std::memcmp(got.data(), want.data(), in.num_tokens * h * ce) != 0) {
    for (size_t i = 0; i < in.num_tokens * h * ce; ++i)
      if (got[i] != want[i])
        return fmt::format("combined token {} differs from the reference (byte {})\n", i / (h * ce),
                           i);
  }
  return "";
}

std::vector<EpCase> matrix_cases(int nranks, uint64_t seed) {
  std::vector<EpCase> cases;
  const Routing routings[] = {Routing::kUniform, Routing::kSkewed, Routing::kHotExpert,
                              Routing::kFewerThanTopk, Routing::kSomeReceiveNothing};
  const ncclDataType_t dtypes[] = {ncclFloat32, ncclBfloat16, ncclFloat8e4m3};
  int i = 0;
  for (auto dt : dtypes)
    for (auto r : routings) {
      EpCase c;
      c.routing = r;
      c.dtype = dt;
      c.combine_dtype = dt == ncclFloat32 ? ncclFloat32 : ncclBfloat16;
      c.hidden = dt == ncclFloat8e4m3 ? 256 : (i % 2 ? 136 : 77);
      c.topk = i % 3 == 0 ? 1 + (nranks > 4) : (i % 3 == 1 ? 4 : 6);
      c.local_experts = i % 2 ? 3 : 2;
      c.max_tokens = 40 + static_cast<size_t>(i % 4) * 7;
      c.alignment = i % 3 == 0 ? 1 : (i % 3 == 1 ? 4 : 8);
      c.pass_layout = i % 2 == 0;
      c.seed = seed + static_cast<uint64_t>(i) * 31;
      cases.push_back(c);
      ++i;
    }
  // A BF16 dispatch combined in FP32, and FP32 combined in BF16.
  cases.push_back(cases[5]);
  cases.back().combine_dtype = ncclFloat32;
  cases.push_back(cases[1]);
  cases.back().combine_dtype = ncclBfloat16;
  // DeepEP's shape (hidden 7168, top-8, FP8 dispatch, BF16 combine): messages of many chunks.
  EpCase big{Routing::kSkewed, ncclFloat8e4m3, ncclBfloat16, 7168, 8, 4, 48, 16, true, seed + 999};
  cases.push_back(big);
  // Many tokens of a few channels: hundreds of rows between each pair of ranks.
  EpCase many{Routing::kUniform, ncclBfloat16, ncclBfloat16, 40, 2, 2, 1500, 1, false, seed + 555};
  cases.push_back(many);
  return cases;
}

// A buffer of the size hint that fits every run's dispatch.
std::string make_buffer(ncclComm_t comm, const std::vector<const Run*>& runs, chorusEpBuffer_t* b) {
  size_t bytes = 0;
  for (const Run* run : runs) {
    size_t need = 0;
    ncclResult_t r =
        chorusEpBufferSizeHint(run->nranks, max_tokens(*run), run->c.hidden, run->c.topk, &need);
    if (r != ncclSuccess) return nccl_error("chorusEpBufferSizeHint", r);
    bytes = std::max(bytes, need);
  }
  ncclResult_t r = chorusEpBufferCreate(comm, bytes, b);
  return r == ncclSuccess ? "" : nccl_error("chorusEpBufferCreate", r);
}

// A host stream for a test's asynchronous calls, destroyed (its error checked) at the end.
class TestStream {
 public:
  explicit TestStream(bool wanted) {
    if (wanted && chorusStreamCreate(&s_) != ncclSuccess) s_ = nullptr, failed_ = true;
  }
  ~TestStream() {
    if (s_ != nullptr) chorusStreamDestroy(s_);
  }
  chorusStream_t get() const { return s_; }
  // "" or what failed (creating it, or the work queued on it).
  std::string close() {
    if (failed_) return "chorusStreamCreate failed\n";
    if (s_ == nullptr) return "";
    const ncclResult_t r = chorusStreamDestroy(s_);
    s_ = nullptr;
    return r == ncclSuccess ? "" : nccl_error("chorusStreamDestroy", r);
  }

 private:
  chorusStream_t s_ = nullptr;
  bool failed_ = false;
};

std::string run_case(ncclComm_t comm, const EpCase& c, int rank, int nranks, bool async,
                     bool allocate = false) {
  Run run = make_run(c, rank, nranks);
  TestStream stream(async);
  run.stream = stream.get();
  run.allocate = allocate;
  chorusEpBuffer_t b = nullptr;
  std::string f = make_buffer(comm, {&run}, &b);
  if (f.empty()) f = dispatch(b, run);
  if (f.empty()) f = check_received(run);
  if (f.empty()) f = combine(b, run, /*with_weights=*/true);
  if (run.handle != nullptr && chorusEpHandleDestroy(run.handle) != ncclSuccess && f.empty())
    f = "handle destroy\n";
  if (b != nullptr && chorusEpBufferDestroy(b) != ncclSuccess && f.empty()) f = "buffer destroy\n";
  if (f.empty()) f = stream.close();
  return f.empty() ? ""
                   : c.describe() + (async ? " (on a stream)" : "") +
                         (allocate ? " (outputs allocated by the callback)" : "") + ": " + f;
}

// Two dispatches alive at once on one buffer, combined in reverse order, one of them twice and
// once without weights.
std::string run_two_handles(ncclComm_t comm, const EpCase& c1, const EpCase& c2, int rank,
                            int nranks, bool async) {
  Run a = make_run(c1, rank, nranks), b2 = make_run(c2, rank, nranks);
  TestStream stream(async);
  a.stream = b2.stream = stream.get();
  chorusEpBuffer_t b = nullptr;
  std::string f = make_buffer(comm, {&a, &b2}, &b);
  if (f.empty()) f = dispatch(b, a);
  if (f.empty()) f = dispatch(b, b2);
  if (f.empty()) f = check_received(a) + check_received(b2);
  if (f.empty()) f = combine(b, b2, true);
  if (f.empty()) f = combine(b, a, false);
  if (f.empty()) f = combine(b, a, true);
  for (Run* r : {&a, &b2})
    if (r->handle != nullptr && chorusEpHandleDestroy(r->handle) != ncclSuccess && f.empty())
      f = "handle destroy\n";
  if (b != nullptr && chorusEpBufferDestroy(b) != ncclSuccess && f.empty()) f = "buffer destroy\n";
  if (f.empty()) f = stream.close();
  return f.empty() ? "" : std::string("two handles") + (async ? " (on a stream)" : "") + ": " + f;
}

// A refused call: the `culprit` rank (-1: every rank) fails with `code` and a message
// containing `text`; the others with ncclInvalidArgument naming the culprit.
std::string expect_refused(const char* what, ncclResult_t r, int rank, int culprit,
                           const std::string& text, ncclResult_t code = ncclInvalidArgument) {
  const std::string msg = ncclGetLastError(nullptr);
  const bool mine = culprit < 0 || culprit == rank;
  const std::string want = mine ? text : fmt::format("refused on rank(s) {}", culprit);
  const ncclResult_t want_code = mine ? code : ncclInvalidArgument;
  if (r != want_code || msg.find(want) == std::string::npos)
    return fmt::format("{}: got {} \"{}\", expected {} with \"{}\"\n", what,
                       ncclGetErrorString(r), msg, ncclGetErrorString(want_code), want);
  return "";
}

EpCase small_case(uint64_t seed) {
  EpCase c{};
  c.routing = Routing::kUniform;
  c.dtype = ncclFloat32;
  c.combine_dtype = ncclFloat32;
  c.hidden = 64;
  c.topk = 2;
  c.local_experts = 2;
  c.max_tokens = 40;
  c.alignment = 1;
  c.pass_layout = true;
  c.seed = seed;
  return c;
}

// A dispatch of the small case with `edit` applied to its arguments first; its result.
template <typename Edit>
ncclResult_t bad_dispatch(chorusEpBuffer_t b, Run& run, Edit edit) {
  Prepared p;
  if (!prepare(b, run, p).empty()) return ncclInternalError;
  edit(p);
  chorusEpHandle_t h = nullptr;
  const ncclResult_t r = chorusEpDispatch(b, &p.a, &p.o, &h);
  if (h != nullptr) chorusEpHandleDestroy(h);
  return r;
}

std::string bad_dispatches(chorusEpBuffer_t b, int rank, int nranks) {
  Run run = make_run(small_case(5), rank, nranks);
  const int experts = run.c.local_experts * nranks;
  std::string f;
  std::vector<int64_t> idx = run.mine().idx;
  idx[3 * 2 + 1] = experts;
  f += expect_refused(
      "expert index numExperts on rank 0",
      bad_dispatch(b, run,
                   [&](Prepared& p) {
                     p.a.numTokensPerRank = nullptr, p.a.numTokensPerExpert = nullptr,
                     p.a.isTokenInRank = nullptr;
                     if (rank == 0) p.a.topkIdx = idx.data();
                   }),
      rank, 0,
      fmt::format("token 3 slot 1: expert index {} is outside [-1, {})", experts, experts));
  idx = run.mine().idx;
  idx[0] = -2;
  f += expect_refused("expert index -2 everywhere",
                      bad_dispatch(b, run,
                                   [&](Prepared& p) {
                                     p.a.numTokensPerRank = nullptr,
                                     p.a.numTokensPerExpert = nullptr, p.a.isTokenInRank = nullptr;
                                     p.a.topkIdx = idx.data();
                                   }),
                      rank, -1, "token 0 slot 0: expert index -2");
  f += expect_refused("FP8 with hidden 100",
                      bad_dispatch(b, run,
                                   [&](Prepared& p) {
                                     p.a.datatype = ncclFloat8e4m3, p.a.hidden = 100,
                                     p.a.xScales = p.a.topkWeights;
                                   }),
                      rank, -1, "hidden 100 is not a multiple of 128");
  f += expect_refused("numExperts not a multiple of nranks",
                      bad_dispatch(b, run, [&](Prepared& p) { p.a.numExperts = 2 * nranks + 1; }),
                      rank, -1, "is not a multiple of the communicator's");
  f += expect_refused("float16",
                      bad_dispatch(b, run, [&](Prepared& p) { p.a.datatype = ncclFloat16; }), rank,
                      -1, "datatype 6 is not supported");
  f += expect_refused("recvCapacity 1 on rank 1",
                      bad_dispatch(b, run,
                                   [&](Prepared& p) {
                                     if (rank == 1) p.o.recvCapacity = 1;
                                   }),
                      rank, 1, "recvCapacity 1");
  f += expect_refused("layout not matching topkIdx on rank 0",
                      bad_dispatch(b, run,
                                   [&](Prepared& p) {
                                     if (rank == 0) ++p.per_rank[0];
                                   }),
                      rank, 0, "numTokensPerRank[0] is");
  f += expect_refused("hidden differs",
                      bad_dispatch(b, run,
                                   [&](Prepared& p) {
                                     if (rank == 1) p.a.hidden = 32;
                                   }),
                      rank, -1, "hidden differs between ranks: 64 on rank 0, 32 on rank 1");
  return f;
}

std::string bad_combines(chorusEpBuffer_t b, ncclComm_t comm, int rank, int nranks) {
  Run run = make_run(small_case(9), rank, nranks);
  std::string f = dispatch(b, run);
  if (!f.empty()) return "dispatch for the combine checks: " + f;
  std::vector<float> y(std::max<size_t>(run.num_recv, 1) * run.c.hidden, 0.5f);
  std::vector<float> out(std::max<size_t>(run.mine().num_tokens, 1) * run.c.hidden);
  f += expect_refused(
      "combine in FP8",
      chorusEpCombine(b, run.handle, y.data(), ncclFloat8e4m3, nullptr, out.data(), nullptr), rank,
      -1, "not supported by combine");
  chorusEpBuffer_t other = nullptr;
  if (chorusEpBufferCreate(comm, 1 << 16, &other) != ncclSuccess) return f + "second buffer\n";
  f += expect_refused(
      "handle of another buffer",
      chorusEpCombine(other, run.handle, y.data(), ncclFloat32, nullptr, out.data(), nullptr), rank,
      -1, "comes from the dispatch of another buffer");
  chorusEpBufferDestroy(other);
  if (chorusEpHandleDestroy(nullptr) != ncclSuccess)
    f += "chorusEpHandleDestroy(NULL) failed: like free(NULL) it must do nothing\n";
  if (rank == 0) chorusEpHandleDestroy(run.handle);
  f += expect_refused(
      "destroyed handle on rank 0",
      chorusEpCombine(b, run.handle, y.data(), ncclFloat32, nullptr, out.data(), nullptr), rank, 0,
      "is not a live chorusEpHandle_t");
  if (rank != 0) chorusEpHandleDestroy(run.handle);
  return f;
}

std::string bad_sizes(ncclComm_t comm, int rank, int nranks) {
  Run run = make_run(small_case(13), rank, nranks);
  size_t bytes = 0;
  chorusEpBuffer_t b = nullptr;
  if (chorusEpBufferSizeHint(nranks, 2, run.c.hidden, run.c.topk, &bytes) != ncclSuccess ||
      chorusEpBufferCreate(comm, bytes, &b) != ncclSuccess)
    return "small buffer\n";
  // Rank 0 passes its 20..40 tokens to a buffer sized for 2: it names the hint it needs (the
  // others may be refused for what they would receive, or name rank 0).
  Prepared p;
  std::string f = prepare(b, run, p);
  chorusEpHandle_t h = nullptr;
  if (rank != 0)
    p.a.numTokens = 0, p.a.numTokensPerRank = nullptr, p.a.numTokensPerExpert = nullptr,
    p.a.isTokenInRank = nullptr;
  const ncclResult_t r = chorusEpDispatch(b, &p.a, &p.o, &h);
  const std::string msg = ncclGetLastError(nullptr);
  const std::string hint =
      fmt::format("chorusEpBufferSizeHint(nranks {}, maxTokens {}", nranks, run.mine().num_tokens);
  if (rank == 0 && (r != ncclInvalidArgument || msg.find(hint) == std::string::npos))
    f += fmt::format("too many tokens: got {} \"{}\", expected the hint \"{}\"\n",
                     ncclGetErrorString(r), msg, hint);
  if (rank != 0 && r != ncclInvalidArgument)
    f += fmt::format("too many tokens on rank 0: rank {} got {}\n", rank, ncclGetErrorString(r));
  chorusEpBufferDestroy(b);
  // The layout call checks alone (no communication).
  std::vector<int64_t> idx = {0, -5};
  std::vector<int> per_rank(static_cast<size_t>(nranks));
  f += expect_refused(
      "layout on a destroyed buffer",
      chorusEpGetDispatchLayout(b, idx.data(), 1, 2, 2 * nranks, per_rank.data(), nullptr, nullptr),
      rank, -1, "is not a live chorusEpBuffer_t");
  return f;
}

}  // namespace

std::string check_ep_bad_input(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  chorusEpBuffer_t b = nullptr;
  size_t bytes = 0;
  if (chorusEpBufferSizeHint(nranks, 64, 128, 4, &bytes) != ncclSuccess ||
      chorusEpBufferCreate(comm, bytes, &b) != ncclSuccess)
    return nccl_error("buffer", ncclInternalError);
  std::vector<int64_t> idx = {0, -5};
  std::vector<int> per_rank(static_cast<size_t>(nranks));
  std::string f = expect_refused(
      "layout of expert -5",
      chorusEpGetDispatchLayout(b, idx.data(), 1, 2, 2 * nranks, per_rank.data(), nullptr, nullptr),
      rank, -1, "token 0 slot 1: expert index -5");
  f += expect_refused(
      "topk 0",
      chorusEpGetDispatchLayout(b, idx.data(), 1, 0, 2 * nranks, per_rank.data(), nullptr, nullptr),
      rank, -1, "topk is 0");
  f += bad_dispatches(b, rank, nranks);
  f += bad_combines(b, comm, rank, nranks);
  {
    // A stream that is not one, on rank 0 only: refused there, and the others name rank 0.
    Run run = make_run(small_case(7), rank, nranks);
    Prepared p;
    f += prepare(b, run, p);
    chorusEpHandle_t h = nullptr;
    int bogus = 0;
    const auto stream = rank == 0 ? reinterpret_cast<chorusStream_t>(&bogus) : nullptr;
    const ncclResult_t r = chorusEpDispatchAsync(b, &p.a, &p.o, &h, stream);
    if (h != nullptr) chorusEpHandleDestroy(h);
    f += expect_refused("dispatch on a bad stream on rank 0", r, rank, 0,
                        "was not created by chorusStreamCreate");
  }
  chorusEpBufferDestroy(b);
  f += bad_sizes(comm, rank, nranks);
  // Still usable: a whole dispatch and combine, and a plain collective.
  f += run_case(comm, small_case(21), rank, nranks, /*async=*/false);
  float x = 1.5f;
  if (ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr) != ncclSuccess ||
      x != 1.5f * static_cast<float>(nranks))
    f += "AllReduce after the refused calls failed\n";
  return f;
}

std::string check_ep_async(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  EpCase c = small_case(33);
  c.dtype = c.combine_dtype = ncclBfloat16;
  c.hidden = 136;
  Run run = make_run(c, rank, nranks);
  TestStream stream(true);
  run.stream = stream.get();
  chorusEpBuffer_t b = nullptr;
  std::string f = make_buffer(comm, {&run}, &b);
  if (!f.empty()) return f;
  // x holds zeros until a host function queued on the stream before the dispatch, after a
  // pause, writes the tokens: a dispatch that read x at once would send zeros.
  std::vector<uint8_t>& x = run.all[static_cast<size_t>(rank)].x;
  const std::vector<uint8_t> tokens = x;
  std::fill(x.begin(), x.end(), 0);
  struct Fill {
    std::vector<uint8_t>* dst;
    const std::vector<uint8_t>* src;
  } fill{&x, &tokens};
  chorusLaunchHostFunc(
      run.stream,
      [](void* arg) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        auto* fl = static_cast<Fill*>(arg);
        std::memcpy(fl->dst->data(), fl->src->data(), fl->src->size());
      },
      &fill);
  // The count of received tokens is known when the call returns.
  size_t expected = 0;
  for (const RankInput& in : run.all)
    for (size_t t = 0; t < in.num_tokens; ++t)
      for (int s = 0; s < c.topk; ++s) {
        const int64_t e = in.idx[t * static_cast<size_t>(c.topk) + static_cast<size_t>(s)];
        if (e >= 0 && run.rank_of(e) == rank) {
          ++expected;
          break;
        }
      }
  Prepared p;
  f = prepare(b, run, p);
  ncclResult_t r = chorusEpDispatchAsync(b, &p.a, &p.o, &run.handle, run.stream);
  if (f.empty() && r != ncclSuccess) f = nccl_error("chorusEpDispatchAsync", r);
  if (f.empty() && p.o.numRecvTokens != expected)
    f = fmt::format("numRecvTokens {} on return, expected {}\n", p.o.numRecvTokens, expected);
  run.num_recv = p.o.numRecvTokens;
  if (f.empty()) f = wait_queued(run);
  if (f.empty()) f = check_received(run);
  if (f.empty()) f = combine(b, run, /*with_weights=*/true);
  if (run.handle != nullptr) chorusEpHandleDestroy(run.handle);
  if (chorusEpBufferDestroy(b) != ncclSuccess && f.empty()) f = "buffer destroy\n";
  if (f.empty()) f = stream.close();
  return f.empty() ? "" : "asynchronous dispatch in stream order: " + f;
}

std::string check_ep_matrix(ncclComm_t comm, uint64_t seed) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  std::string f;
  const auto cases = matrix_cases(nranks, seed);
  for (bool async : {false, true}) {
    for (const auto& c : cases) f += run_case(comm, c, rank, nranks, async);
    f += run_two_handles(comm, cases[0], cases[11], rank, nranks, async);
    // Outputs allocated during the call (out.allocate): FP32 with ranks that receive nothing
    // (allocate called for 0 rows), BF16 skewed, FP8 with its scales.
    for (size_t i : {size_t{4}, size_t{6}, size_t{11}})
      f += run_case(comm, cases[i], rank, nranks, async, /*allocate=*/true);
  }
  return f;
}

std::string check_ep_allocate(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess)
    return "comm query failed\n";
  const EpCase c = small_case(41);
  chorusEpBuffer_t b = nullptr;
  size_t bytes = 0;
  if (chorusEpBufferSizeHint(nranks, c.max_tokens, c.hidden, c.topk, &bytes) != ncclSuccess ||
      chorusEpBufferCreate(comm, bytes, &b) != ncclSuccess)
    return nccl_error("buffer", ncclInternalError);
  const int culprit = nranks - 1;
  std::string f;
  for (bool async : {false, true}) {
    TestStream stream(async);
    const char* mode = async ? " (on a stream)" : "";
    // Run `run`'s dispatch with `edit` applied to its arguments; its result, and no handle.
    const auto refused_dispatch = [&](Run& run, auto edit) {
      Prepared p;
      f += prepare(b, run, p);
      edit(p);
      chorusEpHandle_t h = nullptr;
      const ncclResult_t r = chorusEpDispatchAsync(b, &p.a, &p.o, &h, run.stream);
      if (h != nullptr) {
        f += fmt::format("a refused dispatch{} returned a handle\n", mode);
        chorusEpHandleDestroy(h);
      }
      return r;
    };
    Run run = make_run(c, rank, nranks);
    run.stream = stream.get();
    run.allocate = true;
    run.fail_allocate = rank == culprit ? 7 : 0;
    ncclResult_t r = refused_dispatch(run, [](Prepared&) {});
    f += expect_refused(
        async ? "allocate failing on the last rank (on a stream)"
              : "allocate failing on the last rank",
        r, rank, culprit,
        fmt::format("the allocate callback of chorusEpDispatchOutput_t failed on rank {} for {} "
                    "tokens (it returned 7)",
                    culprit, run.allocated),
        ncclSystemError);
    if (run.allocate_calls != 1)
      f += fmt::format("allocate called {} times in a call it refused{}\n", run.allocate_calls,
                       mode);
    run.fail_allocate = 0;
    run.short_capacity = rank == 0;
    r = refused_dispatch(run, [](Prepared&) {});
    f += expect_refused(
        async ? "allocate giving too few rows on rank 0 (on a stream)"
              : "allocate giving too few rows on rank 0",
        r, rank, 0,
        fmt::format("tokens arrive on rank 0 but the allocate callback set recvCapacity {} rows",
                    run.allocated - 1));
    // A rank that refuses before knowing the count allocates nothing.
    run.short_capacity = false;
    std::vector<int64_t> idx = run.mine().idx;
    idx[1] = 1000;
    r = refused_dispatch(run, [&](Prepared& p) {
      if (rank == 0) p.a.topkIdx = idx.data();
    });
    f += expect_refused(async ? "expert 1000 on rank 0 (on a stream)" : "expert 1000 on rank 0", r,
                        rank, 0, "token 0 slot 1: expert index 1000");
    if (rank == 0 && run.allocate_calls != 0)
      f += fmt::format("allocate called on a rank that refused the call{}\n", mode);
    // The buffer and communicator are usable: the next dispatch and its combine are right.
    Run next = make_run(small_case(43), rank, nranks);
    next.stream = stream.get();
    next.allocate = true;
    std::string g = dispatch(b, next);
    if (g.empty()) g = check_received(next);
    if (g.empty()) g = combine(b, next, /*with_weights=*/true);
    if (next.handle != nullptr) chorusEpHandleDestroy(next.handle);
    if (g.empty()) g = stream.close();
    if (!g.empty()) f += fmt::format("the dispatch after the refused ones{}: {}", mode, g);
  }
  if (chorusEpBufferDestroy(b) != ncclSuccess) f += "buffer destroy\n";
  return f;
}

}  // namespace chorus::test
