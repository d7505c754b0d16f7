// SPDX-License-Identifier: Apache-2.0
// File: src/ep/buffer.h
// An EP buffer (include/chorus/ep.h): staging memory bound to a communicator, and the normal
// (DeepEP "normal mode") dispatch and combine that run through it.
//
// Dispatch: route (routing.h) -> every rank's counts to every rank (ncclAllGather: each rank
// knows where its tokens go in each receiver's staging area) -> the ranks agree on the verdict
// (ncclAllGather: every rank's refusal and the arguments that must match) -> every rank's
// tokens per expert (ncclAllGather: the receive counts per local expert) -> each token written
// once per destination rank as a record [x | scales | topk index | topk weight] straight into
// the receive area of a same-host receiver, or into the send area and sent (transfer.h); a host
// of several ranks gets each token once, at its forwarder, which writes it into the receive
// areas of the ranks there that hold its experts (DeepEP's internode forwarding) -> the
// receive area, contiguous per source rank, unpacked into the caller's outputs. Combine writes
// each source rank's rows from the caller's x into that rank's staging area (or sends them) and
// reduces what arrived there.
// The staging area is reused by every call: one call at a time per buffer.
// Asynchronous calls (a host stream given): the routing, the count exchange and the agreement
// run in the calling thread; the rest is queued on the stream, the token writes and the
// unpacking or reduction on the buffer's worker (async.h), the messages to other hosts as one
// group between them. The next call on the buffer starts with drain(): it waits for that work.
#pragma once

#include <chorus/ep.h>
#include <chorus/stream.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "core/stream.h"
#include "ep/async.h"
#include "ep/routing.h"
#include "ep/transfer.h"

namespace chorus::ep {

// What combine needs of a dispatch.
struct Handle {
  uint64_t buffer_id = 0;
  size_t num_tokens = 0;
  size_t num_recv_tokens = 0;
  size_t hidden = 0;
  int topk = 0;
  // Tokens sent to rank r, ascending: send_tokens[send_offset[r] .. send_offset[r + 1]).
  std::vector<size_t> send_offset;
  std::vector<size_t> send_tokens;
  // Rows received from rank s: recv_offset[s] .. recv_offset[s + 1].
  std::vector<size_t> recv_offset;
  // Of the tokens rank s sent: how many went to ranks below this one (where this rank's rows
  // start in s's combine area), and how many in all.
  std::vector<size_t> peer_rows_before;
  std::vector<size_t> peer_rows_total;
};

class Buffer {
 public:
  static Result<size_t> size_hint(int nranks, size_t max_tokens, size_t hidden, int topk);
  static Result<std::unique_ptr<Buffer>> create(ncclComm_t comm, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint64_t id() const { return id_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  // `refused`: the entry point's verdict on the arguments it checked; not OK, this rank takes
  // part in the agreement only to refuse the call on every rank. `stream`: null, the call
  // returns when done; else its data movement is queued on it (see the file comment).
  Result<std::shared_ptr<Handle>> dispatch(const chorusEpDispatchArgs_t& args, int datatype,
                                           chorusEpDispatchOutput_t& out, Status refused,
                                           Stream* stream);
  // `weights`: topk weights travel too (either array may be NULL where it has no rows).
  Status combine(std::shared_ptr<const Handle> handle, const void* x, int datatype, bool weights,
                 const float* topk_weights, void* combined_x, float* combined_weights,
                 Status refused, Stream* stream);
  // Waits until the work the buffer's last asynchronous call queued is done. Its failure is
  // that call's stream's, not returned here.
  void drain();

  // Every rank's verdict, and `facts` (values that must be equal on every rank, named by
  // `names`; kAnyValue on a rank: no constraint there), gathered; the call's Status here.
  // `values` (not null): every rank's `extra` (as many on every rank, no constraint on them),
  // gathered in the same collective, rank after rank.
  static constexpr int64_t kAnyValue = INT64_MIN;
  Status agree(const char* call, Status mine, const std::vector<int64_t>& facts,
               const std::vector<const char*>& names, const std::vector<int64_t>& extra = {},
               std::vector<int64_t>* values = nullptr);

  // Low-latency mode (low_latency.h) uses the staging area as two slots of bytes() / 2 (64-byte
  // aligned), one per call in flight. A slot is taken until its call completes.
  static constexpr int kSlots = 2;
  ncclComm_t comm() const { return comm_; }
  size_t bytes() const { return areas_->bytes(); }
  size_t slot_bytes() const { return bytes() / kSlots / 64 * 64; }
  char* slot(int i) { return areas_->local() + static_cast<size_t>(i) * slot_bytes(); }
  // Slot i of the staging area of `peer` (areas().writes_into(peer)), as `peer` lays it out.
  char* peer_slot(int peer, int i) {
    return areas_->area(peer) + static_cast<size_t>(i) * (areas_->area_bytes(peer) / kSlots / 64 * 64);
  }
  // The staging areas of this rank and of the same-host peers it maps (transfer.h).
  PeerAreas& areas() { return *areas_; }
  // A free slot, now taken, or -1.
  int take_slot();
  void free_slot(int i) { slot_taken_[static_cast<size_t>(i)] = false; }
  bool any_slot_taken() const { return slot_taken_[0] || slot_taken_[1]; }

 private:
  // What one call moves: its messages to other ranks (fixed by the counts, so known before a
  // byte is written).
  struct Move {
    std::vector<SendMsg> sends;
    std::vector<RecvMsg> recvs;
  };
  struct DispatchMove;
  struct CombineMove;
  // What a stage writes: nothing (it lists the messages), the records of the send area, those
  // written straight into same-host buffers, or both.
  enum class Part { kNone, kRemote, kLocal, kAll };

  Buffer(ncclComm_t comm, int rank, int nranks, std::unique_ptr<PeerAreas> areas);
  // The data movement of a call: stage(part) lists the messages in `move` and writes `part`,
  // the messages move, finish() waits for what it needs to have arrived (each message of
  // `arrivals` as it comes in) and writes the outputs. Now (stream null: the messages to other
  // ranks are posted first, then the same-host records written) or queued on the stream. The
  // messages to other ranks go on the buffer's own stream either way, so that finish() runs
  // while they travel.
  // early (may be null): blocking, what can be done before the messages arrive and the
  // same-host peers' writes are in.
  using Finish = std::function<Status(const Arrivals& arrivals)>;
  Status run(const char* call, Stream* stream, const std::shared_ptr<Move>& move,
             std::function<Status(Part)> stage, std::function<void()> early, Finish finish);
  // The buffer's own host stream, made on first use.
  Status make_own_stream();
  // Dispatch: every token to its ranks (or its host's forwarder); then the forwarding, the
  // arrival and the unpacking into the caller's outputs.
  Status stage_dispatch(DispatchMove& m, Part part);
  Status finish_dispatch(DispatchMove& m, const Arrivals& arrivals);
  // Combine: each received token's row back to its source rank; then the sums per token.
  Status stage_combine(CombineMove& m, Part part);
  Status finish_combine(const CombineMove& m, const Arrivals& arrivals);
  // Records [begin, end) of the receive area into the caller's outputs.
  void unpack(const DispatchMove& m, size_t begin, size_t end) const;

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  uint64_t id_;
  std::unique_ptr<PeerAreas> areas_;  // the staging area, shared with same-host peers
  bool slot_taken_[kSlots] = {false, false};
  std::shared_ptr<Op> last_queued_;  // the last op an asynchronous call queued
  // The messages to other ranks (run()).
  chorusStream_t own_stream_ = nullptr;
  std::unique_ptr<Worker> worker_;   // started by the first asynchronous call; joined first
};

}  // namespace chorus::ep
