// SPDX-License-Identifier: Apache-2.0
// File: src/ep/buffer.cc
// An EP buffer (buffer.h): its size, creation, the agreement every call begins with, and the
// running of a call's moves, inline or on a host stream. Dispatch is in dispatch.cc, combine in
// combine.cc, what they move and its layout in moves.h.
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

}  // namespace chorus::ep
