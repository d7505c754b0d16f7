// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_tree.cc
// Binomial-tree Reduce: the mirror image of the tree broadcast. A rank folds the partials of its
// children (v + 1, v + 2, v + 4, ... below its lowest set bit) into its own, then sends the
// result to its parent; the root folds into recvbuf.
#include "algo/algo.h"

namespace chorus::algo {

Task reduce_tree(OpContext& ctx, Args a) {
  if (std::vector<int> order = host_tree_order(ctx, a.root); !order.empty()) {
    // Across hosts: in an order that keeps each host's ranks together from the root on.
    OpContext hosts_together(ctx, std::move(order));
    a.root = 0;
    co_return co_await reduce_tree(hosts_together, a);
  }
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  const int v = mod(r - a.root, n);
  if (n == 1) {
    copy_if_needed(a.out, a.in, bytes);
    co_return Status();
  }
  // The partial: recvbuf on the root, scratch elsewhere (recvbuf is not ours to use there).
  char* acc = v == 0 ? a.out : static_cast<char*>(ctx.scratch(4, bytes));
  copy_if_needed(acc, a.in, bytes);
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if (v & mask) break;
    if (v + mask >= n) continue;
    RecvRequest rreq;
    ctx.recv_reduce(rreq, mod(r + mask, n), a.channel, acc, acc, bytes, a.reduce, a.elem_size);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
  }
  if (v != 0) {
    SendRequest sreq;
    ctx.send(sreq, mod(r - mask, n), a.channel, acc, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
