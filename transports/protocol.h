// SPDX-License-Identifier: Apache-2.0
// File: transports/protocol.h
// What every transport's message protocol does the same way, written once: the queue of posted
// requests, the check of an incoming message against the receive posted for it, a reducing
// receive's element check, how a farewell's code is reported, and how a request is described
// in errors. A transport keeps only its mechanism (how bytes, headers and farewells travel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transports/transport.h"

namespace chorus {

// A FIFO of request pointers that grows by doubling and never shrinks: after warm-up, posting
// does not allocate.
template <typename T>
class RequestQueue {
 public:
  RequestQueue() : slots_(16) {}
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  T* at(size_t i) const { return slots_[(first_ + i) & (slots_.size() - 1)]; }
  T* front() const { return at(0); }
  void push(T* req) {
    if (count_ == slots_.size()) grow();
    slots_[(first_ + count_) & (slots_.size() - 1)] = req;
    ++count_;
  }
  T* pop() {
    T* req = front();
    first_ = (first_ + 1) & (slots_.size() - 1);
    --count_;
    return req;
  }
  // Fails every queued request, oldest first, and empties the queue.
  void fail_all() {
    while (!empty()) pop()->fail();
  }

 private:
  void grow() {
    std::vector<T*> bigger(slots_.size() * 2);
    for (size_t i = 0; i < count_; ++i) bigger[i] = at(i);
    slots_.swap(bigger);
    first_ = 0;
  }
  std::vector<T*> slots_;  // size is a power of two
  size_t first_ = 0;
  size_t count_ = 0;
};

// The incoming message (`tag`, `bytes`) that `peer` sent against `req`, the receive this rank
// (`my_rank`) posted for it: OK when they match, else kInvalidUsage naming both calls, e.g.
// "rank 1 sent AllReduce #3 (count 8, float, sum) (32 bytes) but rank 0 expects Broadcast #3
// (count 8, float, root 0) (32 bytes) from it". A receive whose size comes from the sender
// (RecvRequest::size_from_sender) matches any count and any size up to its capacity, and
// adopts them: req->bytes and req->tag.count become the sender's. Call it once per message,
// before moving any of its payload.
Status accept_incoming(RecvRequest* req, const MsgTag& tag, uint64_t bytes, int peer,
                       int my_rank);

// A reducing receive must cover whole elements (and know its size): OK, or kInvalidUsage.
Status check_reducing_receive(const RecvRequest& req, int peer);

// The code a rank reports for a peer's farewell that carried `wire`: the peer's own verdict on
// the caller's arguments (kInvalidUsage, kInvalidArgument) stays, so a mismatch is
// ncclInvalidUsage on both sides; anything else is kRemoteError.
Code farewell_code(uint32_t wire);

// "AllReduce #3 (count 8, float, sum) (12 of 32 bytes)", or "nothing" for null.
std::string describe_request(const Request* req);

}  // namespace chorus
