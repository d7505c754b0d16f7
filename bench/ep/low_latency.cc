// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/low_latency.cc
// ep_bench --mode ll (low_latency.h): the check, then the timed steps of low-latency mode.
#include "bench/ep/low_latency.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/ep/baseline.h"

namespace chorus::bench::ep {
namespace {

// chorusEpLowLatencyDispatch + Combine with this rank's inputs and output arrays.
struct LowLatencyEp {
  chorusEpBuffer_t buffer;
  chorusEpLowLatencyDispatchArgs_t args{};
  chorusEpLowLatencyDispatchOutput_t out{};
  chorusEpHandle_t handle = nullptr;
  chorusEpHook_t hook = nullptr;

  LowLatencyEp(chorusEpBuffer_t b, const Shape& s, const RankTokens& in, LowLatencyReceived& recv)
      : buffer(b) {
    args.x = in.x.data();
    args.datatype = ncclBfloat16;
    args.numTokens = s.tokens;
    args.hidden = s.hidden;
    args.topkIdx = in.topk_idx.data();
    args.topk = s.topk;
    args.numExperts = s.experts;
    args.maxTokensPerRank = s.tokens;
    args.useFp8 = s.dtype == ncclFloat8e4m3 ? 1 : 0;
    out.recvX = recv.x.get();
    out.recvXScales = recv.scales.get();
    out.recvCount = recv.count.data();
    out.recvSrcInfo = recv.src_info.get();
  }
  ~LowLatencyEp() {
    if (handle != nullptr) chorusEpHandleDestroy(handle);
  }
  LowLatencyEp(const LowLatencyEp&) = delete;
  LowLatencyEp& operator=(const LowLatencyEp&) = delete;

  // With `with_hook` the call returns a hook, for wait().
  ncclResult_t dispatch(bool with_hook) {
    if (handle != nullptr) chorusEpHandleDestroy(handle);
    handle = nullptr;
    return chorusEpLowLatencyDispatch(buffer, &args, &out, with_hook ? 1 : 0, &handle, &hook);
  }
  ncclResult_t combine(const uint16_t* x, const float* weights, uint16_t* combined,
                       bool with_hook) {
    return chorusEpLowLatencyCombine(buffer, handle, x, ncclBfloat16, weights, combined,
                                     with_hook ? 1 : 0, &hook);
  }
  ncclResult_t wait() {
    chorusEpHook_t h = hook;
    hook = nullptr;
    return chorusEpHookWait(h);
  }
};

// This rank's inputs: BF16 tokens (the dispatch casts them with FP8), and as DeepEP's test, 10
// random (token, slot) pairs set to -1.
RankTokens make_low_latency_tokens(const Shape& s, uint64_t seed, int rank) {
  Shape bf16 = s;
  bf16.dtype = ncclBfloat16;
  RankTokens in = make_tokens(bf16, seed, rank);
  std::mt19937_64 gen(seed * 1000003u + static_cast<uint64_t>(rank) + 17);
  for (int i = 0; i < 10; ++i)
    in.topk_idx[gen() % s.tokens * static_cast<size_t>(s.topk) +
                gen() % static_cast<size_t>(s.topk)] = -1;
  return in;
}

// Rows in which two dispatches' outputs differ, or 1 for different counts.
int64_t differences(const LowLatencyReceived& a, const LowLatencyReceived& b) {
  if (a.count != b.count) return 1;
  int64_t wrong = 0;
  for (size_t e = 0; e < a.count.size(); ++e)
    for (size_t j = 0; j < static_cast<size_t>(a.count[e]); ++j) {
      const size_t row = e * a.rows_per_expert + j;
      wrong += std::memcmp(a.x.get() + row * a.x_row, b.x.get() + row * b.x_row, a.x_row) != 0 ||
               (a.blocks > 0 &&
                std::memcmp(a.scales.get() + row * a.blocks, b.scales.get() + row * b.blocks,
                            a.blocks * sizeof(float)) != 0) ||
               a.src_info[row] != b.src_info[row];
    }
  return wrong;
}

// Overwrites what a dispatch wrote (counts and filled rows), so a call that writes nothing fails
// the check.
void poison(LowLatencyReceived& r) {
  for (size_t e = 0; e < r.count.size(); ++e) {
    const size_t rows = static_cast<size_t>(std::max(r.count[e], 0));
    const size_t first = e * r.rows_per_expert;
    std::memset(r.x.get() + first * r.x_row, 0x5a, rows * r.x_row);
    if (r.blocks > 0) std::fill_n(r.scales.get() + first * r.blocks, rows * r.blocks, -1.0f);
    std::fill_n(r.src_info.get() + first, rows, -1);
    r.count[e] = -1;
  }
}

// The experts' output [L, R, hidden]: random BF16 rows where the dispatch filled rows.
void fill_expert_output(const LowLatencyReceived& r, size_t hidden, uint64_t seed, int rank,
                        uint16_t* out) {
  size_t total = 0;
  for (int c : r.count) total += static_cast<size_t>(c);
  const std::vector<uint16_t> rows = make_expert_output(total, hidden, seed, rank);
  size_t next = 0;
  for (size_t e = 0; e < r.count.size(); ++e)
    for (size_t j = 0; j < static_cast<size_t>(r.count[e]); ++j, ++next)
      std::memcpy(out + (e * r.rows_per_expert + j) * hidden, rows.data() + next * hidden,
                  hidden * sizeof(uint16_t));
}

LowLatencyFigures summarize(Rank& r, const Shape& s, std::vector<double> (&seconds)[kNumLlSteps],
                            int64_t pairs) {
  // DeepEP's bytes (test_low_latency.py) per valid (token, expert) pair of this rank's tokens.
  const size_t meta = 16;
  const size_t dispatch_pair = s.dtype == ncclFloat8e4m3
                                   ? s.hidden + s.hidden / kFp8Block * sizeof(float) + meta
                                   : s.hidden * sizeof(uint16_t) + meta;
  const size_t combine_pair = s.hidden * sizeof(uint16_t);
  LowLatencyFigures f{};
  double inverse_gbps[kNumLlSteps], neg_min[kNumLlSteps];
  for (int i = 0; i < kNumLlSteps; ++i) {
    auto& v = seconds[i];  // reordered: the median (the upper one of an even count)
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    const double median = v[v.size() / 2];
    f.median_us[i] = median * 1e6;
    double sum = 0;
    for (double x : v) sum += x;
    const double mean = sum / static_cast<double>(v.size());
    f.mean_us[i] = mean * 1e6;
    neg_min[i] = -*std::min_element(v.begin(), v.end()) * 1e6;
    f.max_us[i] = *std::max_element(v.begin(), v.end()) * 1e6;
    const bool rate =
        i == kLlDispatch || i == kLlCombine || i == kLlBaseDispatch || i == kLlBaseCombine;
    const bool dispatch = i == kLlDispatch || i == kLlBaseDispatch;
    const double bytes =
        static_cast<double>(pairs) * static_cast<double>(dispatch ? dispatch_pair : combine_pair);
    inverse_gbps[i] = rate && bytes > 0 ? median * 1e9 / bytes : 0;
  }
  r.all_reduce(f.median_us, kNumLlSteps, ncclFloat64, ncclMax);
  r.all_reduce(f.mean_us, kNumLlSteps, ncclFloat64, ncclMax);
  r.all_reduce(f.max_us, kNumLlSteps, ncclFloat64, ncclMax);
  r.all_reduce(neg_min, kNumLlSteps, ncclFloat64, ncclMax);
  r.all_reduce(inverse_gbps, kNumLlSteps, ncclFloat64, ncclMax);
  for (int i = 0; i < kNumLlSteps; ++i) {
    f.min_us[i] = -neg_min[i];
    f.gbps[i] = inverse_gbps[i] > 0 ? 1 / inverse_gbps[i] : 0;
  }
  int64_t p[2] = {pairs, -pairs};
  r.all_reduce(p, 2, ncclInt64, ncclMax);
  f.pairs_max = p[0];
  f.pairs_min = -p[1];
  return f;
}

}  // namespace

LowLatencyFigures run_low_latency(Rank& r, chorusEpBuffer_t buffer, const Shape& s) {
  const RankTokens in = make_low_latency_tokens(s, r.opt.seed, r.rank);
  const int64_t pairs =
      std::count_if(in.topk_idx.begin(), in.topk_idx.end(), [](int64_t e) { return e >= 0; });
  LowLatencyReceived ep_recv(s, r.nranks), base_recv(s, r.nranks);
  LowLatencyEp ep(buffer, s, in, ep_recv);
  LowLatencyBaseline base(r.comm, r.rank, r.nranks, s);
  const size_t rows = ep_recv.count.size() * ep_recv.rows_per_expert;
  const std::unique_ptr<uint16_t[]> expert_out = untouched<uint16_t>(rows * s.hidden);
  std::vector<uint16_t> ep_combined(s.tokens * s.hidden), base_combined(s.tokens * s.hidden);
  const float* weights = in.topk_weights.data();
  const char* what = s.dtype == ncclFloat8e4m3 ? "ll fp8" : "ll bf16";

  // The check: blocking calls, then hooked ones into poisoned outputs, against the baseline.
  check(r.rank, ep.dispatch(false), "chorusEpLowLatencyDispatch");
  check(r.rank, base.dispatch(in, base_recv), "baseline dispatch");
  int64_t wrong = differences(ep_recv, base_recv);
  if (wrong == 0) {
    fill_expert_output(ep_recv, s.hidden, r.opt.seed, r.rank, expert_out.get());
    check(r.rank, ep.combine(expert_out.get(), weights, ep_combined.data(), false),
          "chorusEpLowLatencyCombine");
    check(r.rank, base.combine(expert_out.get(), weights, base_combined.data()),
          "baseline combine");
    wrong += ep_combined != base_combined;
    poison(ep_recv);
    check(r.rank, ep.dispatch(true), "chorusEpLowLatencyDispatch (hook)");
    check(r.rank, ep.wait(), "chorusEpHookWait (dispatch)");
    wrong += differences(ep_recv, base_recv);
    std::fill(ep_combined.begin(), ep_combined.end(), uint16_t{0x7fc1});
    check(r.rank, ep.combine(expert_out.get(), weights, ep_combined.data(), true),
          "chorusEpLowLatencyCombine (hook)");
    check(r.rank, ep.wait(), "chorusEpHookWait (combine)");
    wrong += ep_combined != base_combined;
  }
  r.all_reduce(&wrong, 1, ncclInt64, ncclSum);
  if (wrong != 0)
    fail(r.rank, fmt::format("{}: EP and the baseline disagree ({} rows or arrays differ, summed "
                             "over the ranks)",
                             what, wrong));

  std::vector<double> seconds[kNumLlSteps];
  auto timed = [&](int step, const char* name, auto&& call) {
    r.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    check(r.rank, call(), name);
    seconds[step].push_back(seconds_since(t0));
  };
  // The hooked call, then its wait at once (nothing overlaps it here).
  auto hooked = [&](int send, const char* name, auto&& call) {
    timed(send, name, call);
    const auto t0 = std::chrono::steady_clock::now();
    check(r.rank, ep.wait(), "chorusEpHookWait");
    seconds[send + 1].push_back(seconds_since(t0));
  };
  const uint16_t* x = expert_out.get();
  for (int it = 0; it < r.opt.warmup + r.opt.iters; ++it) {
    if (it == r.opt.warmup)
      for (auto& v : seconds) v.clear();
    timed(kLlDispatch, "chorusEpLowLatencyDispatch", [&] { return ep.dispatch(false); });
    timed(kLlCombine, "chorusEpLowLatencyCombine",
          [&] { return ep.combine(x, weights, ep_combined.data(), false); });
    hooked(kLlDispatchSend, "chorusEpLowLatencyDispatch (hook)", [&] { return ep.dispatch(true); });
    hooked(kLlCombineSend, "chorusEpLowLatencyCombine (hook)",
           [&] { return ep.combine(x, weights, ep_combined.data(), true); });
    timed(kLlBaseDispatch, "baseline dispatch", [&] { return base.dispatch(in, base_recv); });
    timed(kLlBaseCombine, "baseline combine",
          [&] { return base.combine(x, weights, base_combined.data()); });
  }
  return summarize(r, s, seconds, pairs);
}

void print_low_latency_header() {
  std::printf(
      "# time: us per call, median and mean over iterations (each the max over ranks), min and "
      "max over iterations and ranks; GB/s (1e9): DeepEP's bytes of the rank's valid (token, "
      "expert) pairs / median, "
      "min over ranks: dispatch (hidden + hidden/128*4 + 16) per pair with fp8, (hidden*2 + 16) "
      "with bf16, combine hidden*2 per pair; ep-send: the call with returnRecvHook=1 until it "
      "returns, ep-recv: chorusEpHookWait right after\n");
  std::printf("%-7s %5s %5s %-10s %11s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "#mode", "ranks",
              "dtype", "impl", "pairs", "disp_us", "disp_mean", "disp_min", "disp_max", "disp_GB/s",
              "comb_us", "comb_mean", "comb_min", "comb_max", "comb_GB/s");
}

void print_low_latency_rows(int nranks, ncclDataType_t t, const LowLatencyFigures& f) {
  const std::string pairs = fmt::format("{}-{}", f.pairs_min, f.pairs_max);
  auto rate = [&](int i) {
    return f.gbps[i] > 0 ? fmt::format("{:.3f}", f.gbps[i]) : std::string("-");
  };
  auto row = [&](const char* impl, int dispatch, int combine) {
    std::printf("%-7s %5d %5s %-10s %11s %9.1f %9.1f %9.1f %9.1f %9s %9.1f %9.1f %9.1f %9.1f %9s\n",
                "ll", nranks, dtype_name(t), impl, pairs.c_str(), f.median_us[dispatch],
                f.mean_us[dispatch], f.min_us[dispatch], f.max_us[dispatch], rate(dispatch).c_str(),
                f.median_us[combine], f.mean_us[combine], f.min_us[combine], f.max_us[combine],
                rate(combine).c_str());
  };
  row("ep", kLlDispatch, kLlCombine);
  row("ep-send", kLlDispatchSend, kLlCombineSend);
  row("ep-recv", kLlDispatchRecv, kLlCombineRecv);
  row("alltoallv", kLlBaseDispatch, kLlBaseCombine);
  std::printf("%-7s %5d %5s %-10s %11s %9s %9s %9s %9s %8.2fx %9s %9s %9s %9s %8.2fx\n", "ll",
              nranks, dtype_name(t), "ep/base", "", "", "", "", "",
              f.gbps[kLlDispatch] / f.gbps[kLlBaseDispatch], "", "", "", "",
              f.gbps[kLlCombine] / f.gbps[kLlBaseCombine]);
  std::fflush(stdout);
}

}  // namespace chorus::bench::ep
