// SPDX-License-Identifier: Apache-2.0
// File: tests/support/ep_routing.cc
// Drawing a token's experts for the EP checks (ep_routing.h).
#include "support/ep_routing.h"

#include <algorithm>
#include <cmath>

namespace chorus::test {

namespace {

// `want` distinct entries of `pool`, drawn by `weight` (empty: uniform) without replacement.
std::vector<int64_t> draw(std::mt19937_64& gen, std::vector<int64_t> pool,
                          std::vector<double> weight, size_t want) {
  if (weight.empty()) weight.assign(pool.size(), 1.0);
  std::vector<int64_t> out;
  while (out.size() < want && !pool.empty()) {
    std::discrete_distribution<size_t> d(weight.begin(), weight.end());
    const size_t i = d(gen);
    out.push_back(pool[i]);
    pool.erase(pool.begin() + static_cast<long>(i));
    weight.erase(weight.begin() + static_cast<long>(i));
  }
  return out;
}

}  // namespace

std::vector<int64_t> route_token(const TokenRouting& r, std::mt19937_64& gen) {
  std::vector<int64_t> pool;
  std::vector<double> weight;
  for (int64_t e = 0; e < r.experts; ++e) {
    if (e == r.hot) continue;
    pool.push_back(e);
    if (r.skewed) weight.push_back(1.0 / std::pow(static_cast<double>(e + 1), 1.5));
  }
  size_t want = static_cast<size_t>(r.topk);
  if (r.fewer_than_topk) want = gen() % (want + 1);
  if (r.hot >= 0) --want;
  std::vector<int64_t> slots = draw(gen, pool, weight, want);
  if (r.hot >= 0) slots.push_back(r.hot);
  slots.resize(static_cast<size_t>(r.topk), -1);
  std::shuffle(slots.begin(), slots.end(), gen);
  return slots;
}

}  // namespace chorus::test
