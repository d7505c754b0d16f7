// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_oneshot.cc
// One-shot AllReduce: every rank sends its whole input to every other rank and folds what it
// receives into its output. One message latency, (n-1) x the data per rank: for small
// messages among a few ranks of one host.
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task all_reduce_oneshot(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  const char* in = a.in;
  if (in == a.out && n > 1 && bytes > 0) {
    // Peers read our input while we fold theirs into the same buffer: send a copy.
    char* copy = static_cast<char*>(ctx.scratch(4, bytes));
    copy_if_needed(copy, a.in, bytes);
    in = copy;
  }
  copy_if_needed(a.out, a.in, bytes);
  if (n == 1 || bytes == 0) co_return Status();
  RequestArray<SendRequest> sends(n);
  RequestArray<RecvRequest> recvs(n);
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n), from = mod(r - k, n);
    ctx.send(sends[k], to, a.channel, in, bytes);
    ctx.recv_reduce(recvs[k], from, a.channel, a.out, a.out, bytes, a.reduce, a.elem_size);
  }
  for (int k = 1; k < n; ++k) {
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  }
  co_return Status();
}

}  // namespace chorus::algo
