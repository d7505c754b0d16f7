// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_oneshot.cc
// One-shot AllReduce: every rank sends its whole input to every other rank and folds what it
// receives into its output. One message latency, (n-1) x the data per rank: for small
// messages among a few ranks of one host.
//
// Every rank computes the same expression, (((x0 op x1) op x2) ... op x(n-1)) in rank order,
// so that every rank ends with the same bits (floating-point sums and products are not
// associative; min and max keep the first of +0 and -0). The contributions are received into
// scratch, all at once, and folded in rank order as soon as each is there.
#include <cstring>

#include "algo/algo.h"

namespace chorus::algo {

Task all_reduce_oneshot(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (n == 1 || bytes == 0) {
    copy_if_needed(a.out, a.in, bytes);
    co_return Status();
  }
  const char* in = a.in;
  if (in == a.out) {
    // Peers read our input while we write the result into the same buffer: send a copy.
    char* copy = static_cast<char*>(ctx.scratch(4, bytes));
    std::memcpy(copy, a.in, bytes);
    in = copy;
  }
  // One slot per peer, in rank order, ours skipped.
  char* slots = static_cast<char*>(ctx.scratch(5, bytes * (n - 1)));
  auto slot = [&](int q) { return slots + static_cast<size_t>(q < r ? q : q - 1) * bytes; };
  auto term = [&](int q) -> const char* { return q == r ? in : slot(q); };
  RequestArray<SendRequest> sends(n);  // by distance
  RequestArray<RecvRequest> recvs(n);  // by peer
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n), from = mod(r - k, n);
    ctx.send(sends[k], to, a.channel, in, bytes);
    ctx.recv(recvs[from], from, a.channel, slot(from), bytes);
  }
  // out = x0 op x1, then out = out op xq for q = 2 .. n-1. No term is out: ours is the copy
  // when in place, and the input, which may not overlap the output, otherwise.
  if (r != 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[0]));
  for (int q = 1; q < n; ++q) {
    if (q != r) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[q]));
    a.reduce(a.out, q == 1 ? term(0) : a.out, term(q), a.count);
  }
  for (int k = 1; k < n; ++k) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  co_return Status();
}

}  // namespace chorus::algo
