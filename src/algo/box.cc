// SPDX-License-Identifier: Apache-2.0
// File: src/algo/box.cc
// The small-message algorithms ("box"): every collective in one round through the
// small-message boxes of shared memory (transports/small_box.h), for the latency-bound calls of
// ranks of one host. Each rank writes what each peer needs straight into that peer's box and
// takes what it needs from its own boxes; a message is one slot write and, up to
// SmallBox::kInlineBytes, at most one cache line moved. No chunk layer, no request queue, no
// copy into a FIFO and out again.
//
// The tuner picks them (Shape::box_bytes) when every peer of a one-host communicator has a box
// and every message of the call fits one (CHORUS_BOX_BYTES). Between a pair, each operation
// sends at most one message each way, in issue order on both sides, so the box's ordinals match
// the operations, and a rank can run ahead of a peer by at most SmallBox::kSlots operations
// (SmallBox::kPayloadSlots with messages longer than SmallBox::kInlineBytes).
//
// Each collective is its sends (to every peer from r + 1 on, or to the root), then a copy of
// this rank's own block, then its receives: a fold of every rank's term in rank order,
// (((x0 op x1) op x2) ... op x(n-1)), as the one-shot AllReduce does, so that every rank ends
// with the same bits; or a block from every peer (from r - 1 down); or one message from the
// root. BoxCollective (box.h) runs them as a resumable plain function, for a fiber or for a
// blocking call's own frame.
#include "algo/box.h"

#include <cstring>

#include "core/comm.h"

namespace chorus::algo {
namespace {

bool overlaps(const void* a, const void* b, size_t bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

}  // namespace

BoxCollective::BoxCollective(OpContext& ctx, CollKind kind, const Args& a)
    : ctx_(ctx), a_(a), n_(ctx.nranks()), r_(ctx.rank()), bytes_(a.count * a.elem_size) {
  if (bytes_ == 0) {
    phase_ = Phase::kDone;
    return;
  }
  const bool root = r_ == a.root;
  auto own_block = [&](char* dst, const char* src) {
    copy_dst_ = dst;
    copy_src_ = src;
    copy_bytes_ = bytes_;
  };
  switch (kind) {
    case CollKind::kAllReduce:
      sends_ = n_ - 1;
      receive_ = Receive::kFold;
      mine_ = a.in;
      break;
    case CollKind::kReduceScatter:
      sends_ = n_ - 1;
      send_blocks_ = true;
      receive_ = Receive::kFold;
      mine_ = a.in + r_ * bytes_;
      break;
    case CollKind::kReduce:
      if (!root) {
        sends_ = 1;
        to_root_ = true;
      } else {
        receive_ = Receive::kFold;
        mine_ = a.in;
      }
      break;
    case CollKind::kAllGather:
      sends_ = n_ - 1;
      own_block(a.out + r_ * bytes_, a.in);
      receive_ = Receive::kBlocks;
      break;
    case CollKind::kAlltoAll:
      // Every block is in a box before any lands in out: in place needs no copy.
      sends_ = n_ - 1;
      send_blocks_ = true;
      own_block(a.out + r_ * bytes_, a.in + r_ * bytes_);
      receive_ = Receive::kBlocks;
      break;
    case CollKind::kBroadcast:
      if (root) {
        sends_ = n_ - 1;
        own_block(a.out, a.in);
      } else {
        receive_ = Receive::kInto;
      }
      break;
    case CollKind::kGather:
      if (!root) {
        sends_ = 1;
        to_root_ = true;
      } else {
        own_block(a.out + r_ * bytes_, a.in);
        receive_ = Receive::kBlocks;
      }
      break;
    case CollKind::kScatter:
      if (root) {
        sends_ = n_ - 1;
        send_blocks_ = true;
        own_block(a.out, a.in + r_ * bytes_);
      } else {
        receive_ = Receive::kInto;
      }
      break;
    default:
      finish(internal_error("no small-message algorithm for {}", coll_name(kind)));
      break;
  }
}

SmallBox* BoxCollective::box_to(int peer) const {
  return ctx_.comm().conn(ctx_.comm_rank(peer), 0)->small_box();
}

bool BoxCollective::finish(Status status) {
  status_ = std::move(status);
  phase_ = Phase::kDone;
  return true;
}

bool BoxCollective::step(BoxWait* wait) {
  while (phase_ == Phase::kSend) {
    if (k_ == sends_) {
      copy_if_needed(copy_dst_, copy_src_, copy_bytes_);
      // A fold writes out before it reads our term (rank 0's first): in place, not rank 0, our
      // term goes aside first.
      if (receive_ == Receive::kFold && r_ != 0 && overlaps(mine_, a_.out, bytes_)) {
        char* copy = static_cast<char*>(ctx_.scratch(4, bytes_));
        std::memcpy(copy, mine_, bytes_);
        mine_ = copy;
      }
      phase_ = receive_ == Receive::kNone ? Phase::kDone : Phase::kReceive;
      k_ = 0;
      break;
    }
    const int to = to_root_ ? a_.root : mod(r_ + k_ + 1, n_);
    SmallBox* box = box_to(to);
    if (!box->can_send(wait, bytes_)) {
      waiting_peer_ = ctx_.comm_rank(to);
      return false;
    }
    const char* data = send_blocks_ ? a_.in + to * bytes_ : a_.in;
    if (Status st = box->send(ctx_.tag(), data, bytes_); !st.ok()) return finish(std::move(st));
    ctx_.comm().count_bytes(ctx_.comm_rank(to), true, bytes_, bytes_);
    ++k_;
  }
  while (phase_ == Phase::kReceive) {
    const int count = receive_ == Receive::kFold ? n_ : receive_ == Receive::kBlocks ? n_ - 1 : 1;
    if (k_ == count) return finish(Status());
    const int from = receive_ == Receive::kFold     ? k_
                     : receive_ == Receive::kBlocks ? mod(r_ - k_ - 1, n_)
                                                    : a_.root;
    if (from == r_) {  // our own term of the fold
      if (r_ == 0) {
        copy_if_needed(a_.out, mine_, bytes_);
      } else {
        a_.reduce(a_.out, a_.out, mine_, a_.count);
      }
      ++k_;
      continue;
    }
    SmallBox* box = box_to(from);
    if (!box->can_receive(wait)) {
      waiting_peer_ = ctx_.comm_rank(from);
      return false;
    }
    Result<const void*> got = box->receive(ctx_.tag(), bytes_);
    if (!got.ok()) return finish(got.take_status());
    ctx_.comm().count_bytes(ctx_.comm_rank(from), false, bytes_, bytes_);
    if (receive_ == Receive::kFold && from != 0) {
      a_.reduce(a_.out, a_.out, *got, a_.count);
    } else {
      char* dst = receive_ == Receive::kBlocks ? a_.out + from * bytes_ : a_.out;
      std::memcpy(dst, *got, bytes_);
    }
    box->release();
    ++k_;
  }
  return true;
}

namespace {

// A fiber's run of a box collective: parks on what step() waits for. The request names the
// peer for the liveness checks and the timeout's message.
Task run_box(OpContext& ctx, Args a, CollKind kind) {
  BoxCollective run(ctx, kind, a);
  Request waiting;
  waiting.tag = ctx.tag();
  waiting.bytes = run.message_bytes();
  BoxWait w;
  while (!run.step(&w)) {
    waiting.peer = run.waiting_peer();
    waiting.is_send = run.waiting_to_send();
    co_await WaitUntil{WaitCond{w.word, w.target}, &waiting, false};
  }
  co_return run.status();
}

}  // namespace

Task box_all_reduce(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kAllReduce); }
Task box_reduce_scatter(OpContext& ctx, Args a) {
  return run_box(ctx, a, CollKind::kReduceScatter);
}
Task box_all_gather(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kAllGather); }
Task box_broadcast(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kBroadcast); }
Task box_reduce(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kReduce); }
Task box_alltoall(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kAlltoAll); }
Task box_gather(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kGather); }
Task box_scatter(OpContext& ctx, Args a) { return run_box(ctx, a, CollKind::kScatter); }

}  // namespace chorus::algo
