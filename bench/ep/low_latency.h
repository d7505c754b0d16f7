// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/low_latency.h
// ep_bench --mode ll: DeepEP's low-latency mode (tests/test_low_latency.py) through
// chorusEpLowLatencyDispatch / chorusEpLowLatencyCombine (include/chorus/ep.h), blocking and with
// the receive hook, beside LowLatencyBaseline (baseline.h). See README.md for what is measured.
#pragma once

#include <chorus/ep.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "bench/ep/rank.h"
#include "bench/ep/tokens.h"

namespace chorus::bench::ep {

inline constexpr size_t kLowLatencyTokens = 128;  // DeepEP's num_tokens

// The timed steps of one iteration. The hooked calls are split in two: the call with
// returnRecvHook = 1 until it returns ("send"), then chorusEpHookWait ("recv").
enum LowLatencyStep {
  kLlDispatch,      // chorusEpLowLatencyDispatch, blocking
  kLlCombine,       // chorusEpLowLatencyCombine, blocking
  kLlDispatchSend,  // the same with returnRecvHook = 1
  kLlDispatchRecv,
  kLlCombineSend,
  kLlCombineRecv,
  kLlBaseDispatch,  // LowLatencyBaseline
  kLlBaseCombine,
  kNumLlSteps
};

// One configuration's figures, the same on every rank.
struct LowLatencyFigures {
  double median_us[kNumLlSteps];  // median over iterations, max over ranks
  double mean_us[kNumLlSteps];    // mean over iterations (DeepEP's avg_t), max over ranks
  double min_us[kNumLlSteps];     // over iterations and ranks
  double max_us[kNumLlSteps];
  double gbps[kNumLlSteps];      // per rank DeepEP bytes / median, min over ranks (0: not a rate)
  int64_t pairs_min, pairs_max;  // valid (token, expert) pairs of a rank's tokens
};

// Low-latency mode for shape `s` (s.tokens is the maxTokensPerRank; s.dtype ncclFloat8e4m3:
// useFp8) on a buffer sized by chorusEpLowLatencySizeHint: checks EP against the baseline on
// every rank (blocking and hooked calls; fails the run on a difference), then times the steps.
LowLatencyFigures run_low_latency(Rank& r, chorusEpBuffer_t buffer, const Shape& s);

void print_low_latency_header();
void print_low_latency_rows(int nranks, ncclDataType_t t, const LowLatencyFigures& f);

}  // namespace chorus::bench::ep
