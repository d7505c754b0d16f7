// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_rhd.cc
// Rabenseifner's AllReduce: a reduce-scatter by recursive halving (each step exchanges half of
// the range still owned with the partner one bit away), then an all-gather by recursive
// doubling in the reverse order. 2 log2(n) messages and the optimal 2(n-1)/n of the data per
// rank. Ranks beyond the power of two are folded in (PowerOfTwoFold).
#include <vector>

#include "algo/algo.h"

namespace chorus::algo {

namespace {
struct Range {
  size_t lo, hi;  // elements
};
}  // namespace

Task all_reduce_rhd(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t es = a.elem_size, bytes = a.count * es;
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
    ctx.recv_reduce(rreq, r - 1, a.channel, a.out, a.out, bytes, a.reduce, es);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
  }
  const int v = fold.vrank(r);
  // Halving: after the step with `mask`, this rank owns `range` reduced over 2*mask ranks. The
  // half given away is never written again, so the partner may read it in place.
  std::vector<Range> steps;
  Range range{0, a.count};
  for (int mask = fold.p2 / 2; mask >= 1; mask /= 2) {
    int partner = fold.real(v ^ mask);
    size_t mid = range.lo + (range.hi - range.lo) / 2;
    bool keep_low = (v & mask) == 0;
    Range keep = keep_low ? Range{range.lo, mid} : Range{mid, range.hi};
    Range give = keep_low ? Range{mid, range.hi} : Range{range.lo, mid};
    SendRequest sreq;
    RecvRequest rreq;
    if (give.hi > give.lo) ctx.send(sreq, partner, a.channel, a.out + give.lo * es, (give.hi - give.lo) * es);
    if (keep.hi > keep.lo) {
      ctx.recv_reduce(rreq, partner, a.channel, a.out + keep.lo * es, a.out + keep.lo * es,
                      (keep.hi - keep.lo) * es, a.reduce, es);
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    }
    if (give.hi > give.lo) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    steps.push_back(range);
    range = keep;
  }
  // Doubling, in reverse: send what we own, receive the partner's part of the previous range.
  int mask = 1;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it, mask *= 2) {
    int partner = fold.real(v ^ mask);
    Range whole = *it;
    Range theirs = range.lo == whole.lo ? Range{range.hi, whole.hi} : Range{whole.lo, range.lo};
    SendRequest sreq;
    RecvRequest rreq;
    if (range.hi > range.lo) ctx.send(sreq, partner, a.channel, a.out + range.lo * es, (range.hi - range.lo) * es);
    if (theirs.hi > theirs.lo) {
      ctx.recv(rreq, partner, a.channel, a.out + theirs.lo * es, (theirs.hi - theirs.lo) * es);
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    }
    if (range.hi > range.lo) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    range = whole;
  }
  if (fold.absorbs(r)) {
    SendRequest sreq;
    ctx.send(sreq, r - 1, a.channel, a.out, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
