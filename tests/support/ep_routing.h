// SPDX-License-Identifier: Apache-2.0
// File: tests/support/ep_routing.h
// One token's top-k experts, drawn the way the EP checks (ep_check.h, ep_ll_check.h) route
// their tokens: uniform or skewed over a range of experts, optionally with fewer than topk of
// them or with a hot expert that every token names.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace chorus::test {

struct TokenRouting {
  int topk = 1;
  int64_t experts = 0;           // drawn from [0, experts)
  bool skewed = false;           // expert e weighted 1 / (e + 1)^1.5, else uniform
  bool fewer_than_topk = false;  // 0..topk experts, the other slots -1
  int64_t hot = -1;              // an expert in [0, experts) every token names, or -1
};

// topk slots: distinct experts (and -1 for unused slots) in random order.
std::vector<int64_t> route_token(const TokenRouting& r, std::mt19937_64& gen);

}  // namespace chorus::test
