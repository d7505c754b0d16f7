// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/baseline.cc
// Dispatch and combine as an AlltoAll of counts plus an AlltoAllv of packed tokens (baseline.h).
#include "bench/ep/baseline.h"

#include <algorithm>
#include <cstring>

#include "kernels/fp8/convert.h"

namespace chorus::bench::ep {

Received::Received(const Shape& shape, int nranks, size_t capacity)
    : x(capacity * row_bytes(shape)),
      scales(capacity * scale_bytes(shape) / sizeof(float)),
      topk_idx(capacity * static_cast<size_t>(shape.topk)),
      topk_weights(capacity * static_cast<size_t>(shape.topk)),
      tokens_per_expert(static_cast<size_t>(shape.experts / nranks)) {}

AlltoallvBaseline::AlltoallvBaseline(ncclComm_t comm, int rank, int nranks, const Shape& shape,
                                     size_t max_recv)
    : comm_(comm),
      rank_(rank),
      nranks_(nranks),
      shape_(shape),
      send_count_(static_cast<size_t>(nranks)),
      recv_count_(static_cast<size_t>(nranks)),
      send_offset_(static_cast<size_t>(nranks) + 1),
      recv_offset_(static_cast<size_t>(nranks) + 1),
      rank_hit_(static_cast<size_t>(nranks)),
      recv_buf_(max_recv * record_bytes(shape)),
      acc_(shape.tokens * shape.hidden) {
  // A token goes to at most min(topk, nranks) ranks; the same area sends its rows back.
  const size_t copies = shape.tokens * static_cast<size_t>(std::min(shape.topk, nranks));
  send_tokens_.reserve(copies);
  send_buf_.resize(copies * std::max(record_bytes(shape), combine_row_bytes(shape)));
}

void AlltoallvBaseline::route(const RankTokens& in) {
  const auto k = static_cast<size_t>(shape_.topk);
  const int64_t local = shape_.experts / nranks_;
  const auto n = static_cast<size_t>(nranks_);
  auto mark = [&](size_t t) {  // rank_hit_[q]: token t has an expert on rank q
    std::fill(rank_hit_.begin(), rank_hit_.end(), 0);
    for (size_t s = 0; s < k; ++s) {
      const int64_t expert = in.topk_idx[t * k + s];
      if (expert >= 0) rank_hit_[static_cast<size_t>(expert / local)] = 1;
    }
  };
  std::fill(send_count_.begin(), send_count_.end(), 0);
  for (size_t t = 0; t < shape_.tokens; ++t) {
    mark(t);
    for (size_t q = 0; q < n; ++q) send_count_[q] += rank_hit_[q];
  }
  send_offset_[0] = 0;
  for (size_t q = 0; q < n; ++q)
    send_offset_[q + 1] = send_offset_[q] + static_cast<size_t>(send_count_[q]);
  send_tokens_.resize(send_offset_[n]);
  std::vector<size_t>& next = recv_offset_;  // scratch until the counts arrive
  std::copy(send_offset_.begin(), send_offset_.end(), next.begin());
  for (size_t t = 0; t < shape_.tokens; ++t) {
    mark(t);
    for (size_t q = 0; q < n; ++q)
      if (rank_hit_[q] != 0) send_tokens_[next[q]++] = t;
  }
}

void AlltoallvBaseline::pack(const RankTokens& in) {
  const size_t row = row_bytes(shape_), scales = scale_bytes(shape_);
  const size_t record = record_bytes(shape_);
  const size_t k = static_cast<size_t>(shape_.topk);
  for (size_t i = 0; i < send_tokens_.size(); ++i) {
    const size_t t = send_tokens_[i];
    uint8_t* rec = send_buf_.data() + i * record;
    std::memcpy(rec, in.x.data() + t * row, row);
    if (scales > 0) std::memcpy(rec + row, in.scales.data() + t * scales / sizeof(float), scales);
    std::memcpy(rec + row + scales, in.topk_idx.data() + t * k, k * sizeof(int64_t));
    std::memcpy(rec + row + scales + k * sizeof(int64_t), in.topk_weights.data() + t * k,
                k * sizeof(float));
  }
}

void AlltoallvBaseline::unpack(Received& out) const {
  const size_t row = row_bytes(shape_), scales = scale_bytes(shape_);
  const size_t record = record_bytes(shape_);
  const size_t k = static_cast<size_t>(shape_.topk);
  const int64_t local = shape_.experts / nranks_;
  const int64_t first = local * rank_;
  out.num_recv = recv_offset_[static_cast<size_t>(nranks_)];
  std::fill(out.tokens_per_expert.begin(), out.tokens_per_expert.end(), 0);
  for (size_t i = 0; i < out.num_recv; ++i) {
    const uint8_t* rec = recv_buf_.data() + i * record;
    std::memcpy(out.x.data() + i * row, rec, row);
    if (scales > 0) std::memcpy(out.scales.data() + i * scales / sizeof(float), rec + row, scales);
    int64_t* idx = out.topk_idx.data() + i * k;
    float* w = out.topk_weights.data() + i * k;
    std::memcpy(idx, rec + row + scales, k * sizeof(int64_t));
    std::memcpy(w, rec + row + scales + k * sizeof(int64_t), k * sizeof(float));
    for (size_t s = 0; s < k; ++s) {
      if (idx[s] >= first && idx[s] < first + local) {
        idx[s] -= first;
        ++out.tokens_per_expert[static_cast<size_t>(idx[s])];
      } else {
        idx[s] = -1;
        w[s] = 0.0f;
      }
    }
  }
}

ncclResult_t AlltoallvBaseline::exchange(const uint8_t* send,
                                         const std::vector<int64_t>& send_count, uint8_t* recv,
                                         const std::vector<int64_t>& recv_count, size_t unit) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  size_t sent = 0, received = 0;
  for (int q = 0; q < nranks_ && r == ncclSuccess; ++q) {
    const auto bytes_out = static_cast<size_t>(send_count[static_cast<size_t>(q)]) * unit;
    const auto bytes_in = static_cast<size_t>(recv_count[static_cast<size_t>(q)]) * unit;
    r = ncclSend(send + sent, bytes_out, ncclUint8, q, comm_, nullptr);
    if (r == ncclSuccess) r = ncclRecv(recv + received, bytes_in, ncclUint8, q, comm_, nullptr);
    sent += bytes_out;
    received += bytes_in;
  }
  const ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}

ncclResult_t AlltoallvBaseline::dispatch(const RankTokens& in, Received& out) {
  route(in);
  ncclResult_t r =
      ncclAlltoAll(send_count_.data(), recv_count_.data(), 1, ncclInt64, comm_, nullptr);
  if (r != ncclSuccess) return r;
  recv_offset_[0] = 0;
  for (size_t q = 0; q < static_cast<size_t>(nranks_); ++q)
    recv_offset_[q + 1] = recv_offset_[q] + static_cast<size_t>(recv_count_[q]);
  if (recv_offset_.back() * record_bytes(shape_) > recv_buf_.size()) return ncclInvalidUsage;
  pack(in);
  r = exchange(send_buf_.data(), send_count_, recv_buf_.data(), recv_count_, record_bytes(shape_));
  if (r != ncclSuccess) return r;
  unpack(out);
  return ncclSuccess;
}

ncclResult_t AlltoallvBaseline::combine(const uint16_t* expert_out, uint16_t* combined) {
  // Rows go back the way their tokens came: recv_count_[q] rows to rank q, send_count_[q] rows
  // from it, into send_buf_ in send_tokens_ order.
  const size_t row = combine_row_bytes(shape_);
  ncclResult_t r = exchange(reinterpret_cast<const uint8_t*>(expert_out), recv_count_,
                            send_buf_.data(), send_count_, row);
  if (r != ncclSuccess) return r;
  const size_t h = shape_.hidden;
  std::fill(acc_.begin(), acc_.end(), 0.0f);
  const auto* rows = reinterpret_cast<const uint16_t*>(send_buf_.data());
  for (size_t i = 0; i < send_tokens_.size(); ++i) {
    float* dst = acc_.data() + send_tokens_[i] * h;
    const uint16_t* src = rows + i * h;
    for (size_t c = 0; c < h; ++c) dst[c] += kernels::bf16_to_float(src[c]);
  }
  for (size_t i = 0; i < acc_.size(); ++i) combined[i] = kernels::float_to_bf16(acc_[i]);
  return ncclSuccess;
}

}  // namespace chorus::bench::ep
