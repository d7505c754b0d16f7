// SPDX-License-Identifier: Apache-2.0
// File: src/algo/algo.h
// The collective algorithms: one coroutine per collective x algorithm, each in its own file.
// They receive validated calls whose reduction is already a plain kernels::ReduceOp (run.cc
// turns Avg into Sum + a final division and PreMulSum into a scaling pass + Sum), and post
// transfers through OpContext. Every algorithm must work for any count (0 included), any
// number of ranks (1 included), any root, in place or not.
#pragma once

#include <cstddef>

#include "core/op.h"
#include "core/task.h"
#include "kernels/reduce/reduce.h"

namespace chorus::algo {

// The root task of an operation: dispatches on the collective and algorithm.
Task run_op(Comm& comm, Op& op);

// A call ready for an algorithm: reduction resolved to a kernel.
struct Args {
  const char* in = nullptr;  // sendbuf
  char* out = nullptr;       // recvbuf
  size_t count = 0;          // the count argument of the call
  size_t elem_size = 1;
  DataType dtype = DataType::kFloat32;
  kernels::ReduceFn reduce = nullptr;  // null for data-movement collectives
  int root = -1;
};

Task all_reduce_ring(OpContext& ctx, Args a);
Task reduce_scatter_ring(OpContext& ctx, Args a);
Task all_gather_ring(OpContext& ctx, Args a);
Task broadcast_chain(OpContext& ctx, Args a);
Task reduce_chain(OpContext& ctx, Args a);
Task alltoall_pairwise(OpContext& ctx, Args a);
Task gather_direct(OpContext& ctx, Args a);
Task scatter_direct(OpContext& ctx, Args a);
Task send_recv_batch(OpContext& ctx, const std::vector<CollCall>& calls);

// Splits `count` elements into `parts` near-equal blocks (the first count % parts get one
// more). Block i spans [block_offset(i), block_offset(i) + block_count(i)).
inline size_t block_count(size_t count, int parts, int i) {
  return count / parts + (static_cast<size_t>(i) < count % parts ? 1 : 0);
}
inline size_t block_offset(size_t count, int parts, int i) {
  size_t base = count / parts, extra = count % parts;
  return base * i + (static_cast<size_t>(i) < extra ? i : extra);
}
inline int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace chorus::algo
