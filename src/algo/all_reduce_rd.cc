// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_rd.cc
// Recursive-doubling AllReduce: log2(n) steps, each exchanging the whole buffer with the rank
// whose (virtual) index differs in one bit. Fewest messages: the latency algorithm. A rank
// that does not fit the power of two hands its data to a neighbour first and gets the result
// back at the end (PowerOfTwoFold).
//
// Both partners of a step compute (lower partner's partial) op (higher partner's partial), in
// that order, so that both hold the same bits afterwards: IEEE sum and product commute, but
// min and max keep their first operand of +0 and -0, and a sum of two NaNs the first's payload.
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
    // Only this rank computes this step's result (the partner sits out): any order will do.
    RecvRequest rreq;
    ctx.recv_reduce(rreq, r - 1, a.channel, a.out, a.out, bytes, a.reduce, a.elem_size);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
  }
  // The partner's partial lands aside; ours is sent from out, which is not written until the
  // send has completed (the partner may read it in place until then).
  char* theirs = static_cast<char*>(ctx.scratch(4, bytes));
  const int v = fold.vrank(r);
  for (int mask = 1; mask < fold.p2; mask <<= 1) {
    int partner = fold.real(v ^ mask);
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, partner, a.channel, a.out, bytes);
    ctx.recv(rreq, partner, a.channel, theirs, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    const bool lower = (v & mask) == 0;
    a.reduce(a.out, lower ? a.out : theirs, lower ? theirs : a.out, a.count);
  }
  if (fold.absorbs(r)) {
    SendRequest sreq;
    ctx.send(sreq, r - 1, a.channel, a.out, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
