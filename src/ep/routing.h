// SPDX-License-Identifier: Apache-2.0
// File: src/ep/routing.h
// Which tokens go to which rank (DeepEP's dispatch layout), from a [tokens, topk] expert index
// table; the checks of that table and of a layout the caller computed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace chorus::ep {

struct Routing {
  int nranks = 0;
  int num_experts = 0;
  int topk = 0;
  size_t num_tokens = 0;
  std::vector<uint8_t> in_rank;  // [num_tokens * nranks]: 1 iff an expert of the token is there
  std::vector<int> per_rank;     // [nranks]: tokens with an expert on the rank
  std::vector<int> per_expert;   // [num_experts]: (token, slot) pairs per expert
  // Tokens for rank r, ascending: send_tokens[send_offset[r] .. send_offset[r + 1]).
  std::vector<size_t> send_offset;  // [nranks + 1]
  std::vector<size_t> send_tokens;
};

// numExperts split evenly over nranks ranks.
Status check_experts(int num_experts, int nranks);

// The routing of topk_idx [num_tokens, topk]: kInvalidArgument naming the first token and slot
// whose expert is outside [-1, num_experts).
Result<Routing> route(const int64_t* topk_idx, size_t num_tokens, int topk, int num_experts,
                      int nranks);

// A caller's layout (any of the three may be NULL: not given) against the routing.
Status check_layout(const Routing& routing, const int* per_rank, const int* per_expert,
                    const uint8_t* in_rank);

}  // namespace chorus::ep
