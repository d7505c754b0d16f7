// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/baseline.cc
// Dispatch and combine as an AlltoAll of counts plus an AlltoAllv of packed tokens (baseline.h),
// in normal and low-latency layouts.
#include "bench/ep/baseline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/fp8/convert.h"

namespace chorus::bench::ep {

Received::Received(const Shape& shape, int nranks, size_t capacity)
    : x(capacity * row_bytes(shape)),
      scales(capacity * scale_bytes(shape) / sizeof(float)),
      topk_idx(capacity * static_cast<size_t>(shape.topk)),
      topk_weights(capacity * static_cast<size_t>(shape.topk)),
      tokens_per_expert(static_cast<size_t>(shape.experts / nranks)) {}

Routing::Routing(int nranks, size_t max_tokens)
    : send_count(static_cast<size_t>(nranks)),
      recv_count(static_cast<size_t>(nranks)),
      send_offset(static_cast<size_t>(nranks) + 1),
      recv_offset(static_cast<size_t>(nranks) + 1),
      rank_hit_(static_cast<size_t>(nranks)) {
  send_tokens.reserve(max_tokens * static_cast<size_t>(nranks));
}

void Routing::route(const int64_t* topk_idx, size_t tokens, int topk, int experts) {
  const auto k = static_cast<size_t>(topk);
  const auto n = send_count.size();
  const int64_t local = experts / static_cast<int64_t>(n);
  auto mark = [&](size_t t) {  // rank_hit_[q]: token t has an expert on rank q
    std::fill(rank_hit_.begin(), rank_hit_.end(), 0);
    for (size_t s = 0; s < k; ++s) {
      const int64_t expert = topk_idx[t * k + s];
      if (expert >= 0) rank_hit_[static_cast<size_t>(expert / local)] = 1;
    }
  };
  std::fill(send_count.begin(), send_count.end(), 0);
  for (size_t t = 0; t < tokens; ++t) {
    mark(t);
    for (size_t q = 0; q < n; ++q) send_count[q] += rank_hit_[q];
  }
  send_offset[0] = 0;
  for (size_t q = 0; q < n; ++q)
    send_offset[q + 1] = send_offset[q] + static_cast<size_t>(send_count[q]);
  send_tokens.resize(send_offset[n]);
  std::vector<size_t>& next = recv_offset;  // scratch until the counts arrive
  std::copy(send_offset.begin(), send_offset.end(), next.begin());
  for (size_t t = 0; t < tokens; ++t) {
    mark(t);
    for (size_t q = 0; q < n; ++q)
      if (rank_hit_[q] != 0) send_tokens[next[q]++] = t;
  }
}

ncclResult_t Routing::exchange_counts(ncclComm_t comm) {
  const ncclResult_t r =
      ncclAlltoAll(send_count.data(), recv_count.data(), 1, ncclInt64, comm, nullptr);
  if (r != ncclSuccess) return r;
  recv_offset[0] = 0;
  for (size_t q = 0; q < recv_count.size(); ++q)
    recv_offset[q + 1] = recv_offset[q] + static_cast<size_t>(recv_count[q]);
  return ncclSuccess;
}

ncclResult_t alltoallv(ncclComm_t comm, int nranks, const uint8_t* send,
                       const std::vector<int64_t>& send_count, uint8_t* recv,
                       const std::vector<int64_t>& recv_count, size_t unit) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  size_t sent = 0, received = 0;
  for (int q = 0; q < nranks && r == ncclSuccess; ++q) {
    const auto bytes_out = static_cast<size_t>(send_count[static_cast<size_t>(q)]) * unit;
    const auto bytes_in = static_cast<size_t>(recv_count[static_cast<size_t>(q)]) * unit;
    r = ncclSend(send + sent, bytes_out, ncclUint8, q, comm, nullptr);
    if (r == ncclSuccess) r = ncclRecv(recv + received, bytes_in, ncclUint8, q, comm, nullptr);
    sent += bytes_out;
    received += bytes_in;
  }
  const ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}

AlltoallvBaseline::AlltoallvBaseline(ncclComm_t comm, int rank, int nranks, const Shape& shape,
                                     size_t max_recv)
    : comm_(comm),
      rank_(rank),
      nranks_(nranks),
      shape_(shape),
      routing_(nranks, shape.tokens),
      recv_buf_(max_recv * record_bytes(shape)),
      acc_(shape.tokens * shape.hidden) {
  // A token goes to at most min(topk, nranks) ranks; the same area sends its rows back.
  const size_t copies = shape.tokens * static_cast<size_t>(std::min(shape.topk, nranks));
  send_buf_.resize(copies * std::max(record_bytes(shape), combine_row_bytes(shape)));
}

void AlltoallvBaseline::pack(const RankTokens& in) {
  const size_t row = row_bytes(shape_), scales = scale_bytes(shape_);
  const size_t record = record_bytes(shape_);
  const size_t k = static_cast<size_t>(shape_.topk);
  for (size_t i = 0; i < routing_.send_tokens.size(); ++i) {
    const size_t t = routing_.send_tokens[i];
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
  out.num_recv = routing_.num_recv();
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

ncclResult_t AlltoallvBaseline::dispatch(const RankTokens& in, Received& out) {
  routing_.route(in.topk_idx.data(), shape_.tokens, shape_.topk, shape_.experts);
  ncclResult_t r = routing_.exchange_counts(comm_);
  if (r != ncclSuccess) return r;
  if (routing_.num_recv() * record_bytes(shape_) > recv_buf_.size()) return ncclInvalidUsage;
  pack(in);
  r = alltoallv(comm_, nranks_, send_buf_.data(), routing_.send_count, recv_buf_.data(),
                routing_.recv_count, record_bytes(shape_));
  if (r != ncclSuccess) return r;
  unpack(out);
  return ncclSuccess;
}

ncclResult_t AlltoallvBaseline::combine(const uint16_t* expert_out, uint16_t* combined) {
  // Rows go back the way their tokens came: recv_count[q] rows to rank q, send_count[q] rows
  // from it, into send_buf_ in send_tokens order.
  const size_t row = combine_row_bytes(shape_);
  ncclResult_t r = alltoallv(comm_, nranks_, reinterpret_cast<const uint8_t*>(expert_out),
                             routing_.recv_count, send_buf_.data(), routing_.send_count, row);
  if (r != ncclSuccess) return r;
  const size_t h = shape_.hidden;
  std::fill(acc_.begin(), acc_.end(), 0.0f);
  const auto* rows = reinterpret_cast<const uint16_t*>(send_buf_.data());
  for (size_t i = 0; i < routing_.num_send(); ++i) {
    float* dst = acc_.data() + routing_.send_tokens[i] * h;
    const uint16_t* src = rows + i * h;
    for (size_t c = 0; c < h; ++c) dst[c] += kernels::bf16_to_float(src[c]);
  }
  for (size_t i = 0; i < acc_.size(); ++i) combined[i] = kernels::float_to_bf16(acc_[i]);
  return ncclSuccess;
}

// ---- Low-latency mode ----

namespace {

constexpr size_t kNoRow = SIZE_MAX;

// One block of `n` BF16 values to E4M3 codes and its scale (ep.h's cast, finite inputs): the
// rounding to 3 fraction bits is a float add and subtract of a power of two, so it has no
// branches (it is include/chorus/ep.h's nearest-even cast, see kernels/fp8/convert.h).
float cast_block(const uint16_t* x, size_t n, uint8_t* codes) {
  float amax = 0.0f;
  for (size_t c = 0; c < n; ++c) amax = std::max(amax, std::fabs(kernels::bf16_to_float(x[c])));
  const float scale = std::max(amax / 448.0f, std::numeric_limits<float>::min());
  const float inverse = 1.0f / scale;
  for (size_t c = 0; c < n; ++c) {
    const float v = kernels::bf16_to_float(x[c]) * inverse;
    const uint32_t bits = kernels::float_bits(v);
    const float a = kernels::bits_float(bits & 0x7fffffffu);
    // E4M3's step near a: 2^(e - 3) for a in [2^e, 2^(e+1)), e >= -6; 2^-9 below (subnormals).
    const int e = std::max(static_cast<int>((bits >> 23) & 0xffu) - 127, -6);
    const float magic = kernels::bits_float(static_cast<uint32_t>(e + 20 + 127) << 23);
    const float r = std::min((a + magic) - magic, 448.0f);
    const uint32_t rb = kernels::float_bits(r);
    const uint32_t code =
        r >= 0x1p-6f ? (rb >> 20) - ((127 - 7) << 3) : static_cast<uint32_t>(r * 512.0f);
    codes[c] = static_cast<uint8_t>(((bits >> 24) & 0x80u) | code);
  }
  return scale;
}

}  // namespace

LowLatencyReceived::LowLatencyReceived(const Shape& shape, int nranks)
    : rows_per_expert(static_cast<size_t>(nranks) * shape.tokens),
      x_row(shape.dtype == ncclFloat8e4m3 ? shape.hidden : shape.hidden * sizeof(uint16_t)),
      blocks(shape.dtype == ncclFloat8e4m3 ? shape.hidden / kFp8Block : 0),
      count(static_cast<size_t>(shape.experts / nranks)) {
  const size_t rows = count.size() * rows_per_expert;
  x = untouched<uint8_t>(rows * x_row);
  if (blocks > 0) scales = untouched<float>(rows * blocks);
  src_info = untouched<int64_t>(rows);
}

LowLatencyBaseline::LowLatencyBaseline(ncclComm_t comm, int rank, int nranks, const Shape& shape)
    : comm_(comm),
      rank_(rank),
      nranks_(nranks),
      shape_(shape),
      payload_(row_bytes(shape) + scale_bytes(shape)),
      record_(payload_ + sizeof(int64_t) * (1 + static_cast<size_t>(shape.topk))),
      routing_(nranks, shape.tokens),
      rows_back_(shape.tokens * static_cast<size_t>(shape.topk) * combine_row_bytes(shape)),
      topk_idx_(shape.tokens * static_cast<size_t>(shape.topk)),
      back_count_(static_cast<size_t>(nranks)),
      pair_count_(static_cast<size_t>(nranks)),
      slot_row_(shape.tokens * static_cast<size_t>(shape.topk)),
      acc_(shape.hidden) {
  if (shape.dtype == ncclFloat8e4m3) cast_.resize(shape.tokens * payload_);
  const size_t n = static_cast<size_t>(nranks), k = static_cast<size_t>(shape.topk);
  // Out: a token once per rank, then (combine) a row per pair received; in: every rank's tokens.
  const size_t pairs_in = n * shape.tokens * std::min(k, static_cast<size_t>(shape.experts) / n);
  send_buf_ = untouched<uint8_t>(
      std::max(shape.tokens * std::min(k, n) * record_, pairs_in * combine_row_bytes(shape)));
  recv_buf_ = untouched<uint8_t>(n * shape.tokens * record_);
  back_rows_.reserve(pairs_in);
}

void LowLatencyBaseline::cast(const RankTokens& in) {
  const size_t h = shape_.hidden, blocks = h / kFp8Block;
  const auto* x = reinterpret_cast<const uint16_t*>(in.x.data());
  for (size_t t = 0; t < shape_.tokens; ++t) {
    uint8_t* out = cast_.data() + t * payload_;  // [scales | codes]
    for (size_t b = 0; b < blocks; ++b) {
      const float scale = cast_block(x + t * h + b * kFp8Block, kFp8Block,
                                     out + blocks * sizeof(float) + b * kFp8Block);
      std::memcpy(out + b * sizeof(float), &scale, sizeof(float));
    }
  }
}

void LowLatencyBaseline::pack(const RankTokens& in) {
  const uint8_t* tokens = cast_.empty() ? in.x.data() : cast_.data();
  const size_t k = static_cast<size_t>(shape_.topk);
  for (size_t i = 0; i < routing_.num_send(); ++i) {
    const size_t t = routing_.send_tokens[i];
    uint8_t* rec = send_buf_.get() + i * record_;
    std::memcpy(rec, tokens + t * payload_, payload_);
    const auto token = static_cast<int64_t>(t);
    std::memcpy(rec + payload_, &token, sizeof(token));
    std::memcpy(rec + payload_ + sizeof(token), in.topk_idx.data() + t * k, k * sizeof(int64_t));
  }
  // Where each (token, slot) pair's row comes back in combine: by rank, then as packed.
  std::fill(slot_row_.begin(), slot_row_.end(), kNoRow);
  const int64_t local = shape_.experts / nranks_;
  size_t next = 0;
  for (size_t q = 0; q < static_cast<size_t>(nranks_); ++q) {
    const size_t start = next;
    for (size_t i = routing_.send_offset[q]; i < routing_.send_offset[q + 1]; ++i) {
      const size_t t = routing_.send_tokens[i];
      for (size_t s = 0; s < k; ++s) {
        const int64_t e = in.topk_idx[t * k + s];
        if (e >= 0 && static_cast<size_t>(e / local) == q) slot_row_[t * k + s] = next++;
      }
    }
    pair_count_[q] = static_cast<int64_t>(next - start);
  }
}

void LowLatencyBaseline::unpack(LowLatencyReceived& out) {
  const size_t k = static_cast<size_t>(shape_.topk);
  const int64_t local = shape_.experts / nranks_;
  const int64_t first = local * rank_;
  const size_t codes = out.blocks * sizeof(float);  // FP8: the codes follow the scales
  std::fill(out.count.begin(), out.count.end(), 0);
  back_rows_.clear();
  for (size_t q = 0; q < static_cast<size_t>(nranks_); ++q) {
    const size_t before = back_rows_.size();
    for (size_t i = routing_.recv_offset[q]; i < routing_.recv_offset[q + 1]; ++i) {
      const uint8_t* rec = recv_buf_.get() + i * record_;
      int64_t token = 0;
      std::memcpy(&token, rec + payload_, sizeof(token));
      for (size_t s = 0; s < k; ++s) {
        int64_t e = 0;
        std::memcpy(&e, rec + payload_ + sizeof(token) + s * sizeof(int64_t), sizeof(e));
        if (e < first || e >= first + local) continue;
        const auto l = static_cast<size_t>(e - first);
        const size_t row = l * out.rows_per_expert + static_cast<size_t>(out.count[l]++);
        std::memcpy(out.x.get() + row * out.x_row, rec + codes, out.x_row);
        if (out.blocks > 0) std::memcpy(out.scales.get() + row * out.blocks, rec, codes);
        out.src_info[row] = static_cast<int64_t>(q * shape_.tokens) + token;
        back_rows_.push_back(row);
      }
    }
    back_count_[q] = static_cast<int64_t>(back_rows_.size() - before);
  }
}

ncclResult_t LowLatencyBaseline::dispatch(const RankTokens& in, LowLatencyReceived& out) {
  routing_.route(in.topk_idx.data(), shape_.tokens, shape_.topk, shape_.experts);
  ncclResult_t r = routing_.exchange_counts(comm_);
  if (r != ncclSuccess) return r;
  if (routing_.num_recv() > static_cast<size_t>(nranks_) * shape_.tokens) return ncclInvalidUsage;
  if (!cast_.empty()) cast(in);
  pack(in);
  r = alltoallv(comm_, nranks_, send_buf_.get(), routing_.send_count, recv_buf_.get(),
                routing_.recv_count, record_);
  if (r != ncclSuccess) return r;
  unpack(out);
  std::copy(in.topk_idx.begin(), in.topk_idx.end(), topk_idx_.begin());
  return ncclSuccess;
}

ncclResult_t LowLatencyBaseline::combine(const uint16_t* expert_out, const float* weights,
                                         uint16_t* combined) {
  const size_t h = shape_.hidden, row = combine_row_bytes(shape_);
  for (size_t i = 0; i < back_rows_.size(); ++i)
    std::memcpy(send_buf_.get() + i * row, expert_out + back_rows_[i] * h, row);
  const ncclResult_t r =
      alltoallv(comm_, nranks_, send_buf_.get(), back_count_, rows_back_.data(), pair_count_, row);
  if (r != ncclSuccess) return r;
  const auto* rows = reinterpret_cast<const uint16_t*>(rows_back_.data());
  const size_t k = static_cast<size_t>(shape_.topk);
  for (size_t t = 0; t < shape_.tokens; ++t) {
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    for (size_t s = 0; s < k; ++s) {
      if (slot_row_[t * k + s] == kNoRow) continue;
      const uint16_t* src = rows + slot_row_[t * k + s] * h;
      const float w = weights[t * k + s];
      for (size_t c = 0; c < h; ++c) acc_[c] += w * kernels::bf16_to_float(src[c]);
    }
    for (size_t c = 0; c < h; ++c) combined[t * h + c] = kernels::float_to_bf16(acc_[c]);
  }
  return ncclSuccess;
}

}  // namespace chorus::bench::ep
