// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_ring.cc
// Ring AllReduce: a reduce-scatter ring leaves the rank at ring position p with the reduced
// block p, then an all-gather ring circulates the reduced blocks (blocks are numbered by ring
// position: the ring keeps each host's ranks together, RingView). Each rank sends and receives 2(n-1)/n of the
// data; the receive side reduces straight from the transport (no staging copy).
#include <cstring>

#include "algo/algo.h"

namespace chorus::algo {

Task all_reduce_ring(OpContext& ctx, Args a) {
  const int n = ctx.nranks();
  const RingView ring(ctx);
  const int r = ring.pos();
  const size_t es = a.elem_size;
  if (n == 1) {
    if (a.out != a.in && a.count > 0) std::memcpy(a.out, a.in, a.count * es);
    co_return Status();
  }
  const int next = ring.next(), prev = ring.prev();
  auto off = [&](int b) { return block_offset(a.count, n, b) * es; };
  auto len = [&](int b) { return block_count(a.count, n, b) * es; };

  // Reduce-scatter: at step s, send block r-s-1 (our input at s = 0, afterwards the partial
  // received at s-1) and fold block r-s-2 from prev into out. After n-1 steps out's block r
  // holds the full reduction.
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
    SendRequest sreq;
    RecvRequest rreq;
    const char* src = (s == 0 ? a.in : a.out) + off(sb);
    if (len(sb) > 0) ctx.send(sreq, next, a.channel, src, len(sb));
    if (len(rb) > 0) {
      ctx.recv_reduce(rreq, prev, a.channel, a.out + off(rb), a.in + off(rb), len(rb), a.reduce, es);
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    }
    if (len(sb) > 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  // All-gather: at step s, send block r-s (final), receive block r-s-1.
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    SendRequest sreq;
    RecvRequest rreq;
    if (len(sb) > 0) ctx.send(sreq, next, a.channel, a.out + off(sb), len(sb));
    if (len(rb) > 0) {
      ctx.recv(rreq, prev, a.channel, a.out + off(rb), len(rb));
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    }
    if (len(sb) > 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
