// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_scatter_rhd.cc
// Recursive-halving ReduceScatter: log2(n) steps; at each, a rank gives the partner the half of
// its block range the partner keeps and folds in the half it keeps, until only its own block is
// left. Needs a power-of-two rank count (other counts run the ring instead).
#include "algo/algo.h"

namespace chorus::algo {

Task reduce_scatter_rhd(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  if ((n & (n - 1)) != 0) co_return co_await reduce_scatter_ring(ctx, a);
  const size_t es = a.elem_size, block = a.count * es;
  if (block == 0) co_return Status();
  if (n == 1) {
    copy_if_needed(a.out, a.in, block);
    co_return Status();
  }
  // Partials live in scratch; the first step reads the input, the last writes recvbuf.
  char* acc = static_cast<char*>(ctx.scratch(0, block * n));
  const char* cur = a.in;
  int lo = 0, hi = n;  // blocks this rank still holds partials for
  for (int mask = n / 2; mask >= 1; mask /= 2) {
    int partner = r ^ mask, mid = lo + (hi - lo) / 2;
    bool keep_low = (r & mask) == 0;
    int keep_lo = keep_low ? lo : mid, keep_hi = keep_low ? mid : hi;
    int give_lo = keep_low ? mid : lo;
    size_t span = static_cast<size_t>(keep_hi - keep_lo) * block;
    char* dst = mask == 1 ? a.out : acc + keep_lo * block;
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, partner, a.channel, cur + give_lo * block, span);
    ctx.recv_reduce(rreq, partner, a.channel, dst, cur + keep_lo * block, span, a.reduce, es);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    cur = acc;
    lo = keep_lo;
    hi = keep_hi;
  }
  co_return Status();
}

}  // namespace chorus::algo
