// SPDX-License-Identifier: Apache-2.0
// File: src/ep/low_latency.h
// Low-latency dispatch and combine (include/chorus/ep.h, DeepEP's low_latency_* calls) through
// an EP buffer's two slots (buffer.h).
//
// Dispatch: check the routing (ranges, no expert twice per token) -> the ranks agree on the
// verdict and on every size that shapes a message, and learn each other's slot -> a slot is
// taken -> each token packed once per rank of its experts (FP8-cast by the block codec,
// kernels/compress) into that rank's fixed-size message [int64 count | records]: straight into
// the receive area of the same slot of a same-host rank this one maps (transfer.h PeerAreas), at
// the place that rank reads it, then marked written; into this rank's own receive area for
// itself; into the slot's send area for the others -> grouped ncclSend/ncclRecv of those
// messages queued on a host stream of the call's own. Completion (at once, or in the hook)
// synchronises the stream, waits until the same-host writers have marked the call's step, and
// fans the records out to the local experts' rows.
// Mapped writes need both ends on the same slot: each rank takes its lowest free slot, so ranks
// whose hooks ran in different orders may hold different ones. The agreement gathers every
// rank's slot; when they differ the call sends every message but its own through the
// communicator. A rank takes a slot only once its last call there has completed (read it all),
// and writers write only after the agreement, so a write never lands in a slot still read.
// Combine: the ranks agree on the handles' shape and gather each other's slot and where each
// source rank's rows go in their receive areas (their sent offsets) -> the rows of each source
// rank gathered from x, in the order the source sent its (token, expert) pairs, straight into
// its receive area (itself; a same-host rank it maps, on the same slot), or into the send area
// (at a fixed offset: room for max_tokens * min(topk, L) rows per rank) for exact-size messages
// queued the same way -> completion waits as dispatch's and adds them up per token, weighted,
// in slot order.
#pragma once

#include <chorus/ep.h>
#include <chorus/stream.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "ep/buffer.h"

namespace chorus::ep {

// What combine needs of a low-latency dispatch.
struct LowLatencyHandle {
  uint64_t buffer_id = 0;
  size_t num_tokens = 0;
  size_t hidden = 0;
  size_t max_tokens = 0;
  int topk = 0;
  int num_experts = 0;
  bool complete = false;          // the dispatch's outputs are written (its hook, if any, has run)
  std::vector<int64_t> topk_idx;  // [num_tokens, topk], as dispatched
  // (token * topk + slot) pairs sent to rank q, in message order:
  // sent_pairs[sent_offset[q] .. sent_offset[q + 1]).
  std::vector<size_t> sent_offset;
  std::vector<size_t> sent_pairs;
  // Rows (local expert * R + row) received from source rank s, in message order:
  // recv_rows[recv_offset[s] .. recv_offset[s + 1]).
  std::vector<size_t> recv_offset;
  std::vector<size_t> recv_rows;
};

// A call whose messages are posted: complete() waits for them and writes the call's outputs.
class LowLatencyCall {
 public:
  // `step` (not 0): same-host ranks write into this rank's slot and mark `step` (PeerAreas);
  // complete() waits for them. `call` names the operation in errors.
  LowLatencyCall(std::shared_ptr<Buffer> buffer, int slot, chorusStream_t stream,
                 std::function<Status()> finish, uint64_t step = 0, const char* call = "")
      : buffer_(std::move(buffer)),
        slot_(slot),
        stream_(stream),
        finish_(std::move(finish)),
        step_(step),
        call_(call) {}
  LowLatencyCall(const LowLatencyCall&) = delete;
  LowLatencyCall& operator=(const LowLatencyCall&) = delete;
  // Frees the slot and the stream (waiting for the stream if complete() was not called).
  ~LowLatencyCall();
  // Once: waits for the transfers (their error names the peer), then writes the outputs.
  Status complete();

 private:
  std::shared_ptr<Buffer> buffer_;
  int slot_;
  chorusStream_t stream_;
  std::function<Status()> finish_;
  uint64_t step_;
  const char* call_;
};

// The size hint (ep.h): two slots, each the larger of a dispatch's and a combine's areas.
Result<size_t> low_latency_size_hint(int nranks, size_t max_tokens, size_t hidden, int num_experts,
                                     int topk);

// `refused`: the entry point's verdict on the arguments it checked (as Buffer::dispatch). On
// success *handle is set, and *call to the posted call (to complete now, or in a hook).
Status low_latency_dispatch(const std::shared_ptr<Buffer>& buffer,
                            const chorusEpLowLatencyDispatchArgs_t& args, int datatype,
                            const chorusEpLowLatencyDispatchOutput_t& out, Status refused,
                            std::shared_ptr<LowLatencyHandle>* handle,
                            std::unique_ptr<LowLatencyCall>* call);

Status low_latency_combine(const std::shared_ptr<Buffer>& buffer,
                           const std::shared_ptr<LowLatencyHandle>& handle, const void* x,
                           int datatype, const float* topk_weights, void* combined_x,
                           Status refused, std::unique_ptr<LowLatencyCall>* call);

}  // namespace chorus::ep
