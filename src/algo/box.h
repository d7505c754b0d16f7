// SPDX-License-Identifier: Apache-2.0
// File: src/algo/box.h
// The small-message algorithms' one implementation (box.cc): a collective through the
// small-message boxes as a plain resumable function. A fiber runs it (box_all_reduce and the
// others in algo.h, awaiting each wait), and so does a blocking call on an idle communicator
// from its own frame (Comm::run_express, src/core/express.cc), without an operation, a queue
// or a coroutine; both put the same messages in the same order.
#pragma once

#include "algo/algo.h"
#include "transports/small_box.h"

namespace chorus::algo {

class BoxCollective {
 public:
  // `a` as the fiber algorithms take it (a.reduce set for the reductions); `kind` one of the
  // eight collectives the boxes carry.
  BoxCollective(OpContext& ctx, CollKind kind, const Args& a);
  BoxCollective(const BoxCollective&) = delete;
  BoxCollective& operator=(const BoxCollective&) = delete;

  // Moves as far as it can without waiting: true once finished (status() says how); false
  // when it must wait, and then *wait is what to wait on before stepping again.
  bool step(BoxWait* wait);
  const Status& status() const { return status_; }
  // While waiting: the communicator rank waited for, whether to take our message (a full box)
  // or to send its own, and the message's size.
  int waiting_peer() const { return waiting_peer_; }
  bool waiting_to_send() const { return phase_ == Phase::kSend; }
  size_t message_bytes() const { return bytes_; }

 private:
  enum class Phase { kSend, kReceive, kDone };
  enum class Receive { kNone, kFold, kBlocks, kInto };
  SmallBox* box_to(int peer) const;
  int send_target(int k) const;
  bool finish(Status status);

  OpContext& ctx_;
  const Args a_;
  const int n_, r_;
  size_t bytes_ = 0;  // of each message
  Phase phase_ = Phase::kSend;
  int k_ = 0;  // the next send, then the next receive
  int sends_ = 0;
  bool to_root_ = false;      // the sends go to the root (else to every peer, r + 1 first)
  bool send_blocks_ = false;  // peer q gets block q of a.in (else all of a.in)
  // After the sends: copy_bytes_ from copy_src_ to copy_dst_ (this rank's own block).
  const char* copy_src_ = nullptr;
  char* copy_dst_ = nullptr;
  size_t copy_bytes_ = 0;
  Receive receive_ = Receive::kNone;
  const char* mine_ = nullptr;  // kFold: this rank's term
  Status status_;
  int waiting_peer_ = -1;
};

}  // namespace chorus::algo
