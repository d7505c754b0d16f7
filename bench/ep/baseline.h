// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/baseline.h
// The baseline: MoE dispatch and combine written the way users write them without an EP
// library, on plain NCCL calls. Dispatch: which ranks each token goes to, the token counts to
// every rank (ncclAlltoAll), each token packed once per destination rank as a record
// [x | FP8 scales | topk idx | topk weights], one group of ncclSend/ncclRecv per peer (an
// AlltoAllv), and the records unpacked into EP's output layout (include/chorus/ep.h: local expert
// indices, weights of the local slots, tokens per local expert). Combine: each received token's
// row goes back to its source the same way, where the rows are added per token in float, in
// ascending rank order, and rounded once to BF16 (so the result is bit for bit EP's).
// Buffers are allocated once, by the constructor: a timed call allocates nothing.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/ep/tokens.h"

namespace chorus::bench::ep {

// What a dispatch brought to this rank, in chorusEpDispatchOutput_t's layout.
struct Received {
  size_t num_recv = 0;
  std::vector<uint8_t> x;              // [capacity, row_bytes]
  std::vector<float> scales;           // FP8: [capacity, hidden / 128]
  std::vector<int64_t> topk_idx;       // [capacity, topk]: local expert, or -1
  std::vector<float> topk_weights;     // [capacity, topk]: 0 for the slots not on this rank
  std::vector<int> tokens_per_expert;  // [experts / nranks]

  Received(const Shape& shape, int nranks, size_t capacity);
};

class AlltoallvBaseline {
 public:
  // For inputs of `shape` on comm; at most `max_recv` tokens arrive at this rank.
  AlltoallvBaseline(ncclComm_t comm, int rank, int nranks, const Shape& shape, size_t max_recv);

  // Dispatches `in`'s tokens into `out`. Blocking, collective. ncclSuccess or the failed call's.
  ncclResult_t dispatch(const RankTokens& in, Received& out);
  // Sends `expert_out` [num_recv of the last dispatch, hidden] BF16 back and writes the sum per
  // token into `combined` [tokens, hidden] BF16. Blocking, collective.
  ncclResult_t combine(const uint16_t* expert_out, uint16_t* combined);

 private:
  void route(const RankTokens& in);
  void pack(const RankTokens& in);
  void unpack(Received& out) const;
  ncclResult_t exchange(const uint8_t* send, const std::vector<int64_t>& send_count, uint8_t* recv,
                        const std::vector<int64_t>& recv_count, size_t unit);

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  Shape shape_;
  // Tokens for rank q, ascending: send_tokens_[send_offset_[q] .. send_offset_[q + 1]).
  std::vector<int64_t> send_count_, recv_count_;
  std::vector<size_t> send_offset_, recv_offset_;
  std::vector<size_t> send_tokens_;
  std::vector<uint8_t> rank_hit_;  // [nranks]: scratch of route()
  std::vector<uint8_t> send_buf_;  // dispatch records out; combine rows back
  std::vector<uint8_t> recv_buf_;  // dispatch records in
  std::vector<float> acc_;         // combine: [tokens, hidden] sums
};

}  // namespace chorus::bench::ep
