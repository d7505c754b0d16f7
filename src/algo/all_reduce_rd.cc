// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_rd.cc
// Recursive-doubling AllReduce: log2(n) steps, each exchanging the whole buffer with the rank
// whose (virtual) index differs in one bit. Fewest messages: the latency algorithm. A rank
// that does not fit the power of two hands its data to a neighbour first and gets the result
// back at the end (PowerOfTwoFold).
#include "algo/algo.h"

namespace chorus::algo {

Task all_reduce_rd(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  copy_if_needed(a.out, a.in, bytes);
  if (n == 1 || bytes == 0) co_return Status();
  const PowerOfTwoFold fold(n);
  if (fold.sits_out(r)) {
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, r + 1, a.channel, a.in, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    ctx.recv(rreq, r + 1, a.channel, a.out, bytes);
    co_return co_await ctx.wait(rreq);
  }
  if (fold.absorbs(r)) {
    RecvRequest rreq;
    ctx.recv_reduce(rreq, r - 1, a.channel, a.out, a.out, bytes, a.reduce, a.elem_size);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
  }
  // What we send must not change while the partner may read it: send a snapshot.
  char* snapshot = static_cast<char*>(ctx.scratch(4, bytes));
  const int v = fold.vrank(r);
  for (int mask = 1; mask < fold.p2; mask <<= 1) {
    int partner = fold.real(v ^ mask);
    copy_if_needed(snapshot, a.out, bytes);
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, partner, a.channel, snapshot, bytes);
    ctx.recv_reduce(rreq, partner, a.channel, a.out, a.out, bytes, a.reduce, a.elem_size);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  if (fold.absorbs(r)) {
    SendRequest sreq;
    ctx.send(sreq, r - 1, a.channel, a.out, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
