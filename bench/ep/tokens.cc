// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/tokens.cc
// Deterministic MoE inputs (tokens.h).
#include "bench/ep/tokens.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/fp8/convert.h"

namespace chorus::bench::ep {

namespace {

// splitmix64: a cheap, well-mixed stream for the large arrays (millions of channels).
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-2, 2).
float uniform_pm2(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (4.0f / static_cast<float>(1u << 24)) - 2.0f;
}

uint64_t stream(uint64_t seed, int rank, uint64_t what) {
  return mix(seed ^ mix(static_cast<uint64_t>(rank) * uint64_t{0x100000001b3} + what));
}

void fill_bf16(uint16_t* out, size_t n, uint64_t state) {
  for (size_t i = 0; i < n; ++i) out[i] = kernels::float_to_bf16(uniform_pm2(mix(state + i)));
}

}  // namespace

size_t row_bytes(const Shape& s) { return s.hidden * (s.dtype == ncclFloat8e4m3 ? 1 : 2); }
size_t scale_bytes(const Shape& s) {
  return s.dtype == ncclFloat8e4m3 ? s.hidden / kFp8Block * sizeof(float) : 0;
}
size_t record_bytes(const Shape& s) {
  return row_bytes(s) + scale_bytes(s) +
         static_cast<size_t>(s.topk) * (sizeof(int64_t) + sizeof(float));
}
size_t combine_row_bytes(const Shape& s) { return s.hidden * sizeof(uint16_t); }

RankTokens make_tokens(const Shape& shape, uint64_t seed, int rank) {
  RankTokens t;
  const size_t n = shape.tokens;
  const auto k = static_cast<size_t>(shape.topk);
  const auto e = static_cast<size_t>(shape.experts);
  t.x.resize(n * row_bytes(shape));
  if (shape.dtype == ncclFloat8e4m3) {
    // Random E4M3 codes, with the NaN codes (S.1111.111) turned into the largest finite value.
    const uint64_t state = stream(seed, rank, 1);
    for (size_t i = 0; i < t.x.size(); ++i) {
      auto c = static_cast<uint8_t>(mix(state + i) >> 56);
      t.x[i] = (c & 0x7f) == 0x7f ? static_cast<uint8_t>(c ^ 1) : c;
    }
    t.scales.resize(n * (shape.hidden / kFp8Block));
    const uint64_t sstate = stream(seed, rank, 2);
    for (size_t i = 0; i < t.scales.size(); ++i)
      t.scales[i] = 1.25f + 0.5f * uniform_pm2(mix(sstate + i));
  } else {
    fill_bf16(reinterpret_cast<uint16_t*>(t.x.data()), n * shape.hidden, stream(seed, rank, 1));
  }

  // DeepEP: scores = randn(tokens, experts).abs() + 1; topk_idx = topk(scores, k) (the k largest,
  // ties to the lower expert here); topk_weights = randn(tokens, k).
  std::mt19937_64 gen(stream(seed, rank, 3));
  std::normal_distribution<float> randn;
  std::vector<float> scores(e);
  std::vector<int64_t> order(e);
  t.topk_idx.resize(n * k);
  t.topk_weights.resize(n * k);
  for (size_t tok = 0; tok < n; ++tok) {
    for (float& s : scores) s = std::abs(randn(gen)) + 1.0f;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](int64_t a, int64_t b) {
                        const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
                        return scores[ua] != scores[ub] ? scores[ua] > scores[ub] : a < b;
                      });
    std::copy_n(order.begin(), k, t.topk_idx.begin() + static_cast<std::ptrdiff_t>(tok * k));
    for (size_t s = 0; s < k; ++s) t.topk_weights[tok * k + s] = randn(gen);
  }
  return t;
}

std::vector<uint16_t> make_expert_output(size_t rows, size_t hidden, uint64_t seed, int rank) {
  std::vector<uint16_t> out(rows * hidden);
  fill_bf16(out.data(), out.size(), stream(seed, rank, 4));
  return out;
}

std::vector<int64_t> tokens_per_rank(const Shape& shape, const std::vector<int64_t>& topk_idx,
                                     int nranks) {
  const auto k = static_cast<size_t>(shape.topk);
  const int64_t local = shape.experts / nranks;
  std::vector<int64_t> count(static_cast<size_t>(nranks), 0);
  std::vector<int> last(static_cast<size_t>(nranks), -1);  // the last token counted per rank
  for (size_t tok = 0; tok < shape.tokens; ++tok)
    for (size_t s = 0; s < k; ++s) {
      const int64_t expert = topk_idx[tok * k + s];
      if (expert < 0) continue;
      const auto r = static_cast<size_t>(expert / local);
      if (last[r] == static_cast<int>(tok)) continue;
      last[r] = static_cast<int>(tok);
      ++count[r];
    }
  return count;
}

}  // namespace chorus::bench::ep
