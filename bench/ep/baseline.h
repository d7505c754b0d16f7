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
// LowLatencyBaseline is the same for DeepEP's low-latency layout (per local expert rows).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
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

// The part both baselines share: which ranks each token goes to (a token once per rank holding
// any of its experts, in ascending token order) and the ncclAlltoAll of those counts.
class Routing {
 public:
  Routing(int nranks, size_t max_tokens);

  // Routes `tokens` tokens of topk_idx [tokens, topk] (-1: unused slot) over `experts` experts.
  void route(const int64_t* topk_idx, size_t tokens, int topk, int experts);
  // Exchanges the counts with every rank (recv_count, recv_offset). Collective.
  ncclResult_t exchange_counts(ncclComm_t comm);

  size_t num_send() const { return send_tokens.size(); }
  size_t num_recv() const { return recv_offset.back(); }

  // Tokens for rank q, ascending: send_tokens[send_offset[q] .. send_offset[q + 1]).
  std::vector<int64_t> send_count, recv_count;
  std::vector<size_t> send_offset, recv_offset;
  std::vector<size_t> send_tokens;

 private:
  std::vector<uint8_t> rank_hit_;  // [nranks]: scratch of route()
};

// The AlltoAllv: rank q gets send_count[q] units of `unit` bytes from `send` (packed in rank
// order) and this rank recv_count[q] units from q into `recv` (in rank order), as one group of
// ncclSend/ncclRecv per peer (self included). Blocking, collective.
ncclResult_t alltoallv(ncclComm_t comm, int nranks, const uint8_t* send,
                       const std::vector<int64_t>& send_count, uint8_t* recv,
                       const std::vector<int64_t>& recv_count, size_t unit);

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
  void pack(const RankTokens& in);
  void unpack(Received& out) const;

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  Shape shape_;
  Routing routing_;
  std::vector<uint8_t> send_buf_;  // dispatch records out; combine rows back
  std::vector<uint8_t> recv_buf_;  // dispatch records in
  std::vector<float> acc_;         // combine: [tokens, hidden] sums
};

// `n` values allocated, not initialised: the pages are touched only where written.
template <typename T>
std::unique_ptr<T[]> untouched(size_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

// Low-latency mode (include/chorus/ep.h): what a dispatch brought to this rank, in
// chorusEpLowLatencyDispatchOutput_t's layout, R = nranks * max_tokens rows per local expert of
// which count[e] hold tokens. The arrays are allocated and never cleared: the pages of the rows
// no token reaches are not touched (DeepEP's shape: L x R rows of 14 KiB, mostly empty).
struct LowLatencyReceived {
  size_t rows_per_expert = 0;           // R
  size_t x_row = 0;                     // bytes of a recvX row: hidden (FP8) or hidden * 2
  size_t blocks = 0;                    // FP8 scales per row, 0 for BF16
  std::unique_ptr<uint8_t[]> x;         // [L, R, x_row]
  std::unique_ptr<float[]> scales;      // FP8: [L, R, blocks]
  std::unique_ptr<int64_t[]> src_info;  // [L, R]: source rank * max_tokens + token index
  std::vector<int> count;               // [L]

  // For shape.tokens tokens per rank at most; shape.dtype ncclFloat8e4m3: FP8 rows.
  LowLatencyReceived(const Shape& shape, int nranks);
};

// The low-latency baseline. Dispatch: the same route and AlltoAll of counts; with FP8 each token
// cast once (per 128 channels: s = max(amax / 448, FLT_MIN), codes E4M3(x * (1 / s)) to nearest
// even, ep.h's cast, for finite inputs); each token packed once per destination rank as a record
// [x | FP8 scales | int64 token index | topk int64 expert indices], the AlltoAllv, and each record
// copied into the rows of its local experts (in source rank, then token order: EP's order).
// Combine: each filled row goes back to its token's rank (one per (token, expert) pair, the same
// AlltoAllv), where a token's rows are weighted and summed in float in slot order, acc = acc +
// fl(w * v), and rounded once to BF16 (so the result is bit for bit EP's). Buffers are allocated
// by the constructor: a timed call allocates nothing.
class LowLatencyBaseline {
 public:
  // Up to shape.tokens BF16 tokens per rank (the maxTokensPerRank); shape.dtype ncclFloat8e4m3:
  // dispatch in FP8.
  LowLatencyBaseline(ncclComm_t comm, int rank, int nranks, const Shape& shape);

  // Dispatches `in` (BF16 x, topk_idx) into `out`. Blocking, collective.
  ncclResult_t dispatch(const RankTokens& in, LowLatencyReceived& out);
  // expert_out [L, R, hidden] BF16 (the rows the last dispatch filled are read), weights
  // [tokens, topk] -> combined [tokens, hidden] BF16. Blocking, collective.
  ncclResult_t combine(const uint16_t* expert_out, const float* weights, uint16_t* combined);

 private:
  void cast(const RankTokens& in);
  void pack(const RankTokens& in);
  void unpack(LowLatencyReceived& out);

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  Shape shape_;
  size_t payload_;  // bytes of a token on the wire: x, and FP8 scales before the codes
  size_t record_;   // payload, token index, topk indices
  Routing routing_;
  std::vector<uint8_t> cast_;            // FP8: [tokens, payload]
  std::unique_ptr<uint8_t[]> send_buf_;  // dispatch records out; combine rows back
  std::unique_ptr<uint8_t[]> recv_buf_;  // dispatch records in
  std::vector<uint8_t> rows_back_;       // combine: [tokens * topk] rows in
  std::vector<int64_t> topk_idx_;        // the last dispatch's [tokens, topk]
  std::vector<size_t> back_rows_;        // rows of expert_out to send back, by source rank
  std::vector<int64_t> back_count_;      // of them to each rank
  std::vector<int64_t> pair_count_;      // rows coming back from each rank
  std::vector<size_t> slot_row_;         // [tokens * topk]: its row in rows_back_, or kNoRow
  std::vector<float> acc_;               // [hidden]
};

}  // namespace chorus::bench::ep
