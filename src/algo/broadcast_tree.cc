// SPDX-License-Identifier: Apache-2.0
// File: src/algo/broadcast_tree.cc
// Binomial-tree Broadcast: ceil(log2 n) rounds; in round k every rank that has the data sends
// it to the rank 2^k further (relative to the root). The latency algorithm for small buffers.
#include "algo/algo.h"

namespace chorus::algo {

Task broadcast_tree(OpContext& ctx, Args a) {
  if (std::vector<int> order = host_tree_order(ctx, a.root); !order.empty()) {
    // Across hosts: in an order that keeps each host's ranks together from the root on.
    OpContext hosts_together(ctx, std::move(order));
    a.root = 0;
    co_return co_await broadcast_tree(hosts_together, a);
  }
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  const int v = mod(r - a.root, n);
  if (v == 0) copy_result_if_needed(a.out, a.in, bytes);
  if (n == 1) co_return Status();
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      RecvRequest rreq;
      ctx.recv(rreq, mod(r - mask, n), a.channel, a.out, bytes);
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
      break;
    }
    mask <<= 1;
  }
  // Children: v + mask/2, v + mask/4, ... (those that exist).
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask >= n) continue;
    SendRequest sreq;
    ctx.send(sreq, mod(r + mask, n), a.channel, a.out, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  co_return Status();
}

}  // namespace chorus::algo
