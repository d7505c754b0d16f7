// SPDX-License-Identifier: Apache-2.0
// File: src/ep/combine.cc
// Normal-mode combine through an EP buffer (buffer.h): each source rank's rows written into its
// staging area (or sent), and what arrived reduced, weighted, into the caller's output.
#include "ep/buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/params.h"
#include "ep/moves.h"
#include "ep/routing.h"
#include "ep/transfer.h"
#include "kernels/reduce/reduce.h"

namespace chorus::ep {

Status Buffer::combine(std::shared_ptr<const Handle> handle, const void* x, int datatype,
                       bool with_weights, const float* topk_weights, void* combined_x,
                       float* combined_weights, Status st, Stream* stream) {
  drain();
  const Handle& h = *handle;
  const auto k = static_cast<size_t>(h.topk);
  const bool bf16 = datatype == ncclBfloat16;
  const size_t row = h.hidden * (bf16 ? 2 : 4);
  const size_t weight_row = with_weights ? k * sizeof(float) : 0;
  const size_t rows_back = h.send_tokens.size();
  const size_t need = combine_weights_at(rows_back, row) + rows_back * weight_row;
  if (st.ok() && need > bytes())
    st = invalid_argument(
        "combine brings {} rows of {} bytes back to rank {}: {} bytes of staging, more than the "
        "buffer's {}",
        rows_back, row + weight_row, rank_, need, bytes());
  // A rank with nothing to send or receive constrains nothing: its weight messages are empty.
  const bool idle = h.num_tokens == 0 && h.num_recv_tokens == 0;
  CHORUS_RETURN_IF_ERROR(agree("chorusEpCombine", std::move(st),
                               {datatype, idle ? kAnyValue : int64_t{with_weights}},
                               {"datatype", "topk weights (given or not)"}));
  auto m = std::make_shared<CombineMove>();
  m->handle = std::move(handle);
  m->x = x;
  m->bf16 = bf16;
  m->with_weights = with_weights;
  m->topk_weights = topk_weights;
  m->combined_x = combined_x;
  m->combined_weights = combined_weights;
  m->step = areas_->begin_step();
  return run(
      "chorusEpCombine", stream, m, [this, m](Part part) { return stage_combine(*m, part); },
      nullptr, [this, m](const Arrivals& a) { return finish_combine(*m, a); });
}

Status Buffer::stage_combine(CombineMove& m, Part part) {
  const bool write = part == Part::kLocal || part == Part::kAll;
  const bool write_remote = part == Part::kRemote || part == Part::kAll;
  const Handle& h = *m.handle;
  const auto n = static_cast<size_t>(nranks_);
  const auto k = static_cast<size_t>(h.topk);
  const size_t row = h.hidden * (m.bf16 ? 2 : 4);
  const size_t weight_row = m.with_weights ? k * sizeof(float) : 0;
  // [rows, grouped by the rank they come from] [weights]: a writing peer finds both from the
  // counts alone.
  char* rows = areas_->local();
  char* weights = rows + combine_weights_at(h.send_tokens.size(), row);
  // Rows for other hosts go from x, or, where the staging area is registered (verbs) and has
  // room, are copied behind that (DeepEP's send buffer): a message between two registered
  // areas is RDMA-written straight into the receiver's (transfer.h).
  char* staged = rows + align8(combine_weights_at(h.send_tokens.size(), row) +
                               h.send_tokens.size() * weight_row);
  const size_t recv_rows = h.recv_offset[n];
  const bool stage_sends = areas_->registered() &&
                           static_cast<size_t>(staged - rows) +
                                   combine_weights_at(recv_rows, row) + recv_rows * weight_row <=
                               bytes();
  char* staged_weights = staged + combine_weights_at(recv_rows, row);
  std::vector<SendMsg> sends;  // kept in `m` by the listing pass only (see stage_dispatch)
  std::vector<RecvMsg> recvs;
  // Between a pair: the weights, then the rows in pieces (combine_pieces), so that the
  // receiver sums the tokens whose rows are in while the rest travel. Receives are listed
  // weights first, then piece by piece across the peers: the order they are waited for in.
  for (size_t q = 0; q < n; ++q) {
    const int peer = static_cast<int>(q);
    const size_t r0 = h.recv_offset[q], rn = h.recv_offset[q + 1] - r0;
    const char* my_rows = static_cast<const char*>(m.x) + r0 * row;
    const float* my_weights = m.with_weights ? m.topk_weights + r0 * k : nullptr;
    if (areas_->writes_into(peer)) {
      // Into rank q's area, after the rows of the ranks below this one.
      const size_t at = h.peer_rows_before[q], total = h.peer_rows_total[q];
      const size_t weights_there = combine_weights_at(total, row);
      if (weights_there + total * weight_row > areas_->area_bytes(peer))
        return internal_error("EP combine rows for rank {} overrun its buffer of {} bytes", peer,
                              areas_->area_bytes(peer));
      if (write && rn > 0) std::memcpy(areas_->area(peer) + at * row, my_rows, rn * row);
      if (write && rn > 0 && m.with_weights)
        std::memcpy(areas_->area(peer) + weights_there + at * weight_row, my_weights,
                    rn * weight_row);
      continue;
    }
    if (stage_sends && rn > 0) {
      char* to = staged + r0 * row;
      char* wto = staged_weights + r0 * weight_row;
      if (write_remote) std::memcpy(to, my_rows, rn * row);
      if (write_remote && m.with_weights) std::memcpy(wto, my_weights, rn * weight_row);
      my_rows = to;
      my_weights = reinterpret_cast<const float*>(wto);
    }
    if (m.with_weights) sends.push_back({peer, my_weights, rn * weight_row});
    for (size_t p = 0; p < piece_count(rn, row); ++p) {
      const auto [first, last] = piece_items(rn, row, p);
      sends.push_back({peer, my_rows + first * row, (last - first) * row});
    }
  }
  size_t most_pieces = 0;
  for (size_t q = 0; q < n; ++q) {
    if (areas_->written_by(static_cast<int>(q))) continue;
    const size_t s0 = h.send_offset[q], sn = h.send_offset[q + 1] - s0;
    if (m.with_weights)
      recvs.push_back({static_cast<int>(q), weights + s0 * weight_row, sn * weight_row});
    most_pieces = std::max(most_pieces, piece_count(sn, row));
  }
  for (size_t p = 0; p < most_pieces; ++p) {
    for (size_t q = 0; q < n; ++q) {
      if (areas_->written_by(static_cast<int>(q))) continue;
      const size_t s0 = h.send_offset[q], sn = h.send_offset[q + 1] - s0;
      if (p >= piece_count(sn, row)) continue;
      const auto [first, last] = piece_items(sn, row, p);
      recvs.push_back({static_cast<int>(q), rows + (s0 + first) * row, (last - first) * row});
    }
  }
  if (write)
    for (int q = 0; q < nranks_; ++q)
      if (q != rank_ && areas_->writes_into(q)) areas_->mark_written(q, m.step);
  if (part == Part::kNone) {
    m.sends = std::move(sends);
    m.recvs = std::move(recvs);
  }
  return Status();
}

Status Buffer::finish_combine(const CombineMove& m, const Arrivals& arrivals) {
  CHORUS_RETURN_IF_ERROR(areas_->wait_written(m.step, "chorusEpCombine"));
  const Handle& h = *m.handle;
  const auto k = static_cast<size_t>(h.topk);
  const bool bf16 = m.bf16;
  const size_t row = h.hidden * (bf16 ? 2 : 4);
  const size_t weight_row = m.with_weights ? k * sizeof(float) : 0;
  const size_t rows_back = h.send_tokens.size();
  const char* rows = areas_->local();
  const char* weights = rows + combine_weights_at(rows_back, row);
  // Row i (and its weights) is in once `need[i]` messages have arrived (0: written by this
  // host's ranks, here since wait_written).
  std::vector<size_t> need(rows_back, 0);
  {
    size_t arrival = 0;
    for (const RecvMsg& r : m.recvs) {
      if (!travels(r, rank_)) continue;  // what Arrivals counts
      ++arrival;
      const char* d = static_cast<const char*>(r.data);
      const bool is_rows = d < weights;
      const size_t first = is_rows ? static_cast<size_t>(d - rows) / row
                                   : static_cast<size_t>(d - weights) / weight_row;
      const size_t count = r.bytes / (is_rows ? row : weight_row);
      for (size_t i = first; i < first + count; ++i) need[i] = std::max(need[i], arrival);
    }
  }
  size_t arrived = 0;
  // Per token, its rows in ascending rank order (rows come back grouped by the rank they went
  // to), summed in one float row that stays in cache, then rounded once into the output. The
  // library's kernels add (fp32 sums, bit for bit the scalar a + b) and convert BF16 rows.
  std::vector<size_t> first_row(h.num_tokens + 1, 0), token_rows(rows_back);
  for (size_t i = 0; i < rows_back; ++i) ++first_row[h.send_tokens[i] + 1];
  for (size_t t = 0; t < h.num_tokens; ++t) first_row[t + 1] += first_row[t];
  {
    std::vector<size_t> next(first_row.begin(), first_row.end() - 1);
    for (size_t i = 0; i < rows_back; ++i) token_rows[next[h.send_tokens[i]]++] = i;
  }
  const kernels::ReduceFn add = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  const int kBf16 = static_cast<int>(DataType::kBfloat16);
  const kernels::ConvertFn widen = kernels::kernels().to_float[kBf16];
  const kernels::ConvertFn narrow = kernels::kernels().from_float[kBf16];
  std::vector<float> sum(bf16 ? h.hidden : 0), widened(bf16 ? h.hidden : 0);
  for (size_t t = 0; t < h.num_tokens; ++t) {
    size_t wanted = 0;
    for (size_t j = first_row[t]; j < first_row[t + 1]; ++j)
      wanted = std::max(wanted, need[token_rows[j]]);
    if (wanted > arrived) {
      CHORUS_RETURN_IF_ERROR(arrivals.wait(wanted));
      arrived = arrivals.arrived();
    }
    float* dst = bf16 ? sum.data() : static_cast<float*>(m.combined_x) + t * h.hidden;
    std::fill(dst, dst + h.hidden, 0.0f);
    float* wdst = m.with_weights ? m.combined_weights + t * k : nullptr;
    if (m.with_weights) std::fill(wdst, wdst + k, 0.0f);
    for (size_t j = first_row[t]; j < first_row[t + 1]; ++j) {
      const size_t i = token_rows[j];
      const void* src = rows + i * row;
      if (bf16) {
        widen(widened.data(), src, h.hidden);
        src = widened.data();
      }
      add(dst, dst, src, h.hidden);
      if (m.with_weights) add(wdst, wdst, weights + i * weight_row, k);
    }
    if (bf16) narrow(static_cast<char*>(m.combined_x) + t * row, dst, h.hidden);
  }
  return Status();
}

}  // namespace chorus::ep
