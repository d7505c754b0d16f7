// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_tree.cc
// Tree AllReduce: a binomial-tree reduce to rank 0 followed by a binomial-tree broadcast.
// 2 ceil(log2 n) message latencies, but only the root reduces everything: for small buffers.
#include "algo/algo.h"

namespace chorus::algo {

Task all_reduce_tree(OpContext& ctx, Args a) {
  Args reduce = a;
  reduce.root = 0;  // non-roots reduce into scratch; every recvbuf gets the broadcast
  CHORUS_CO_RETURN_IF_ERROR(co_await reduce_tree(ctx, reduce));
  Args bcast = a;
  bcast.root = 0;
  bcast.in = a.out;  // the root broadcasts the reduced buffer in place
  co_return co_await broadcast_tree(ctx, bcast);
}

}  // namespace chorus::algo
