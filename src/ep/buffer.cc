// SPDX-License-Identifier: Apache-2.0
// File: src/ep/buffer.cc
// Normal-mode dispatch and combine through an EP buffer (buffer.h).
#include "ep/buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "ep/routing.h"
#include "ep/transfer.h"
#include "kernels/reduce/reduce.h"

namespace chorus::ep {

namespace {

size_t elem_size(int datatype) {
  return datatype == ncclFloat32 ? 4 : datatype == ncclBfloat16 ? 2 : 1;
}
size_t align8(size_t v) { return (v + 7) / 8 * 8; }

// One dispatched token on the wire: x, its FP8 scales, topk int64 indices, topk float weights.
size_t record_bytes(size_t hidden, size_t elem, int topk) {
  const size_t scales = elem == 1 ? hidden / CHORUS_EP_FP8_BLOCK * sizeof(float) : 0;
  return align8(hidden * elem + scales +
                static_cast<size_t>(topk) * (sizeof(int64_t) + sizeof(float)));
}

std::atomic<uint64_t> g_next_id{1};

}  // namespace

Result<size_t> Buffer::size_hint(int nranks, size_t max_tokens, size_t hidden, int topk) {
  // Dispatch is the larger user: each token at most min(topk, nranks) times in the send area,
  // up to nranks * max_tokens records in the receive area, FP32 records the largest. Combine's
  // rows coming back and its float accumulator fit in the same bytes.
  const unsigned __int128 record = record_bytes(hidden, 4, topk);
  const auto copies = static_cast<unsigned __int128>(std::min(topk, nranks));
  const unsigned __int128 bytes = max_tokens * record * (copies + static_cast<unsigned>(nranks));
  if (bytes > SIZE_MAX / 2)
    return invalid_argument(
        "{} tokens of hidden {} and topk {} on {} ranks need more than 2^63 bytes", max_tokens,
        hidden, topk, nranks);
  return static_cast<size_t>(bytes);
}

Buffer::Buffer(ncclComm_t comm, int rank, int nranks, size_t bytes)
    : comm_(comm),
      rank_(rank),
      nranks_(nranks),
      id_(g_next_id.fetch_add(1)),
      bytes_(bytes),
      staging_(new char[std::max<size_t>(bytes, 1)]) {}

Result<std::unique_ptr<Buffer>> Buffer::create(ncclComm_t comm, size_t bytes) {
  int rank = 0, nranks = 0;
  ncclResult_t r = ncclCommUserRank(comm, &rank);
  if (r != ncclSuccess) return from_nccl(r, "ncclCommUserRank");
  r = ncclCommCount(comm, &nranks);
  if (r != ncclSuccess) return from_nccl(r, "ncclCommCount");
  return std::unique_ptr<Buffer>(new Buffer(comm, rank, nranks, bytes));
}

int Buffer::take_slot() {
  for (int i = 0; i < kSlots; ++i)
    if (!slot_taken_[i]) {
      slot_taken_[i] = true;
      return i;
    }
  return -1;
}

Status Buffer::agree(const char* call, Status mine, const std::vector<int64_t>& facts,
                     const std::vector<const char*>& names) {
  const size_t width = facts.size() + 1;
  std::vector<int64_t> all(width * static_cast<size_t>(nranks_));
  std::vector<int64_t> row(width);
  row[0] = mine.ok() ? 0 : 1;
  std::copy(facts.begin(), facts.end(), row.begin() + 1);
  ncclResult_t r = ncclAllGather(row.data(), all.data(), width, ncclInt64, comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "ncclAllGather of the EP verdicts");
  if (!mine.ok()) return mine;
  std::string refused;
  for (int q = 0; q < nranks_; ++q)
    if (all[static_cast<size_t>(q) * width] != 0)
      refused += (refused.empty() ? "" : ", ") + std::to_string(q);
  if (!refused.empty())
    return invalid_argument("{} was refused on rank(s) {} (their errors say why); nothing was sent",
                            call, refused);
  for (size_t f = 0; f < facts.size(); ++f) {
    int first = -1;  // the first rank that constrains fact f
    for (int q = 0; q < nranks_; ++q) {
      const int64_t v = all[static_cast<size_t>(q) * width + 1 + f];
      if (v == kAnyValue) continue;
      if (first < 0) first = q;
      const int64_t want = all[static_cast<size_t>(first) * width + 1 + f];
      if (v != want)
        return invalid_argument("{}: {} differs between ranks: {} on rank {}, {} on rank {}", call,
                                names[f], want, first, v, q);
    }
  }
  return Status();
}

Result<std::unique_ptr<Handle>> Buffer::dispatch(const chorusEpDispatchArgs_t& args, int datatype,
                                                 chorusEpDispatchOutput_t& out, Status st) {
  const auto n = static_cast<size_t>(nranks_);
  Routing routing;
  if (st.ok()) {
    auto routed = route(args.topkIdx, args.numTokens, args.topk, args.numExperts, nranks_);
    if (routed.ok())
      routing = std::move(routed).value();
    else
      st = routed.take_status();
  }
  if (st.ok())
    st = check_layout(routing, args.numTokensPerRank, args.numTokensPerExpert, args.isTokenInRank);

  // Counts: how many tokens each rank sends to each (a refusing rank announces none).
  std::vector<int64_t> send_count(n, 0), recv_count(n, 0);
  for (size_t q = 0; st.ok() && q < n; ++q) send_count[q] = routing.per_rank[q];
  ncclResult_t r = ncclAlltoAll(send_count.data(), recv_count.data(), 1, ncclInt64, comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "ncclAlltoAll of the EP token counts");

  const size_t elem = st.ok() ? elem_size(datatype) : 1;
  const size_t record = st.ok() ? record_bytes(args.hidden, elem, args.topk) : 0;
  std::vector<size_t> recv_offset(n + 1, 0);
  for (size_t q = 0; q < n; ++q)
    recv_offset[q + 1] = recv_offset[q] + static_cast<size_t>(recv_count[q]);
  const size_t num_recv = recv_offset[n];
  const size_t num_sent = routing.send_tokens.size();
  if (st.ok() && num_recv > out.recvCapacity)
    st = invalid_argument("{} tokens arrive on rank {} but the outputs hold recvCapacity {} rows",
                          num_recv, rank_, out.recvCapacity);
  if (st.ok() && (num_sent + num_recv) * record > bytes_) {
    const size_t max_tokens = std::max(args.numTokens, (num_recv + n - 1) / n);
    auto hint = size_hint(nranks_, max_tokens, args.hidden, args.topk);
    st = invalid_argument(
        "rank {} sends {} and receives {} tokens of {} bytes: {} bytes of staging, more than the "
        "buffer's {}; a buffer of chorusEpBufferSizeHint(nranks {}, maxTokens {}, hidden {}, topk "
        "{}) = {} bytes allows it",
        rank_, num_sent, num_recv, record, (num_sent + num_recv) * record, bytes_, nranks_,
        max_tokens, args.hidden, args.topk, hint.ok() ? hint.value() : SIZE_MAX);
  }
  CHORUS_RETURN_IF_ERROR(
      agree("chorusEpDispatch", std::move(st),
            {static_cast<int64_t>(args.hidden), args.topk, args.numExperts, datatype},
            {"hidden", "topk", "numExperts", "datatype"}));

  CHORUS_RETURN_IF_ERROR(
      pack_and_send(args, elem, record, routing.send_offset, routing.send_tokens, recv_offset));
  unpack(args, elem, record, num_sent, num_recv, out);

  auto h = std::make_unique<Handle>();
  h->buffer_id = id_;
  h->num_tokens = args.numTokens;
  h->num_recv_tokens = num_recv;
  h->hidden = args.hidden;
  h->topk = args.topk;
  h->send_offset = std::move(routing.send_offset);
  h->send_tokens = std::move(routing.send_tokens);
  h->recv_offset = std::move(recv_offset);
  return h;
}

Status Buffer::pack_and_send(const chorusEpDispatchArgs_t& args, size_t elem, size_t record,
                             const std::vector<size_t>& send_offset,
                             const std::vector<size_t>& send_tokens,
                             const std::vector<size_t>& recv_offset) {
  const size_t x_bytes = args.hidden * elem;
  const size_t scale_bytes = elem == 1 ? args.hidden / CHORUS_EP_FP8_BLOCK * sizeof(float) : 0;
  const auto k = static_cast<size_t>(args.topk);
  char* send_area = staging_.get();
  char* recv_area = send_area + send_tokens.size() * record;
  for (size_t i = 0; i < send_tokens.size(); ++i) {
    const size_t t = send_tokens[i];
    char* rec = send_area + i * record;
    std::memcpy(rec, static_cast<const char*>(args.x) + t * x_bytes, x_bytes);
    rec += x_bytes;
    if (scale_bytes > 0)
      std::memcpy(rec, args.xScales + t * (scale_bytes / sizeof(float)), scale_bytes);
    rec += scale_bytes;
    std::memcpy(rec, args.topkIdx + t * k, k * sizeof(int64_t));
    rec += k * sizeof(int64_t);
    if (args.topkWeights != nullptr)
      std::memcpy(rec, args.topkWeights + t * k, k * sizeof(float));
    else
      std::memset(rec, 0, k * sizeof(float));
  }
  std::vector<SendMsg> sends;
  std::vector<RecvMsg> recvs;
  for (int q = 0; q < nranks_; ++q) {
    const auto u = static_cast<size_t>(q);
    sends.push_back(
        {q, send_area + send_offset[u] * record, (send_offset[u + 1] - send_offset[u]) * record});
    recvs.push_back(
        {q, recv_area + recv_offset[u] * record, (recv_offset[u + 1] - recv_offset[u]) * record});
  }
  return exchange(comm_, rank_, sends, recvs);
}

void Buffer::unpack(const chorusEpDispatchArgs_t& args, size_t elem, size_t record,
                    size_t send_records, size_t num_recv, chorusEpDispatchOutput_t& out) const {
  const size_t x_bytes = args.hidden * elem;
  const size_t scales = elem == 1 ? args.hidden / CHORUS_EP_FP8_BLOCK : 0;
  const auto k = static_cast<size_t>(args.topk);
  const int64_t local = args.numExperts / nranks_;
  const int64_t first = local * rank_;
  std::vector<size_t> per_expert(static_cast<size_t>(local), 0);
  const char* recv_area = staging_.get() + send_records * record;
  std::vector<int64_t> idx(k);
  std::vector<float> w(k);
  for (size_t i = 0; i < num_recv; ++i) {
    const char* rec = recv_area + i * record;
    std::memcpy(static_cast<char*>(out.recvX) + i * x_bytes, rec, x_bytes);
    rec += x_bytes;
    if (scales > 0) std::memcpy(out.recvXScales + i * scales, rec, scales * sizeof(float));
    rec += scales * sizeof(float);
    std::memcpy(idx.data(), rec, k * sizeof(int64_t));
    std::memcpy(w.data(), rec + k * sizeof(int64_t), k * sizeof(float));
    for (size_t s = 0; s < k; ++s) {
      const bool here = idx[s] >= first && idx[s] < first + local;
      idx[s] = here ? idx[s] - first : -1;
      if (!here) w[s] = 0.0f;
      if (here) ++per_expert[static_cast<size_t>(idx[s])];
    }
    if (out.recvTopkIdx != nullptr)
      std::memcpy(out.recvTopkIdx + i * k, idx.data(), k * sizeof(int64_t));
    if (out.recvTopkWeights != nullptr)
      std::memcpy(out.recvTopkWeights + i * k, w.data(), k * sizeof(float));
  }
  out.numRecvTokens = num_recv;
  const auto align = static_cast<size_t>(args.expertAlignment);
  for (size_t e = 0; out.numRecvTokensPerExpert != nullptr && e < per_expert.size(); ++e)
    out.numRecvTokensPerExpert[e] = static_cast<int>((per_expert[e] + align - 1) / align * align);
}

Status Buffer::combine(const Handle& h, const void* x, int datatype, bool with_weights,
                       const float* topk_weights, void* combined_x, float* combined_weights,
                       Status st) {
  const auto n = static_cast<size_t>(nranks_);
  const auto k = static_cast<size_t>(h.topk);
  const bool bf16 = datatype == ncclBfloat16;
  const size_t row = h.hidden * (bf16 ? 2 : 4);
  const size_t weight_row = with_weights ? k * sizeof(float) : 0;
  const size_t rows_back = h.send_tokens.size();
  const size_t acc_bytes = bf16 ? h.num_tokens * h.hidden * sizeof(float) : 0;
  // [float accumulator (BF16 only)] [rows] [weights, 8-byte aligned: BF16 rows may be odd-sized]
  const size_t rows_bytes = align8(rows_back * row);
  const size_t need = acc_bytes + rows_bytes + rows_back * weight_row;
  if (st.ok() && need > bytes_)
    st = invalid_argument(
        "combine brings {} rows of {} bytes back to rank {}: {} bytes of staging, more than the "
        "buffer's {}",
        rows_back, row + weight_row, rank_, need, bytes_);
  // A rank with nothing to send or receive constrains nothing: its weight messages are empty.
  const bool idle = h.num_tokens == 0 && h.num_recv_tokens == 0;
  CHORUS_RETURN_IF_ERROR(agree("chorusEpCombine", std::move(st),
                               {datatype, idle ? kAnyValue : int64_t{with_weights}},
                               {"datatype", "topk weights (given or not)"}));

  float* acc = bf16 ? reinterpret_cast<float*>(staging_.get()) : static_cast<float*>(combined_x);
  char* rows = staging_.get() + acc_bytes;
  char* weights = rows + rows_bytes;
  std::vector<SendMsg> sends;
  std::vector<RecvMsg> recvs;
  for (size_t q = 0; q < n; ++q) {
    const int peer = static_cast<int>(q);
    const size_t r0 = h.recv_offset[q], rn = h.recv_offset[q + 1] - r0;
    const size_t s0 = h.send_offset[q], sn = h.send_offset[q + 1] - s0;
    sends.push_back({peer, static_cast<const char*>(x) + r0 * row, rn * row});
    recvs.push_back({peer, rows + s0 * row, sn * row});
    if (!with_weights) continue;
    sends.push_back({peer, topk_weights + r0 * k, rn * weight_row});
    recvs.push_back({peer, weights + s0 * weight_row, sn * weight_row});
  }
  CHORUS_RETURN_IF_ERROR(exchange(comm_, rank_, sends, recvs));

  // Ascending rank order per token: rows come back grouped by the rank they went to. The
  // library's kernels add (fp32 sums, bit for bit the scalar a + b) and convert BF16 rows.
  const kernels::ReduceFn add = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  const int kBf16 = static_cast<int>(DataType::kBfloat16);
  const kernels::ConvertFn widen = kernels::kernels().to_float[kBf16];
  const kernels::ConvertFn narrow = kernels::kernels().from_float[kBf16];
  std::vector<float> widened(bf16 ? h.hidden : 0);  // one BF16 row as floats
  std::fill(acc, acc + h.num_tokens * h.hidden, 0.0f);
  if (with_weights) std::fill(combined_weights, combined_weights + h.num_tokens * k, 0.0f);
  for (size_t i = 0; i < rows_back; ++i) {
    float* dst = acc + h.send_tokens[i] * h.hidden;
    const void* src = rows + i * row;
    if (bf16) {
      widen(widened.data(), src, h.hidden);
      src = widened.data();
    }
    add(dst, dst, src, h.hidden);
    if (!with_weights) continue;
    float* wdst = combined_weights + h.send_tokens[i] * k;
    add(wdst, wdst, weights + i * weight_row, k);
  }
  if (bf16) narrow(combined_x, acc, h.num_tokens * h.hidden);
  return Status();
}

}  // namespace chorus::ep
