// SPDX-License-Identifier: Apache-2.0
// File: src/ep/routing.cc
// The dispatch layout of a routing table (routing.h).
#include "ep/routing.h"

namespace chorus::ep {

Status check_experts(int num_experts, int nranks) {
  if (num_experts <= 0)
    return invalid_argument("numExperts is {}: it must be positive", num_experts);
  if (num_experts % nranks != 0)
    return invalid_argument(
        "numExperts {} is not a multiple of the communicator's {} ranks (experts are split "
        "evenly over the ranks)",
        num_experts, nranks);
  return Status();
}

Result<Routing> route(const int64_t* topk_idx, size_t num_tokens, int topk, int num_experts,
                      int nranks) {
  Routing r;
  r.nranks = nranks;
  r.num_experts = num_experts;
  r.topk = topk;
  r.num_tokens = num_tokens;
  r.in_rank.assign(num_tokens * static_cast<size_t>(nranks), 0);
  r.per_rank.assign(static_cast<size_t>(nranks), 0);
  r.per_expert.assign(static_cast<size_t>(num_experts), 0);
  const int64_t local = num_experts / nranks;
  for (size_t t = 0; t < num_tokens; ++t) {
    uint8_t* row = &r.in_rank[t * static_cast<size_t>(nranks)];
    for (int k = 0; k < topk; ++k) {
      const int64_t e = topk_idx[t * static_cast<size_t>(topk) + static_cast<size_t>(k)];
      if (e == -1) continue;
      if (e < -1 || e >= num_experts)
        return invalid_argument(
            "token {} slot {}: expert index {} is outside [-1, {}) (numExperts {})", t, k, e,
            num_experts, num_experts);
      ++r.per_expert[static_cast<size_t>(e)];
      row[e / local] = 1;
    }
    for (int q = 0; q < nranks; ++q) r.per_rank[static_cast<size_t>(q)] += row[q];
  }
  r.send_offset.assign(static_cast<size_t>(nranks) + 1, 0);
  for (int q = 0; q < nranks; ++q)
    r.send_offset[static_cast<size_t>(q) + 1] =
        r.send_offset[static_cast<size_t>(q)] +
        static_cast<size_t>(r.per_rank[static_cast<size_t>(q)]);
  r.send_tokens.resize(r.send_offset.back());
  std::vector<size_t> next(r.send_offset.begin(), r.send_offset.end() - 1);
  for (int q = 0; q < nranks; ++q)
    for (size_t t = 0; t < num_tokens; ++t)
      if (r.in_rank[t * static_cast<size_t>(nranks) + static_cast<size_t>(q)])
        r.send_tokens[next[static_cast<size_t>(q)]++] = t;
  return r;
}

Status check_layout(const Routing& routing, const int* per_rank, const int* per_expert,
                    const uint8_t* in_rank) {
  const auto n = static_cast<size_t>(routing.nranks);
  for (size_t q = 0; per_rank != nullptr && q < n; ++q)
    if (per_rank[q] != routing.per_rank[q])
      return invalid_argument("numTokensPerRank[{}] is {} but topkIdx sends {} tokens to rank {}",
                              q, per_rank[q], routing.per_rank[q], q);
  for (size_t e = 0; per_expert != nullptr && e < routing.per_expert.size(); ++e)
    if (per_expert[e] != routing.per_expert[e])
      return invalid_argument("numTokensPerExpert[{}] is {} but topkIdx routes {} tokens to it", e,
                              per_expert[e], routing.per_expert[e]);
  for (size_t i = 0; in_rank != nullptr && i < routing.in_rank.size(); ++i)
    if ((in_rank[i] != 0) != (routing.in_rank[i] != 0))
      return invalid_argument("isTokenInRank[{}][{}] is {} but topkIdx says {}", i / n, i % n,
                              in_rank[i], routing.in_rank[i]);
  return Status();
}

}  // namespace chorus::ep
