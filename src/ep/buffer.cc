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

#include "common/params.h"
#include "ep/routing.h"
#include "ep/transfer.h"
#include "kernels/reduce/reduce.h"

namespace chorus::ep {

namespace {

size_t elem_size(int datatype) {
  return datatype == ncclFloat32 ? 4 : datatype == ncclBfloat16 ? 2 : 1;
}
size_t align8(size_t v) { return (v + 7) / 8 * 8; }
// Where combine's weights start in a staging area after `rows` rows of `row` bytes (8-byte
// aligned: BF16 rows may be odd-sized).
size_t combine_weights_at(size_t rows, size_t row) { return align8(rows * row); }

// Dispatch's records and combine's rows between a pair of ranks on different hosts travel in
// pieces of about CHORUS_EP_PIECE_BYTES, at most kMaxPieces: the receiver unpacks or sums what
// the first pieces brought while the later ones travel. Both ends compute it from the same
// count of items of `item` bytes.
constexpr size_t kMaxPieces = 16;
size_t piece_count(size_t items, size_t item) {
  const auto piece = static_cast<size_t>(params::kEpPieceBytes.get());
  return std::clamp<size_t>(items * item / piece, 1, std::min(kMaxPieces, std::max<size_t>(items, 1)));
}
// Items [first, last) of piece p (< piece_count(items, item)).
std::pair<size_t, size_t> piece_items(size_t items, size_t item, size_t p) {
  const size_t n = piece_count(items, item);
  return {items * p / n, items * (p + 1) / n};
}

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
  // up to nranks * max_tokens records in the receive area, and those to forward; FP32 records
  // the largest. Combine's rows coming back fit in the same bytes.
  const unsigned __int128 record = record_bytes(hidden, 4, topk);
  const auto copies = static_cast<unsigned __int128>(std::min(topk, nranks));
  // Room to forward: with several hosts, a rank may receive up to every other host's tokens
  // for the ranks of its host (at most nranks - 2 other ranks send to it).
  const auto forwarding = static_cast<unsigned __int128>(nranks > 2 ? nranks - 2 : 0);
  const unsigned __int128 bytes =
      max_tokens * record * (copies + static_cast<unsigned>(nranks) + forwarding);
  if (bytes > SIZE_MAX / 2)
    return invalid_argument(
        "{} tokens of hidden {} and topk {} on {} ranks need more than 2^63 bytes", max_tokens,
        hidden, topk, nranks);
  return static_cast<size_t>(bytes);
}

Buffer::Buffer(ncclComm_t comm, int rank, int nranks, std::unique_ptr<PeerAreas> areas)
    : comm_(comm),
      rank_(rank),
      nranks_(nranks),
      id_(g_next_id.fetch_add(1)),
      areas_(std::move(areas)) {}

Buffer::~Buffer() {
  worker_.reset();  // runs what asynchronous calls queued
  if (own_stream_ != nullptr) chorusStreamDestroy(own_stream_);
}

Result<std::unique_ptr<Buffer>> Buffer::create(ncclComm_t comm, size_t bytes) {
  int rank = 0, nranks = 0;
  ncclResult_t r = ncclCommUserRank(comm, &rank);
  if (r != ncclSuccess) return from_nccl(r, "ncclCommUserRank");
  r = ncclCommCount(comm, &nranks);
  if (r != ncclSuccess) return from_nccl(r, "ncclCommCount");
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<PeerAreas> areas,
                          PeerAreas::create(comm, rank, nranks, bytes));
  return std::unique_ptr<Buffer>(new Buffer(comm, rank, nranks, std::move(areas)));
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
                     const std::vector<const char*>& names, const std::vector<int64_t>& extra,
                     std::vector<int64_t>* values) {
  // [verdict | facts | extra]
  const size_t width = 1 + facts.size() + extra.size();
  std::vector<int64_t> all(width * static_cast<size_t>(nranks_));
  std::vector<int64_t> row(width);
  row[0] = mine.ok() ? 0 : 1;
  std::copy(facts.begin(), facts.end(), row.begin() + 1);
  std::copy(extra.begin(), extra.end(), row.begin() + 1 + static_cast<ptrdiff_t>(facts.size()));
  ncclResult_t r = ncclAllGather(row.data(), all.data(), width, ncclInt64, comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "ncclAllGather of the EP verdicts");
  if (values != nullptr) {
    values->clear();
    for (size_t q = 0; q < static_cast<size_t>(nranks_); ++q)
      values->insert(values->end(), all.begin() + static_cast<ptrdiff_t>(q * width + 1 + facts.size()),
                     all.begin() + static_cast<ptrdiff_t>((q + 1) * width));
  }
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

struct Buffer::DispatchMove : Move {
  chorusEpDispatchArgs_t args{};
  chorusEpDispatchOutput_t out{};  // the caller's output arrays
  size_t elem = 0, record = 0, num_recv = 0;
  std::shared_ptr<const Handle> handle;  // the tokens for each rank
  // This rank's tokens for each host's forwarder (PeerAreas::forwarder), ascending.
  std::vector<std::vector<size_t>> forwarded_tokens;
  // Row s (`width` = nranks + hosts wide): the tokens rank s sends to each rank, then to each
  // forwarder.
  std::vector<int64_t> counts;
  size_t width = 0;
  uint64_t step = 0;
  // What this rank receives to forward: `count` records of rank `source` at record `first` of
  // the forward area.
  struct Forwarded {
    size_t source, first, count;
  };
  std::vector<Forwarded> forwarded;
  char* forward_area = nullptr;
  // This rank's own records in the receive area, unpacked by early() (an empty range when not).
  std::pair<size_t, size_t> own_records{0, 0};

  // Tokens rank s sends to rank q.
  size_t to_rank(size_t s, size_t q) const { return static_cast<size_t>(counts[s * width + q]); }
  // Where rank q reads the records of rank s: after those of the ranks below s.
  size_t read_at(size_t s, size_t q) const {
    size_t at = 0;
    for (size_t j = 0; j < s; ++j) at += to_rank(j, q);
    return at;
  }
};

struct Buffer::CombineMove : Move {
  std::shared_ptr<const Handle> handle;
  const void* x = nullptr;
  bool bf16 = false;
  bool with_weights = false;
  const float* topk_weights = nullptr;
  void* combined_x = nullptr;
  float* combined_weights = nullptr;
  uint64_t step = 0;
};

void Buffer::drain() {
  if (!last_queued_) return;
  (void)wait_op(last_queued_);  // its failure is reported on its stream
  last_queued_.reset();
}

Status Buffer::make_own_stream() {
  if (own_stream_ != nullptr) return Status();
  const ncclResult_t r = chorusStreamCreate(&own_stream_);
  return r == ncclSuccess ? Status() : from_nccl(r, "chorusStreamCreate");
}

Status Buffer::run(const char* call, Stream* stream, const std::shared_ptr<Move>& move,
                   std::function<Status(Part)> stage, std::function<void()> early,
                   Finish finish) {
  CHORUS_RETURN_IF_ERROR(stage(Part::kNone));  // the messages
  const bool remote = any_travels(move->sends, move->recvs, rank_);
  if (stream == nullptr && !remote) {
    CHORUS_RETURN_IF_ERROR(stage(Part::kAll));
    CHORUS_RETURN_IF_ERROR(copy_to_self(rank_, move->sends, move->recvs));
    if (early) early();  // while same-host peers still write
    return finish(Arrivals());
  }
  CHORUS_RETURN_IF_ERROR(make_own_stream());
  // finish() and then the messages' end, waited for whatever happened: they read and write
  // the staging area (and the caller's x).
  const auto finish_then_wait = [finish](const Arrivals& arrivals) {
    Status done = finish(arrivals);
    Status moved = arrivals.wait_done();
    return done.ok() ? moved : done;
  };
  if (stream == nullptr) {
    // Blocking: the messages to other ranks go first, so the network carries them while this
    // thread writes into the same-host buffers and then uses what arrived as it arrives.
    CHORUS_RETURN_IF_ERROR(stage(Part::kRemote));
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<const Arrivals> arrivals,
                            post_watched(comm_, rank_, move->sends, move->recvs, own_stream_));
    Status local = stage(Part::kLocal);
    if (local.ok()) local = copy_to_self(rank_, move->sends, move->recvs);
    if (local.ok() && early) early();
    if (!local.ok()) {
      (void)arrivals->wait_done();
      return local;
    }
    return finish_then_wait(*arrivals);
  }
  // Queued: the records are written on the worker in stream order; the messages, posted now so
  // that the communicator carries them in the order of the calls, wait on the buffer's stream
  // for that; the worker's next job, finish(), runs while they travel, and the caller's stream
  // goes on once the messages are done too.
  if (!worker_) worker_ = std::make_unique<Worker>();
  const std::shared_ptr<Op> written =
      worker_->queue(*stream, fmt::format("{}: write the tokens", call), [this, move, stage] {
        CHORUS_RETURN_IF_ERROR(stage(Part::kAll));
        return copy_to_self(rank_, move->sends, move->recvs);
      });
  last_queued_ = written;
  std::shared_ptr<const Arrivals> arrivals = std::make_shared<const Arrivals>();
  if (remote) {
    stream_wait_op(*Stream::from_handle(own_stream_), written);
    CHORUS_ASSIGN_OR_RETURN(arrivals,
                            post_watched(comm_, rank_, move->sends, move->recvs, own_stream_));
  }
  last_queued_ = worker_->queue(*stream, fmt::format("{}: receive", call),
                                [arrivals, finish_then_wait] { return finish_then_wait(*arrivals); });
  return Status();
}

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
