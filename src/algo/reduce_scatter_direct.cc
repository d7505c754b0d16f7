// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_scatter_direct.cc
// Direct ReduceScatter: every rank sends block j straight to rank j and folds the n-1 blocks it
// receives into its own, in a fixed order (from rank r-1, then r-2, ...: the next block is
// received once the previous is folded), so the same input gives the same bits on every run.
// One message latency, (n-1)/n of the data per rank.
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task reduce_scatter_direct(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t block = a.count * a.elem_size;
  if (block == 0) co_return Status();
  copy_if_needed(a.out, a.in + r * block, block);  // in place, recvbuf is this block already
  if (n == 1) co_return Status();
  RequestArray<SendRequest> sends(n);
  RequestArray<RecvRequest> recvs(n);
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n);
    ctx.send(sends[k], to, a.channel, a.in + to * block, block);
  }
  for (int k = 1; k < n; ++k) {
    ctx.recv_reduce(recvs[k], mod(r - k, n), a.channel, a.out, a.out, block, a.reduce,
                    a.elem_size);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
  }
  for (int k = 1; k < n; ++k) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  co_return Status();
}

}  // namespace chorus::algo
