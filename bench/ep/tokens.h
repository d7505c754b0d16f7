// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/tokens.h
// One rank's MoE inputs as DeepEP's tests make them (tests/test_intranode.py): random tokens,
// scores |randn| + 1 per (token, expert) and each token's top-k experts by score, random topk
// weights; all from a seed and the rank, so a run is reproducible. Also the byte counts the
// benchmark reports (DeepEP's formula) and the "expert output" that combine sends back.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus::bench::ep {

// One benchmark configuration, the same on every rank.
struct Shape {
  size_t tokens = 4096;  // per rank
  size_t hidden = 7168;
  int topk = 8;
  int experts = 256;
  ncclDataType_t dtype = ncclBfloat16;  // dispatch: ncclBfloat16 or ncclFloat8e4m3
};

inline constexpr size_t kFp8Block = 128;  // channels per FP8 scale (CHORUS_EP_FP8_BLOCK)

// Bytes of one token's x row in the dispatch datatype, and of its FP8 scales (0 for BF16).
size_t row_bytes(const Shape& s);
size_t scale_bytes(const Shape& s);
// Bytes one dispatched token carries: x row, scales, topk int64 indices and float weights.
size_t record_bytes(const Shape& s);
// Bytes of one token's row in combine (BF16).
size_t combine_row_bytes(const Shape& s);

struct RankTokens {
  std::vector<uint8_t> x;           // [tokens, row_bytes]: BF16 values, or E4M3 codes (no NaN)
  std::vector<float> scales;        // FP8: [tokens, hidden / 128], else empty
  std::vector<int64_t> topk_idx;    // [tokens, topk], distinct experts per token
  std::vector<float> topk_weights;  // [tokens, topk]
};

// Rank `rank`'s inputs for `shape` (deterministic in seed, rank and shape).
RankTokens make_tokens(const Shape& shape, uint64_t seed, int rank);

// `rows` BF16 rows of `hidden` random finite values: what the experts return to combine.
std::vector<uint16_t> make_expert_output(size_t rows, size_t hidden, uint64_t seed, int rank);

// Tokens this rank sends to each rank: a token counts once per rank holding any of its experts.
std::vector<int64_t> tokens_per_rank(const Shape& shape, const std::vector<int64_t>& topk_idx,
                                     int nranks);

}  // namespace chorus::bench::ep
