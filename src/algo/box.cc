// SPDX-License-Identifier: Apache-2.0
// File: src/algo/box.cc
// The small-message algorithms ("box"): every collective in one round through the
// small-message boxes of shared memory (transports/small_box.h), for the latency-bound calls of
// ranks of one host. Each rank writes what each peer needs straight into that peer's box and
// takes what it needs from its own boxes; a message is one slot write and, up to
// SmallBox::kInlineBytes, one cache line moved. No chunk layer, no request queue, no copy into
// a FIFO and out again.
//
// The tuner picks them (Shape::box_bytes) when every peer of a one-host communicator has a box
// and every message of the call fits one (CHORUS_BOX_BYTES). Between a pair, each operation
// sends at most one message each way, in issue order on both sides, so the box's ordinals match
// the operations, and a rank can run ahead of a peer by at most SmallBox::kSlots operations.
//
// Reductions fold in rank order, (((x0 op x1) op x2) ... op x(n-1)), as the one-shot AllReduce
// does: every rank ends with the same bits.
#include <cstring>

#include "algo/algo.h"
#include "core/comm.h"
#include "transports/small_box.h"

namespace chorus::algo {
namespace {

SmallBox* box_to(OpContext& ctx, int peer) {
  return ctx.comm().conn(ctx.comm_rank(peer), 0)->small_box();
}

// The slow paths: parks until the box can take our next message (has the peer's next one). The
// request names the peer for the liveness checks and the timeout's message.
Task wait_to_send(OpContext& ctx, SmallBox* box, int peer, size_t bytes) {
  Request waiting;
  waiting.peer = ctx.comm_rank(peer);
  waiting.is_send = true;
  waiting.bytes = bytes;
  waiting.tag = ctx.tag();
  BoxWait w;
  while (!box->can_send(&w)) co_await WaitUntil{WaitCond{w.word, w.target}, &waiting, false};
  co_return Status();
}

Task wait_to_receive(OpContext& ctx, SmallBox* box, int peer, size_t bytes) {
  Request waiting;
  waiting.peer = ctx.comm_rank(peer);
  waiting.bytes = bytes;
  waiting.tag = ctx.tag();
  BoxWait w;
  while (!box->can_receive(&w)) co_await WaitUntil{WaitCond{w.word, w.target}, &waiting, false};
  co_return Status();
}

Status put(OpContext& ctx, SmallBox* box, int peer, const void* data, size_t bytes) {
  CHORUS_RETURN_IF_ERROR(box->send(ctx.tag(), data, bytes));
  ctx.comm().count_bytes(ctx.comm_rank(peer), true, bytes, bytes);
  return Status();
}

Result<const void*> take(OpContext& ctx, SmallBox* box, int peer, size_t bytes) {
  Result<const void*> got = box->receive(ctx.tag(), bytes);
  if (got.ok()) ctx.comm().count_bytes(ctx.comm_rank(peer), false, bytes, bytes);
  return got;
}

// `CHORUS_BOX_SEND(peer, data, bytes)`: the next message to `peer`, waiting for a slot.
#define CHORUS_BOX_SEND(peer, data, bytes)                                                \
  do {                                                                                    \
    SmallBox* box_ = box_to(ctx, peer);                                                   \
    BoxWait wait_;                                                                        \
    if (!box_->can_send(&wait_))                                                          \
      CHORUS_CO_RETURN_IF_ERROR(co_await wait_to_send(ctx, box_, peer, bytes));           \
    CHORUS_CO_RETURN_IF_ERROR(put(ctx, box_, peer, data, bytes));                         \
  } while (0)

// `CHORUS_BOX_RECEIVE(box, payload, peer, bytes)`: sets `box` (SmallBox*) and `payload`
// (const void*) to the next message from `peer`, checked; the caller releases it.
#define CHORUS_BOX_RECEIVE(box, payload, peer, bytes)                                     \
  do {                                                                                    \
    box = box_to(ctx, peer);                                                              \
    BoxWait wait_;                                                                        \
    if (!box->can_receive(&wait_))                                                        \
      CHORUS_CO_RETURN_IF_ERROR(co_await wait_to_receive(ctx, box, peer, bytes));         \
    Result<const void*> got_ = take(ctx, box, peer, bytes);                               \
    if (!got_.ok()) co_return got_.take_status();                                         \
    payload = *got_;                                                                      \
  } while (0)

// Copies the next message from `from` (`bytes` long) into `out`.
Task receive_into(OpContext& ctx, int from, char* out, size_t bytes) {
  SmallBox* box;
  const void* data;
  CHORUS_BOX_RECEIVE(box, data, from, bytes);
  std::memcpy(out, data, bytes);
  box->release();
  co_return Status();
}

// Block q of `out` (`bytes` each) becomes peer q's next message, for every peer q.
Task receive_blocks(OpContext& ctx, char* out, size_t bytes) {
  const int n = ctx.nranks(), r = ctx.rank();
  for (int k = 1; k < n; ++k) {
    const int from = mod(r - k, n);
    SmallBox* box;
    const void* block;
    CHORUS_BOX_RECEIVE(box, block, from, bytes);
    std::memcpy(out + from * bytes, block, bytes);
    box->release();
  }
  co_return Status();
}

bool overlaps(const void* a, const void* b, size_t bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

// out = fold of the n terms in rank order, taking every peer's term from its box: `mine` is
// ours, `from_peer` the size of each. Our term is copied aside first when writing `out` would
// overwrite it before it is folded (in place, not rank 0).
Task fold_in_rank_order(OpContext& ctx, const Args& a, const char* mine, char* out,
                        size_t count) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = count * a.elem_size;
  if (r != 0 && overlaps(mine, out, bytes)) {
    char* copy = static_cast<char*>(ctx.scratch(4, bytes));
    std::memcpy(copy, mine, bytes);
    mine = copy;
  }
  for (int q = 0; q < n; ++q) {
    if (q == r) {
      if (q == 0) {
        copy_if_needed(out, mine, bytes);
      } else {
        a.reduce(out, out, mine, count);
      }
      continue;
    }
    SmallBox* box;
    const void* term;
    CHORUS_BOX_RECEIVE(box, term, q, bytes);
    if (q == 0) {
      std::memcpy(out, term, bytes);
    } else {
      a.reduce(out, out, term, count);
    }
    box->release();
  }
  co_return Status();
}

}  // namespace

Task box_all_reduce(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (n == 1 || bytes == 0) {
    copy_if_needed(a.out, a.in, bytes);
    co_return Status();
  }
  for (int k = 1; k < n; ++k) CHORUS_BOX_SEND(mod(r + k, n), a.in, bytes);
  co_return co_await fold_in_rank_order(ctx, a, a.in, a.out, a.count);
}

Task box_reduce_scatter(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block
  if (bytes == 0) co_return Status();
  for (int k = 1; k < n; ++k) {
    const int to = mod(r + k, n);
    CHORUS_BOX_SEND(to, a.in + to * bytes, bytes);
  }
  co_return co_await fold_in_rank_order(ctx, a, a.in + r * bytes, a.out, a.count);
}

Task box_reduce(OpContext& ctx, Args a) {
  const int r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  if (r != a.root) {
    CHORUS_BOX_SEND(a.root, a.in, bytes);
    co_return Status();
  }
  co_return co_await fold_in_rank_order(ctx, a, a.in, a.out, a.count);
}

Task box_all_gather(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block
  if (bytes == 0) co_return Status();
  for (int k = 1; k < n; ++k) CHORUS_BOX_SEND(mod(r + k, n), a.in, bytes);
  copy_if_needed(a.out + r * bytes, a.in, bytes);
  co_return co_await receive_blocks(ctx, a.out, bytes);
}

Task box_alltoall(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block
  if (bytes == 0) co_return Status();
  // Every block is in a box before any lands in out: in place needs no copy.
  for (int k = 1; k < n; ++k) {
    const int to = mod(r + k, n);
    CHORUS_BOX_SEND(to, a.in + to * bytes, bytes);
  }
  copy_if_needed(a.out + r * bytes, a.in + r * bytes, bytes);
  co_return co_await receive_blocks(ctx, a.out, bytes);
}

Task box_broadcast(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  if (r == a.root) {
    for (int k = 1; k < n; ++k) CHORUS_BOX_SEND(mod(r + k, n), a.in, bytes);
    copy_if_needed(a.out, a.in, bytes);
    co_return Status();
  }
  co_return co_await receive_into(ctx, a.root, a.out, bytes);
}

Task box_gather(OpContext& ctx, Args a) {
  const int r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block
  if (bytes == 0) co_return Status();
  if (r != a.root) {
    CHORUS_BOX_SEND(a.root, a.in, bytes);
    co_return Status();
  }
  copy_if_needed(a.out + r * bytes, a.in, bytes);
  co_return co_await receive_blocks(ctx, a.out, bytes);
}

Task box_scatter(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block
  if (bytes == 0) co_return Status();
  if (r == a.root) {
    for (int k = 1; k < n; ++k) {
      const int to = mod(r + k, n);
      CHORUS_BOX_SEND(to, a.in + to * bytes, bytes);
    }
    copy_if_needed(a.out, a.in + r * bytes, bytes);
    co_return Status();
  }
  co_return co_await receive_into(ctx, a.root, a.out, bytes);
}

#undef CHORUS_BOX_SEND
#undef CHORUS_BOX_RECEIVE

}  // namespace chorus::algo
