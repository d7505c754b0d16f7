// SPDX-License-Identifier: Apache-2.0
// File: src/algo/run.cc
// From a queued operation to an algorithm: resolve the reduction (Avg = Sum then divide by n;
// PreMulSum = scale the local input, then Sum), pick the algorithm, run it.
#include <cstring>

#include "algo/algo.h"
#include "core/comm.h"

namespace chorus::algo {

namespace {

kernels::ReduceOp kernel_op(RedOpKind kind) {
  switch (kind) {
    case RedOpKind::kProd: return kernels::ReduceOp::kProd;
    case RedOpKind::kMax: return kernels::ReduceOp::kMax;
    case RedOpKind::kMin: return kernels::ReduceOp::kMin;
    default: return kernels::ReduceOp::kSum;  // Sum, Avg, PreMulSum
  }
}

bool is_reduction(CollKind kind) {
  return kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
         kind == CollKind::kReduceScatter;
}

// Elements of the send buffer a collective reads on this rank.
size_t send_elements(const CollCall& c, int nranks) {
  return c.kind == CollKind::kReduceScatter ? c.count * nranks : c.count;
}

Task run_collective(OpContext& ctx, CollCall call) {
  Args a;
  a.in = static_cast<const char*>(call.sendbuf);
  a.out = static_cast<char*>(call.recvbuf);
  a.count = call.count;
  a.dtype = call.dtype;
  a.elem_size = datatype_size(call.dtype);
  a.root = call.root;
  if (is_reduction(call.kind)) {
    a.reduce = kernels::reduce_fn(call.dtype, kernel_op(call.op.kind));
    if (call.op.kind == RedOpKind::kPreMulSum && call.count > 0) {
      // Scale this rank's contribution once, aside, so the algorithm can read it anywhere.
      size_t n = send_elements(call, ctx.nranks());
      void* scaled = ctx.scratch(3, n * a.elem_size);
      const void* scalar = call.op.scalar_ptr ? call.op.scalar_ptr : call.op.scalar;
      kernels::scale_fn(call.dtype)(scaled, a.in, n, scalar);
      a.in = static_cast<const char*>(scaled);
    }
  }
  Status status;
  switch (call.kind) {
    case CollKind::kAllReduce: status = co_await all_reduce_ring(ctx, a); break;
    case CollKind::kReduceScatter: status = co_await reduce_scatter_ring(ctx, a); break;
    case CollKind::kAllGather: status = co_await all_gather_ring(ctx, a); break;
    case CollKind::kBroadcast: status = co_await broadcast_chain(ctx, a); break;
    case CollKind::kReduce: status = co_await reduce_chain(ctx, a); break;
    case CollKind::kAlltoAll: status = co_await alltoall_pairwise(ctx, a); break;
    case CollKind::kGather: status = co_await gather_direct(ctx, a); break;
    case CollKind::kScatter: status = co_await scatter_direct(ctx, a); break;
    default: status = internal_error("no algorithm for {}", coll_name(call.kind));
  }
  CHORUS_CO_RETURN_IF_ERROR(status);
  if (call.op.kind == RedOpKind::kAvg && is_reduction(call.kind) && call.count > 0) {
    bool has_result = call.kind != CollKind::kReduce || ctx.rank() == call.root;
    if (has_result) kernels::divide_fn(call.dtype)(a.out, call.count, ctx.nranks());
  }
  co_return Status();
}

}  // namespace

Task run_op(Comm& comm, Op& op) {
  if (op.is_internal()) {
    OpContext ctx(comm, op.calls().front().tag);
    co_return co_await op.body()(ctx);
  }
  if (op.p2p_batch()) {
    OpContext ctx(comm, op.calls().front().tag);
    co_return co_await send_recv_batch(ctx, op.calls());
  }
  const CollCall& call = op.calls().front();
  OpContext ctx(comm, call.tag);
  co_return co_await run_collective(ctx, call);
}

}  // namespace chorus::algo
