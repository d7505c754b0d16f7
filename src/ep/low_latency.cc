// SPDX-License-Identifier: Apache-2.0
// File: src/ep/low_latency.cc
// Low-latency dispatch and combine (low_latency.h).
#include "ep/low_latency.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ep/transfer.h"
#include "kernels/compress/block_codec.h"
#include "kernels/reduce/reduce.h"

namespace chorus::ep {

namespace {

size_t align8(size_t v) { return (v + 7) / 8 * 8; }
size_t align64(size_t v) { return (v + 63) / 64 * 64; }

// Dispatch messages: [int64 count | max_tokens records], a record [token bytes | int32 token
// index | topk int32 local expert indices (-1: not on the receiving rank)].
constexpr size_t kHeader = sizeof(int64_t);

size_t record_bytes(size_t payload, int topk) {
  return align8(payload + sizeof(int32_t) * (1 + static_cast<size_t>(topk)));
}

// The FP8 cast of a dispatch: the block codec's layout of a token is [scales | codes].
kernels::BlockCodec fp8_codec(int datatype, bool round_scale) {
  kernels::BlockCodec codec;
  codec.source = datatype == ncclBfloat16 ? DataType::kBfloat16 : DataType::kFloat32;
  codec.format = DataType::kFloat8e4m3;
  codec.scale = round_scale ? kernels::ScaleKind::kUe8m0 : kernels::ScaleKind::kFloat32;
  codec.rounding = kernels::Rounding::kNearestEven;
  codec.block = CHORUS_EP_FP8_BLOCK;
  return codec;
}

size_t elem_size(int datatype) { return datatype == ncclFloat32 ? 4 : 2; }

// A new stream for one call.
Result<chorusStream_t> new_stream() {
  chorusStream_t stream = nullptr;
  ncclResult_t r = chorusStreamCreate(&stream);
  if (r != ncclSuccess) return from_nccl(r, "chorusStreamCreate");
  return stream;
}

// topk_idx checked: experts in [-1, num_experts), none twice in one token.
Status check_routing(const int64_t* topk_idx, size_t num_tokens, int topk, int num_experts) {
  std::vector<size_t> seen(static_cast<size_t>(num_experts), 0);  // token + 1 that named it
  std::vector<int> seen_slot(static_cast<size_t>(num_experts), 0);
  const auto k = static_cast<size_t>(topk);
  for (size_t t = 0; t < num_tokens; ++t)
    for (size_t s = 0; s < k; ++s) {
      const int64_t e = topk_idx[t * k + s];
      if (e == -1) continue;
      if (e < -1 || e >= num_experts)
        return invalid_argument(
            "token {} slot {}: expert index {} is outside [-1, {}) (numExperts {})", t, s, e,
            num_experts, num_experts);
      const auto u = static_cast<size_t>(e);
      if (seen[u] == t + 1)
        return invalid_argument("token {} names expert {} twice (slots {} and {})", t, e,
                                seen_slot[u], s);
      seen[u] = t + 1;
      seen_slot[u] = static_cast<int>(s);
    }
  return Status();
}

// What a dispatch's completion needs.
struct DispatchPlan {
  int rank = 0;
  int nranks = 0;
  size_t hidden = 0;
  size_t max_tokens = 0;
  int topk = 0;
  int local = 0;  // experts per rank
  size_t elem = 0;
  bool fp8 = false;
  bool round_scale = false;
  bool ue8m0 = false;
  size_t payload = 0;
  size_t record = 0;
  size_t message = 0;
  char* recv = nullptr;  // the slot's receive area: n messages
};

// A free slot of `b` into *slot, or the refusal of a third call in flight.
Status take_slot(Buffer& b, int* slot) {
  *slot = b.take_slot();
  if (*slot >= 0) return Status();
  return invalid_usage(
      "two low-latency calls are in flight on this buffer (its two slots): wait a hook first");
}

// The routing and size checks, a slot taken, and the agreement of every rank: OK with *slot
// taken (*same_slot: every rank took that slot number), or the call's refusal with no slot
// taken.
Status agree_dispatch(Buffer& b, const chorusEpLowLatencyDispatchArgs_t& args, int datatype,
                      Status st, int* slot, bool* same_slot) {
  if (st.ok()) st = check_routing(args.topkIdx, args.numTokens, args.topk, args.numExperts);
  if (st.ok()) {
    auto hint = low_latency_size_hint(b.nranks(), args.maxTokensPerRank, args.hidden,
                                      args.numExperts, args.topk);
    if (!hint.ok())
      st = hint.take_status();
    else if (hint.value() > b.bytes())
      st = invalid_argument(
          "the buffer's {} bytes are fewer than chorusEpLowLatencySizeHint(nranks {}, "
          "maxTokensPerRank {}, hidden {}, numExperts {}, topk {}) = {} bytes",
          b.bytes(), b.nranks(), args.maxTokensPerRank, args.hidden, args.numExperts, args.topk,
          hint.value());
  }
  if (st.ok()) st = take_slot(b, slot);
  // The FP8 scale kind: 0 float, 1 roundScale, 2 UE8M0; no constraint without FP8.
  int64_t scale_kind = Buffer::kAnyValue;
  if (args.useFp8 != 0) scale_kind = args.useUe8m0 != 0 ? 2 : args.roundScale != 0 ? 1 : 0;
  std::vector<int64_t> slots;
  Status agreed =
      b.agree("chorusEpLowLatencyDispatch", std::move(st),
              {static_cast<int64_t>(args.hidden), args.topk, args.numExperts,
               static_cast<int64_t>(args.maxTokensPerRank), datatype, args.useFp8 != 0, scale_kind},
              {"hidden", "topk", "numExperts", "maxTokensPerRank", "datatype", "useFp8",
               "the FP8 scale kind (float, roundScale, useUe8m0)"},
              {*slot}, &slots);
  if (!agreed.ok() && *slot >= 0) b.free_slot(*slot);
  *same_slot = agreed.ok() && std::all_of(slots.begin(), slots.end(),
                                          [&](int64_t v) { return v == *slot; });
  return agreed;
}

// Writes every token once per rank of its experts, in token order, into that rank's message
// at msg[rank], with the message headers; h.sent_* receive the (token, slot) pairs each rank
// gets.
void pack_dispatch(const DispatchPlan& p, const chorusEpLowLatencyDispatchArgs_t& args,
                   const kernels::BlockCodec& codec, const std::vector<char*>& msg,
                   LowLatencyHandle& h) {
  const auto n = static_cast<size_t>(p.nranks);
  const auto k = static_cast<size_t>(p.topk);
  std::vector<size_t> count(n, 0);
  std::vector<std::vector<size_t>> pairs(n);
  std::vector<int32_t> local(k);
  std::vector<char> seen(n, 0);
  std::vector<int> ranks;
  const size_t x_row = p.hidden * p.elem;
  for (size_t t = 0; t < args.numTokens; ++t) {
    const int64_t* idx = &h.topk_idx[t * k];
    ranks.clear();
    for (size_t s = 0; s < k; ++s)
      if (idx[s] >= 0 && !seen[static_cast<size_t>(idx[s] / p.local)]) {
        seen[static_cast<size_t>(idx[s] / p.local)] = 1;
        ranks.push_back(static_cast<int>(idx[s] / p.local));
      }
    const char* first = nullptr;  // this token's payload, once written
    for (int q : ranks) {
      const auto u = static_cast<size_t>(q);
      seen[u] = 0;
      char* rec = msg[u] + kHeader + count[u]++ * p.record;
      const char* x = static_cast<const char*>(args.x) + t * x_row;
      if (first != nullptr)
        std::memcpy(rec, first, p.payload);
      else if (p.fp8)
        kernels::encode(codec, rec, x, p.hidden);
      else
        std::memcpy(rec, x, p.payload);
      first = rec;
      const auto token = static_cast<int32_t>(t);
      std::memcpy(rec + p.payload, &token, sizeof(token));
      for (size_t s = 0; s < k; ++s) {
        const bool here = idx[s] >= 0 && idx[s] / p.local == q;
        local[s] = here ? static_cast<int32_t>(idx[s] % p.local) : -1;
        if (here) pairs[u].push_back(t * k + s);
      }
      std::memcpy(rec + p.payload + sizeof(token), local.data(), k * sizeof(int32_t));
    }
  }
  h.sent_offset.assign(n + 1, 0);
  for (size_t q = 0; q < n; ++q) {
    const auto c = static_cast<int64_t>(count[q]);
    std::memcpy(msg[q], &c, sizeof(c));
    h.sent_pairs.insert(h.sent_pairs.end(), pairs[q].begin(), pairs[q].end());
    h.sent_offset[q + 1] = h.sent_pairs.size();
  }
}

// Fans the records of every source rank out to the local experts' rows of `out`.
Status unpack_dispatch(const DispatchPlan& p, const chorusEpLowLatencyDispatchOutput_t& out,
                       LowLatencyHandle& h) {
  const size_t rows = static_cast<size_t>(p.nranks) * p.max_tokens;  // R
  const size_t blocks = p.hidden / CHORUS_EP_FP8_BLOCK;
  const size_t scale_bytes = p.ue8m0 || p.round_scale ? 1 : sizeof(float);
  const size_t x_bytes = p.fp8 ? p.hidden : p.hidden * p.elem;
  const auto k = static_cast<size_t>(p.topk);
  std::vector<size_t> count(static_cast<size_t>(p.local), 0);
  std::vector<int32_t> local(k);
  h.recv_offset.assign(static_cast<size_t>(p.nranks) + 1, 0);
  h.recv_rows.clear();
  for (int s = 0; s < p.nranks; ++s) {
    const char* msg = p.recv + static_cast<size_t>(s) * p.message;
    int64_t n = 0;
    std::memcpy(&n, msg, sizeof(n));
    if (n < 0 || static_cast<size_t>(n) > p.max_tokens)
      return internal_error("EP low-latency dispatch: rank {} announces {} tokens, more than {}", s,
                            n, p.max_tokens);
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const char* rec = msg + kHeader + i * p.record;
      int32_t token = 0;
      std::memcpy(&token, rec + p.payload, sizeof(token));
      std::memcpy(local.data(), rec + p.payload + sizeof(token), k * sizeof(int32_t));
      for (size_t slot = 0; slot < k; ++slot) {
        const int32_t e = local[slot];
        if (e < 0) continue;
        if (e >= p.local || count[static_cast<size_t>(e)] >= rows || token < 0 ||
            static_cast<size_t>(token) >= p.max_tokens)
          return internal_error("EP low-latency dispatch: rank {} sent expert {} of token {}", s, e,
                                token);
        const size_t row = static_cast<size_t>(e) * rows + count[static_cast<size_t>(e)]++;
        const char* codes = p.fp8 ? rec + blocks * (p.round_scale ? 1 : sizeof(float)) : rec;
        std::memcpy(static_cast<char*>(out.recvX) + row * x_bytes, codes, x_bytes);
        if (p.fp8 && p.round_scale && !p.ue8m0) {
          // The codec's UE8M0 byte b is the scale 2^(b - 127); 0xff is NaN.
          float* dst = static_cast<float*>(out.recvXScales) + row * blocks;
          for (size_t b = 0; b < blocks; ++b) {
            const auto byte = static_cast<uint8_t>(rec[b]);
            dst[b] = byte == 0xff ? std::nanf("") : std::ldexp(1.0f, int{byte} - 127);
          }
        } else if (p.fp8) {
          std::memcpy(static_cast<char*>(out.recvXScales) + row * blocks * scale_bytes, rec,
                      blocks * scale_bytes);
        }
        if (out.recvSrcInfo != nullptr)
          out.recvSrcInfo[row] =
              static_cast<int64_t>(s) * static_cast<int64_t>(p.max_tokens) + token;
        h.recv_rows.push_back(row);
      }
    }
    h.recv_offset[static_cast<size_t>(s) + 1] = h.recv_rows.size();
  }
  for (size_t e = 0; e < count.size(); ++e) out.recvCount[e] = static_cast<int>(count[e]);
  h.complete = true;
  return Status();
}

}  // namespace

LowLatencyCall::~LowLatencyCall() {
  if (stream_ != nullptr) chorusStreamDestroy(stream_);
  buffer_->free_slot(slot_);
}

Status LowLatencyCall::complete() {
  const ncclResult_t r = chorusStreamSynchronize(stream_);
  if (r != ncclSuccess) return from_nccl(r, "EP low-latency transfer");
  if (step_ != 0) CHORUS_RETURN_IF_ERROR(buffer_->areas().wait_written(step_, call_));
  return finish_();
}

Result<size_t> low_latency_size_hint(int nranks, size_t max_tokens, size_t hidden, int num_experts,
                                     int topk) {
  // The largest record is FP32 without FP8. Dispatch: a message per peer sent and one
  // received. Combine: up to min(topk, L) rows per token of every rank sent back, up to topk
  // rows per own token received, FP32 rows the largest.
  using u128 = unsigned __int128;
  const u128 n = static_cast<unsigned>(nranks), m = max_tokens;
  const u128 local = static_cast<unsigned>(num_experts / nranks);
  const u128 k = static_cast<unsigned>(topk);
  const u128 message = kHeader + m * record_bytes(hidden * 4, topk);
  const u128 dispatch = 2 * n * message;
  const u128 combine = (n * m * std::min(k, local) + m * k) * hidden * 4 + 64;
  const u128 slot = (std::max(dispatch, combine) + 63) / 64 * 64;
  if (slot * Buffer::kSlots > SIZE_MAX / 2)
    return invalid_argument(
        "{} tokens per rank of hidden {}, topk {} and {} experts on {} ranks need more than 2^63 "
        "bytes",
        max_tokens, hidden, topk, num_experts, nranks);
  return static_cast<size_t>(slot * Buffer::kSlots);
}

Status low_latency_dispatch(const std::shared_ptr<Buffer>& buffer,
                            const chorusEpLowLatencyDispatchArgs_t& args, int datatype,
                            const chorusEpLowLatencyDispatchOutput_t& out, Status st,
                            std::shared_ptr<LowLatencyHandle>* handle,
                            std::unique_ptr<LowLatencyCall>* call) {
  Buffer& b = *buffer;
  // Every rank's first call maps the staging areas of its same-host peers (collective).
  if (!b.areas().connected()) CHORUS_RETURN_IF_ERROR(b.areas().connect());
  int slot = -1;
  bool same_slot = false;
  CHORUS_RETURN_IF_ERROR(agree_dispatch(b, args, datatype, std::move(st), &slot, &same_slot));
  // On every rank (normal-mode calls count steps too), before anything can fail here.
  const uint64_t step = b.areas().begin_step();
  const bool fp8 = args.useFp8 != 0;
  DispatchPlan p;
  p.rank = b.rank();
  p.nranks = b.nranks();
  p.hidden = args.hidden;
  p.max_tokens = args.maxTokensPerRank;
  p.topk = args.topk;
  p.local = args.numExperts / b.nranks();
  p.elem = elem_size(datatype);
  p.fp8 = fp8;
  p.round_scale = fp8 && (args.roundScale != 0 || args.useUe8m0 != 0);
  p.ue8m0 = fp8 && args.useUe8m0 != 0;
  const kernels::BlockCodec codec = fp8_codec(datatype, p.round_scale);
  p.payload = fp8 ? kernels::compressed_bytes(codec, p.hidden) : p.hidden * p.elem;
  p.record = record_bytes(p.payload, p.topk);
  p.message = kHeader + p.max_tokens * p.record;
  const auto n = static_cast<size_t>(p.nranks);
  char* send = b.slot(slot);
  char* recv = send + n * p.message;
  p.recv = recv;

  auto h = std::make_shared<LowLatencyHandle>();
  h->buffer_id = b.id();
  h->num_tokens = args.numTokens;
  h->hidden = args.hidden;
  h->max_tokens = args.maxTokensPerRank;
  h->topk = args.topk;
  h->num_experts = args.numExperts;
  const auto k = static_cast<size_t>(args.topk);
  h->topk_idx.assign(args.topkIdx, args.topkIdx + args.numTokens * k);

  // Where each rank's message is written: this rank's own straight into its receive area; a
  // same-host rank's it maps, on the same slot, into that rank's receive area where it reads
  // it (after the messages of the ranks below this one); the others' into the send area.
  PeerAreas& areas = b.areas();
  const size_t me = static_cast<size_t>(p.rank);
  std::vector<char*> msg(n);
  std::vector<uint8_t> mapped(n, 0);
  for (size_t q = 0; q < n; ++q) {
    const int peer = static_cast<int>(q);
    if (q == me) {
      msg[q] = recv + me * p.message;
    } else if (same_slot && areas.writes_into(peer)) {
      msg[q] = b.peer_slot(peer, slot) + n * p.message + me * p.message;
      mapped[q] = 1;
    } else {
      msg[q] = send + q * p.message;
    }
  }
  pack_dispatch(p, args, codec, msg, *h);
  bool written_by = false;  // a same-host rank writes into this rank's slot
  std::vector<SendMsg> sends;
  std::vector<RecvMsg> recvs;
  for (size_t q = 0; q < n; ++q) {
    const int peer = static_cast<int>(q);
    if (q == me) continue;
    if (mapped[q] != 0)
      areas.mark_written(peer, step);
    else
      sends.push_back({peer, msg[q], p.message});
    if (same_slot && areas.written_by(peer))
      written_by = true;
    else
      recvs.push_back({peer, recv + q * p.message, p.message});
  }

  auto stream = new_stream();
  if (!stream.ok()) {
    b.free_slot(slot);
    return stream.take_status();
  }
  auto posted = std::make_unique<LowLatencyCall>(
      buffer, slot, stream.value(), [p, out, h]() { return unpack_dispatch(p, out, *h); },
      written_by ? step : 0, "chorusEpLowLatencyDispatch");
  CHORUS_RETURN_IF_ERROR(post_remote(b.comm(), b.rank(), sends, recvs, stream.value()));
  *handle = std::move(h);
  *call = std::move(posted);
  return Status();
}

Status low_latency_combine(const std::shared_ptr<Buffer>& buffer,
                           const std::shared_ptr<LowLatencyHandle>& handle, const void* x,
                           int datatype, const float* topk_weights, void* combined_x, Status st,
                           std::unique_ptr<LowLatencyCall>* call) {
  Buffer& b = *buffer;
  const auto n = static_cast<size_t>(b.nranks());
  const auto me = static_cast<size_t>(b.rank());
  int slot = -1;
  if (st.ok()) st = take_slot(b, &slot);
  // The shape of the handles (the same dispatch on every rank), and what the senders need to
  // write into this rank's slot: the slot, and where each rank's rows go in its receive area.
  const LowLatencyHandle* hp = st.ok() ? handle.get() : nullptr;
  const auto fact = [&](size_t v) { return hp != nullptr ? static_cast<int64_t>(v) : Buffer::kAnyValue; };
  std::vector<int64_t> extra(n + 2, -1);
  extra[0] = slot;
  for (size_t q = 0; hp != nullptr && q <= n; ++q) extra[q + 1] = static_cast<int64_t>(hp->sent_offset[q]);
  std::vector<int64_t> values;  // [rank][slot | sent_offset 0 .. n]
  Status agreed = b.agree(
      "chorusEpLowLatencyCombine", std::move(st),
      {datatype, fact(hp != nullptr ? hp->hidden : 0), fact(hp != nullptr ? hp->max_tokens : 0),
       fact(hp != nullptr ? static_cast<size_t>(hp->topk) : 0),
       fact(hp != nullptr ? static_cast<size_t>(hp->num_experts) : 0)},
      {"datatype", "the dispatch's hidden", "the dispatch's maxTokensPerRank", "the dispatch's topk",
       "the dispatch's numExperts"},
      extra, &values);
  if (!agreed.ok()) {
    if (slot >= 0) b.free_slot(slot);
    return agreed;
  }
  const auto value = [&](size_t q, size_t i) { return values[q * (n + 2) + i]; };
  bool same_slot = true;
  for (size_t q = 0; q < n; ++q) same_slot = same_slot && value(q, 0) == slot;
  const uint64_t step = b.areas().begin_step();  // on every rank, as dispatch

  const LowLatencyHandle& h = *handle;
  const auto k = static_cast<size_t>(h.topk);
  const size_t row = h.hidden * elem_size(datatype);
  // [rows back to each source rank, in its message order (room for max_tokens * min(topk, L)
  // per rank)] [rows coming back, per rank, at its sent_offset]: the same place on every rank.
  const size_t local = static_cast<size_t>(h.num_experts) / n;
  const size_t send_rows = n * h.max_tokens * std::min(k, local);
  char* send = b.slot(slot);
  char* recv = send + align64(send_rows * row);
  PeerAreas& areas = b.areas();
  std::vector<SendMsg> sends;
  std::vector<RecvMsg> recvs;
  bool written_by = false;  // a same-host rank writes into this rank's slot
  for (size_t q = 0; q < n; ++q) {
    const int peer = static_cast<int>(q);
    const size_t r0 = h.recv_offset[q], rn = h.recv_offset[q + 1] - r0;
    const size_t s0 = h.sent_offset[q], sn = h.sent_offset[q + 1] - s0;
    // This rank's rows for q: straight where q reads them (itself; a same-host rank it maps,
    // on the same slot), or into the send area.
    const bool mapped = q != me && same_slot && areas.writes_into(peer);
    char* dst = send + r0 * row;
    if (q == me) {
      dst = recv + s0 * row;
    } else if (mapped) {
      const auto at = static_cast<size_t>(value(q, me + 1));
      if (at + rn > h.max_tokens * k || static_cast<size_t>(value(q, me + 2)) - at != rn) {
        b.free_slot(slot);
        return internal_error(
            "EP low-latency combine: rank {} expects {} rows from rank {} at row {}, which sends {}",
            q, value(q, me + 2) - value(q, me + 1), me, at, rn);
      }
      dst = b.peer_slot(peer, slot) + (recv - send) + at * row;
    }
    for (size_t i = 0; i < rn; ++i)
      std::memcpy(dst + i * row, static_cast<const char*>(x) + h.recv_rows[r0 + i] * row, row);
    if (q == me) continue;
    if (mapped)
      areas.mark_written(peer, step);
    else
      sends.push_back({peer, dst, rn * row});
    if (same_slot && areas.written_by(peer))
      written_by = true;
    else
      recvs.push_back({peer, recv + s0 * row, sn * row});
  }
  // Where the row of each (token, slot) pair will be.
  std::vector<const char*> where(h.num_tokens * k, nullptr);
  for (size_t i = 0; i < h.sent_pairs.size(); ++i) where[h.sent_pairs[i]] = recv + i * row;
  std::vector<float> weights(topk_weights, topk_weights + h.num_tokens * k);

  auto stream = new_stream();
  if (!stream.ok()) {
    b.free_slot(slot);
    return stream.take_status();
  }
  auto finish = [handle, where = std::move(where), weights = std::move(weights), datatype,
                 combined_x]() -> Status {
    const LowLatencyHandle& hh = *handle;
    const size_t hidden = hh.hidden, kk = static_cast<size_t>(hh.topk);
    const bool bf16 = datatype == ncclBfloat16;
    const kernels::ReduceFn add = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
    const kernels::ScaleFn scale = kernels::scale_fn(DataType::kFloat32);
    const int kBf16 = static_cast<int>(DataType::kBfloat16);
    const kernels::ConvertFn widen = kernels::kernels().to_float[kBf16];
    const kernels::ConvertFn narrow = kernels::kernels().from_float[kBf16];
    std::vector<float> term(hidden), acc(bf16 ? hidden : 0);
    for (size_t t = 0; t < hh.num_tokens; ++t) {
      float* sum = bf16 ? acc.data() : static_cast<float*>(combined_x) + t * hidden;
      std::fill(sum, sum + hidden, 0.0f);
      for (size_t s = 0; s < kk; ++s) {
        const char* src = where[t * kk + s];
        if (src == nullptr) continue;  // slot -1
        if (bf16) {
          widen(term.data(), src, hidden);
          src = reinterpret_cast<const char*>(term.data());
        }
        scale(term.data(), src, hidden, &weights[t * kk + s]);
        add(sum, sum, term.data(), hidden);
      }
      if (bf16) narrow(static_cast<uint16_t*>(combined_x) + t * hidden, acc.data(), hidden);
    }
    return Status();
  };
  auto posted = std::make_unique<LowLatencyCall>(buffer, slot, stream.value(), std::move(finish),
                                                 written_by ? step : 0, "chorusEpLowLatencyCombine");
  CHORUS_RETURN_IF_ERROR(post_remote(b.comm(), b.rank(), sends, recvs, stream.value()));
  *call = std::move(posted);
  return Status();
}

}  // namespace chorus::ep
