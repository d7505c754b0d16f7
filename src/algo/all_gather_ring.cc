// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_gather_ring.cc
// Ring AllGather: each rank places its block, then n-1 steps forward the block received last
// (around RingView's ring: each host's ranks are adjacent).

#include "algo/algo.h"

namespace chorus::algo {

Task all_gather_ring(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block (count = sendcount)
  if (bytes == 0) co_return Status();
  copy_result_if_needed(a.out + r * bytes, a.in, bytes);
  const RingView ring(ctx);
  const int next = ring.next(), prev = ring.prev();
  for (int s = 0; s < n - 1; ++s) {
    int sb = ring.at(-s), rb = ring.at(-s - 1);
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, next, a.channel, a.out + sb * bytes, bytes);
    ctx.recv(rreq, prev, a.channel, a.out + rb * bytes, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
