// SPDX-License-Identifier: Apache-2.0
// File: src/ep/dispatch.cc
// Normal-mode dispatch through an EP buffer (buffer.h): route, exchange counts, agree, write
// or send each token's record once per destination rank (or host), unpack what arrived.
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

namespace {

// A dispatch's outputs allocated by the caller's out.allocate (ep.h) for the num_recv rows that
// arrive, and checked as check_dispatch checks given ones. Called before the agreement, so that
// a failure here refuses the call on every rank before any token moves.
Status allocate_outputs(chorusEpDispatchOutput_t& out, size_t num_recv, bool fp8, int rank) {
  int returned = 0;
  try {
    returned = out.allocate(out.allocateCtx, num_recv, &out);
  } catch (...) {
    // ep.h forbids it; caught anyway, as a hang of the other ranks in the agreement is worse.
    returned = -1;
  }
  if (returned != 0)
    return make_status(Code::kSystemError,
                       "the allocate callback of chorusEpDispatchOutput_t failed on rank {} for {} "
                       "tokens (it returned {})",
                       rank, num_recv, returned);
  if (num_recv > 0 && (out.recvX == nullptr || (fp8 && out.recvXScales == nullptr)))
    return invalid_argument(
        "the allocate callback left {} NULL for the {} tokens arriving on rank {}",
        out.recvX == nullptr ? "recvX" : "recvXScales (FP8 tokens)", num_recv, rank);
  if (!fp8 && out.recvXScales != nullptr)
    return invalid_argument(
        "the allocate callback set recvXScales on rank {}: it is for FP8 tokens only", rank);
  if (out.recvCapacity < num_recv)
    return invalid_argument(
        "{} tokens arrive on rank {} but the allocate callback set recvCapacity {} rows",
        num_recv, rank, out.recvCapacity);
  return Status();
}

}  // namespace

Result<std::shared_ptr<Handle>> Buffer::dispatch(const chorusEpDispatchArgs_t& args, int datatype,
                                                 chorusEpDispatchOutput_t& out, Status st,
                                                 Stream* stream) {
  drain();  // the previous call's work is done before this call's counts go out
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

  // Every rank's first call maps the staging areas of its same-host peers (collective).
  if (!areas_->connected()) CHORUS_RETURN_IF_ERROR(areas_->connect());

  // Counts, known to every rank (a refusing rank announces none): row s holds how many tokens
  // rank s sends to each rank, then how many it sends to each host's forwarder.
  const auto nh = static_cast<size_t>(areas_->num_hosts());
  const size_t width = n + nh;
  // Tokens for each host this rank sends through a forwarder: those with an expert there.
  std::vector<std::vector<size_t>> forwarded(nh);
  for (size_t h = 0; st.ok() && h < nh; ++h) {
    if (areas_->forwarder(rank_, static_cast<int>(h)) < 0) continue;
    const std::vector<int>& there = areas_->host_ranks(static_cast<int>(h));
    for (size_t t = 0; t < args.numTokens; ++t)
      if (std::any_of(there.begin(), there.end(), [&](int q) {
            return routing.in_rank[t * n + static_cast<size_t>(q)] != 0;
          }))
        forwarded[h].push_back(t);
  }
  std::vector<int64_t> mine(width, 0), counts(n * width, 0);
  for (size_t q = 0; st.ok() && q < n; ++q) mine[q] = routing.per_rank[q];
  for (size_t h = 0; h < nh; ++h) mine[n + h] = static_cast<int64_t>(forwarded[h].size());
  ncclResult_t r = ncclAllGather(mine.data(), counts.data(), width, ncclInt64, comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "ncclAllGather of the EP token counts");
  const auto me = static_cast<size_t>(rank_);
  const auto my_host = static_cast<size_t>(areas_->host_of(rank_));
  std::vector<int64_t> recv_count(n, 0);
  for (size_t q = 0; q < n; ++q) recv_count[q] = counts[q * width + me];
  size_t num_forwarded_in = 0;  // tokens this rank receives to forward on its host
  for (size_t q = 0; q < n; ++q)
    if (areas_->forwarder(static_cast<int>(q), static_cast<int>(my_host)) == rank_)
      num_forwarded_in += static_cast<size_t>(counts[q * width + n + my_host]);

  const size_t elem = st.ok() ? elem_size(datatype) : 1;
  const size_t record = st.ok() ? record_bytes(args.hidden, elem, args.topk) : 0;
  std::vector<size_t> recv_offset(n + 1, 0);
  for (size_t q = 0; q < n; ++q)
    recv_offset[q + 1] = recv_offset[q] + static_cast<size_t>(recv_count[q]);
  const size_t num_recv = recv_offset[n];
  const size_t num_sent = routing.send_tokens.size();
  // Outputs the caller allocates are sized below, once this rank's other checks have passed.
  if (st.ok() && out.allocate == nullptr && num_recv > out.recvCapacity)
    st = invalid_argument("{} tokens arrive on rank {} but the outputs hold recvCapacity {} rows",
                          num_recv, rank_, out.recvCapacity);
  const size_t staged = num_sent + num_recv + num_forwarded_in;
  if (st.ok() && staged * record > bytes()) {
    const size_t max_tokens = std::max(args.numTokens, (num_recv + n - 1) / n);
    auto hint = size_hint(nranks_, max_tokens, args.hidden, args.topk);
    st = invalid_argument(
        "rank {} sends {}, receives {} and forwards {} tokens of {} bytes: {} bytes of staging, "
        "more than the buffer's {}; a buffer of chorusEpBufferSizeHint(nranks {}, maxTokens {}, "
        "hidden {}, topk {}) = {} bytes allows it",
        rank_, num_sent, num_recv, num_forwarded_in, record, staged * record, bytes(), nranks_,
        max_tokens, args.hidden, args.topk, hint.ok() ? hint.value() : SIZE_MAX);
  }
  if (st.ok() && out.allocate != nullptr) st = allocate_outputs(out, num_recv, elem == 1, rank_);
  CHORUS_RETURN_IF_ERROR(
      agree("chorusEpDispatch", std::move(st),
            {static_cast<int64_t>(args.hidden), args.topk, args.numExperts, datatype},
            {"hidden", "topk", "numExperts", "datatype"}));

  // Received (token, slot) pairs per local expert, known now (DeepEP's notify_dispatch): every
  // rank's pairs per expert gathered, this rank's experts' columns summed. So the counts are
  // the caller's when the call returns, also when the tokens still move on a stream.
  {
    const auto experts = static_cast<size_t>(args.numExperts);
    std::vector<int> pairs(n * experts, 0);
    r = ncclAllGather(routing.per_expert.data(), pairs.data(), experts, ncclInt32, comm_, nullptr);
    if (r != ncclSuccess) return from_nccl(r, "ncclAllGather of the EP tokens per expert");
    const size_t local = experts / n, first = local * me;
    const auto align = static_cast<size_t>(args.expertAlignment);
    for (size_t e = 0; out.numRecvTokensPerExpert != nullptr && e < local; ++e) {
      size_t sum = 0;
      for (size_t q = 0; q < n; ++q) sum += static_cast<size_t>(pairs[q * experts + first + e]);
      out.numRecvTokensPerExpert[e] = static_cast<int>((sum + align - 1) / align * align);
    }
  }

  auto h = std::make_shared<Handle>();
  h->buffer_id = id_;
  h->num_tokens = args.numTokens;
  h->num_recv_tokens = num_recv;
  h->hidden = args.hidden;
  h->topk = args.topk;
  h->send_offset = std::move(routing.send_offset);
  h->send_tokens = std::move(routing.send_tokens);
  h->recv_offset = std::move(recv_offset);
  h->peer_rows_before.assign(n, 0);
  h->peer_rows_total.assign(n, 0);
  for (size_t q = 0; q < n; ++q)
    for (size_t j = 0; j < n; ++j) {
      const auto c = static_cast<size_t>(counts[q * width + j]);
      h->peer_rows_total[q] += c;
      if (j < me) h->peer_rows_before[q] += c;
    }

  auto m = std::make_shared<DispatchMove>();
  m->args = args;
  m->out = out;
  m->elem = elem;
  m->record = record;
  m->num_recv = num_recv;
  m->handle = h;
  m->forwarded_tokens = std::move(forwarded);
  m->counts = std::move(counts);
  m->width = width;
  m->step = areas_->begin_step();
  out.numRecvTokens = num_recv;  // known now (DeepEP's CPU-side count); the rest in finish
  CHORUS_RETURN_IF_ERROR(run(
      "chorusEpDispatch", stream, m, [this, m](Part part) { return stage_dispatch(*m, part); },
      [this, m, me] {
        // Blocking, while other ranks' records are on the way: this rank's own, written by now.
        const size_t at = m->read_at(me, me);
        m->own_records = {at, at + m->to_rank(me, me)};
        unpack(*m, m->own_records.first, m->own_records.second);
      },
      [this, m](const Arrivals& a) { return finish_dispatch(*m, a); }));
  return h;
}

Status Buffer::stage_dispatch(DispatchMove& m, Part part) {
  const bool local_part = part == Part::kLocal || part == Part::kAll;
  const bool remote_part = part == Part::kRemote || part == Part::kAll;
  const chorusEpDispatchArgs_t& args = m.args;
  const Handle& h = *m.handle;
  const size_t record = m.record;
  const auto n = static_cast<size_t>(nranks_);
  const auto nh = static_cast<size_t>(areas_->num_hosts());
  const auto me = static_cast<size_t>(rank_);
  const int my_host = areas_->host_of(rank_);
  const size_t x_bytes = args.hidden * m.elem;
  const size_t scale_bytes = m.elem == 1 ? args.hidden / CHORUS_EP_FP8_BLOCK * sizeof(float) : 0;
  const auto k = static_cast<size_t>(args.topk);
  const auto write_record = [&](size_t t, char* rec, bool wanted) {
    if (!wanted) return;
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
  };
  // This rank's staging: [receive area: records from every rank, by source rank][send area:
  // records for the ranks and forwarders it does not write into][records to forward].
  char* recv_area = areas_->local();
  char* send_area = recv_area + m.num_recv * record;
  char* forward_area = send_area + h.send_tokens.size() * record;
  // The messages, kept in `m` by the listing pass only (the writing passes may run on the
  // worker while the calling thread posts them).
  std::vector<SendMsg> sends;
  std::vector<RecvMsg> recvs;
  std::vector<DispatchMove::Forwarded> forwarded;
  size_t send_at = 0;
  for (size_t q = 0; q < n; ++q) {
    const int peer = static_cast<int>(q);
    const size_t first = h.send_offset[q], last = h.send_offset[q + 1];
    if (areas_->writes_into(peer)) {
      const size_t at = m.read_at(me, q);
      if ((at + last - first) * record > areas_->area_bytes(peer))
        return internal_error("EP records [{}, {}) for rank {} overrun its buffer of {} bytes", at,
                              at + last - first, peer, areas_->area_bytes(peer));
      for (size_t i = first; i < last; ++i)
        write_record(h.send_tokens[i], areas_->area(peer) + (at + i - first) * record, local_part);
    } else if (areas_->forwarder(rank_, areas_->host_of(peer)) < 0) {
      for (size_t i = first; i < last; ++i)
        write_record(h.send_tokens[i], send_area + (send_at + i - first) * record, remote_part);
      for (size_t p = 0; p < piece_count(last - first, record); ++p) {
        const auto [begin, end] = piece_items(last - first, record, p);
        sends.push_back({peer, send_area + (send_at + begin) * record, (end - begin) * record});
      }
      send_at += last - first;
    }
  }
  // A host with a forwarder gets each token once, whichever of its ranks hold its experts.
  for (size_t host = 0; host < nh; ++host) {
    const int via = areas_->forwarder(rank_, static_cast<int>(host));
    if (via < 0) continue;
    const size_t first = send_at;
    for (size_t t : m.forwarded_tokens[host])
      write_record(t, send_area + send_at++ * record, remote_part);
    sends.push_back({via, send_area + first * record, (send_at - first) * record});
  }
  // Records sent straight here travel in pieces (piece_count), listed piece by piece across
  // the senders: finish_dispatch unpacks each as it arrives, in that order.
  for (size_t p = 0; p < kMaxPieces; ++p) {
    size_t recv_at = 0;
    for (size_t q = 0; q < n; ++q) {
      const int peer = static_cast<int>(q);
      const size_t c = m.to_rank(q, me);
      if (!areas_->written_by(peer) && areas_->forwarder(peer, my_host) < 0 &&
          p < piece_count(c, record)) {
        const auto [begin, end] = piece_items(c, record, p);
        recvs.push_back({peer, recv_area + (recv_at + begin) * record, (end - begin) * record});
      }
      recv_at += c;
    }
  }
  size_t forward_at = 0;
  for (size_t q = 0; q < n; ++q) {
    if (areas_->forwarder(static_cast<int>(q), my_host) != rank_) continue;
    const size_t c = m.to_rank(q, n + static_cast<size_t>(my_host));
    recvs.push_back({static_cast<int>(q), forward_area + forward_at * record, c * record});
    forwarded.push_back({q, forward_at, c});
    forward_at += c;
  }
  if (part == Part::kNone) {
    m.sends = std::move(sends);
    m.recvs = std::move(recvs);
    m.forwarded = std::move(forwarded);
    m.forward_area = forward_area;
  }
  return Status();
}

Status Buffer::finish_dispatch(DispatchMove& m, const Arrivals& arrivals) {
  // Records that came straight from their sender: unpacked message by message as they arrive.
  // unpacked[i]: record i is in the caller's outputs.
  std::vector<uint8_t> unpacked(m.num_recv, 0);
  std::fill(unpacked.begin() + static_cast<ptrdiff_t>(m.own_records.first),
            unpacked.begin() + static_cast<ptrdiff_t>(m.own_records.second), 1);
  const char* recv_area = areas_->local();
  size_t arrival = 0;
  for (const RecvMsg& r : m.recvs) {
    if (!travels(r, rank_)) continue;  // what Arrivals counts
    ++arrival;
    const char* d = static_cast<const char*>(r.data);
    if (d >= m.forward_area) continue;  // a message to forward: below, once all are in
    CHORUS_RETURN_IF_ERROR(arrivals.wait(arrival));
    const size_t first = static_cast<size_t>(d - recv_area) / m.record;
    const size_t last = first + r.bytes / m.record;
    unpack(m, first, last);
    std::fill(unpacked.begin() + static_cast<ptrdiff_t>(first),
              unpacked.begin() + static_cast<ptrdiff_t>(last), 1);
  }
  CHORUS_RETURN_IF_ERROR(arrivals.wait(arrivals.total()));
  const chorusEpDispatchArgs_t& args = m.args;
  const size_t record = m.record;
  const auto n = static_cast<size_t>(nranks_);
  const int my_host = areas_->host_of(rank_);
  const size_t x_bytes = args.hidden * m.elem;
  const size_t scale_bytes = m.elem == 1 ? args.hidden / CHORUS_EP_FP8_BLOCK * sizeof(float) : 0;
  const auto k = static_cast<size_t>(args.topk);
  // Forward: each record to the ranks of this host that hold one of its experts, in the place
  // where they read that source's records (tokens arrive in ascending order, as they are read).
  const int64_t local = args.numExperts / nranks_;
  std::vector<size_t> next(n, 0);
  std::vector<int64_t> idx(k);
  for (const DispatchMove::Forwarded& f : m.forwarded) {
    for (int q : areas_->host_ranks(my_host)) next[static_cast<size_t>(q)] = m.read_at(f.source, static_cast<size_t>(q));
    for (size_t i = 0; i < f.count; ++i) {
      const char* rec = m.forward_area + (f.first + i) * record;
      std::memcpy(idx.data(), rec + x_bytes + scale_bytes, k * sizeof(int64_t));
      for (int q : areas_->host_ranks(my_host)) {
        const auto dest = static_cast<size_t>(q);
        const bool wanted = std::any_of(idx.begin(), idx.end(), [&](int64_t e) {
          return e >= 0 && e / local == static_cast<int64_t>(q);
        });
        if (!wanted) continue;
        if ((next[dest] + 1) * record > areas_->area_bytes(q))
          return internal_error("EP record {} forwarded to rank {} overruns its buffer of {} bytes",
                                next[dest], q, areas_->area_bytes(q));
        std::memcpy(areas_->area(q) + next[dest]++ * record, rec, record);
      }
    }
  }
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_ && areas_->writes_into(q)) areas_->mark_written(q, m.step);
  CHORUS_RETURN_IF_ERROR(areas_->wait_written(m.step, "chorusEpDispatch"));
  // The rest: written by this host's ranks, or forwarded.
  for (size_t i = 0; i < m.num_recv;) {
    if (unpacked[i]) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < m.num_recv && !unpacked[end]) ++end;
    unpack(m, i, end);
    i = end;
  }
  return Status();
}

void Buffer::unpack(const DispatchMove& m, size_t begin, size_t end) const {
  const chorusEpDispatchArgs_t& args = m.args;
  const chorusEpDispatchOutput_t& out = m.out;
  const size_t elem = m.elem, record = m.record;
  const size_t x_bytes = args.hidden * elem;
  const size_t scales = elem == 1 ? args.hidden / CHORUS_EP_FP8_BLOCK : 0;
  const auto k = static_cast<size_t>(args.topk);
  const int64_t local = args.numExperts / nranks_;
  const int64_t first = local * rank_;
  const char* recv_area = areas_->local();
  std::vector<int64_t> idx(k);
  std::vector<float> w(k);
  for (size_t i = begin; i < end; ++i) {
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
    }
    if (out.recvTopkIdx != nullptr)
      std::memcpy(out.recvTopkIdx + i * k, idx.data(), k * sizeof(int64_t));
    if (out.recvTopkWeights != nullptr)
      std::memcpy(out.recvTopkWeights + i * k, w.data(), k * sizeof(float));
  }
}

}  // namespace chorus::ep
