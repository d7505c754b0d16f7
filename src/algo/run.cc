// SPDX-License-Identifier: Apache-2.0
// File: src/algo/run.cc
// From a queued operation to an algorithm: resolve the reduction (Avg = Sum then divide by n;
// PreMulSum = scale the local input, then Sum), pick the algorithm, run it.
#include <cstring>

#include "algo/algo.h"
#include "algo/tuner.h"
#include "common/log.h"
#include "compress/compressed_coll.h"
#include "core/comm.h"
#include "kernels/reduce/reduce.h"

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

}  // namespace

RingView::RingView(const OpContext& ctx)
    : comm_(ctx.comm()),
      order_(ctx.is_group() ? nullptr : &ctx.comm().ring()),
      pos_(ctx.is_group() ? ctx.rank() : ctx.comm().ring_pos(ctx.rank())),
      n_(ctx.nranks()) {}

int RingView::pos_of(int rank) const { return order_ != nullptr ? comm_.ring_pos(rank) : rank; }

std::vector<int> host_tree_order(const OpContext& ctx, int root) {
  std::vector<int> order;
  const Comm& comm = ctx.comm();
  const auto& hosts = comm.hosts();
  if (ctx.is_group() || hosts.size() < 2) return order;
  order.reserve(static_cast<size_t>(ctx.nranks()));
  const size_t home = static_cast<size_t>(comm.host_of(root));
  order.push_back(root);
  for (int r : hosts[home])
    if (r != root) order.push_back(r);
  // Each other host from the rank of the root's local index on (the one a tree's message
  // from another host reaches first: rail-aligned with the root).
  const size_t l = static_cast<size_t>(comm.local_index(root));
  for (size_t k = 1; k < hosts.size(); ++k) {
    const std::vector<int>& h = hosts[(home + k) % hosts.size()];
    const size_t first = l < h.size() ? l : 0;
    for (size_t i = 0; i < h.size(); ++i) order.push_back(h[(first + i) % h.size()]);
  }
  return order;
}

void copy_if_needed(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

void copy_result_if_needed(void* dst, const void* src, size_t bytes) {
  if (dst != src) kernels::copy_to_output(dst, src, bytes);
}

namespace {

using AlgoFn = Task (*)(OpContext&, Args);

AlgoFn box_algorithm(CollKind coll) {
  switch (coll) {
    case CollKind::kAllReduce: return box_all_reduce;
    case CollKind::kReduceScatter: return box_reduce_scatter;
    case CollKind::kAllGather: return box_all_gather;
    case CollKind::kBroadcast: return box_broadcast;
    case CollKind::kReduce: return box_reduce;
    case CollKind::kAlltoAll: return box_alltoall;
    case CollKind::kGather: return box_gather;
    case CollKind::kScatter: return box_scatter;
    default: return nullptr;
  }
}

AlgoFn algorithm(CollKind coll, Algo algo) {
  if (algo == Algo::kBox) return box_algorithm(coll);
  switch (coll) {
    case CollKind::kAllReduce:
      switch (algo) {
        case Algo::kRecursiveDoubling: return all_reduce_rd;
        case Algo::kHalvingDoubling: return all_reduce_rhd;
        case Algo::kOneShot: return all_reduce_oneshot;
        case Algo::kTwoShot: return all_reduce_twoshot;
        case Algo::kTree: return all_reduce_tree;
        case Algo::kHierarchical: return all_reduce_hier;
        default: return all_reduce_ring;
      }
    case CollKind::kReduceScatter:
      if (algo == Algo::kHalvingDoubling) return reduce_scatter_rhd;
      if (algo == Algo::kDirect) return reduce_scatter_direct;
      if (algo == Algo::kHierarchical) return reduce_scatter_hier;
      return reduce_scatter_ring;
    case CollKind::kAllGather:
      if (algo == Algo::kBruck) return all_gather_bruck;
      if (algo == Algo::kDirect) return all_gather_direct;
      if (algo == Algo::kHierarchical) return all_gather_hier;
      return all_gather_ring;
    case CollKind::kBroadcast:
      if (algo == Algo::kTree) return broadcast_tree;
      if (algo == Algo::kHierarchical) return broadcast_hier;
      return broadcast_chain;
    case CollKind::kReduce:
      if (algo == Algo::kTree) return reduce_tree;
      if (algo == Algo::kHierarchical) return reduce_hier;
      return reduce_chain;
    case CollKind::kAlltoAll:
      if (algo == Algo::kBruck) return alltoall_bruck;
      if (algo == Algo::kHierarchical) return alltoall_hier;
      return alltoall_pairwise;
    case CollKind::kGather: return gather_direct;
    case CollKind::kScatter: return scatter_direct;
    default: return nullptr;
  }
}

// Runs `fn` on `channels` slices of a contiguous buffer at once, one channel each.
Task run_on_channels(OpContext& ctx, AlgoFn fn, Args a, int channels) {
  FiberGroup group;
  for (int c = 0; c < channels; ++c) {
    Args slice = a;
    size_t off = block_offset(a.count, channels, c) * a.elem_size;
    slice.in = a.in + off;
    slice.out = a.out + off;
    slice.count = block_count(a.count, channels, c);
    slice.channel = c;
    slice.channels = 1;
    group.spawn(fn(ctx, slice));
  }
  co_return co_await group.join();
}

// The compressor `call` runs with, or null: the call's own (chorus*Compressed), or
// CHORUS_COMPRESS's for a plain AllReduce / ReduceScatter it applies to; either only where
// compressing pays under the cost model unless its policy is "always". Every rank decides
// alike: the inputs are the call, the parameters and the agreed cost model.
compress::Compressor* compressor_for(OpContext& ctx, const CollCall& call,
                                     std::shared_ptr<compress::Compressor>* keep) {
  compress::Compressor* c = nullptr;
  const int n = ctx.nranks();
  const size_t elem = datatype_size(call.dtype);
  const size_t bytes = call.count * elem * (call.kind == CollKind::kAllReduce ? 1 : n);
  if (call.compressor) {
    c = &call.compressor->get();
  } else {
    if (call.kind != CollKind::kAllReduce && call.kind != CollKind::kReduceScatter) return nullptr;
    if (!compress::compressible_dtype(call.dtype) || !compress::compressible_op(call.op.kind))
      return nullptr;
    // The size first: transparent() takes a lock, and small calls are latency-bound.
    if (bytes < compress::transparent_min_bytes()) return nullptr;
    *keep = compress::transparent();
    if (!*keep) return nullptr;
    c = keep->get();
  }
  if (c->settings().policy == compress::Policy::kAuto &&
      !compress::pays(ctx.comm().cost_model(), call.kind, bytes, ctx.comm().shape(), call.dtype,
                      c->settings()))
    return nullptr;
  return c;
}

// Whether a compressed AllReduce runs as the hierarchical one with a compressed cross-host
// stage (hosts with equal numbers of ranks, two at least): shared memory is faster than the
// codec, the network is not.
bool compress_across_hosts(const Comm& comm, const CollCall& call) {
  return call.kind == CollKind::kAllReduce && comm.hosts().size() > 1 &&
         comm.ranks_per_host() > 1;
}

Task run_collective(OpContext& ctx, CollCall call) {
  std::shared_ptr<compress::Compressor> transparent;
  compress::Compressor* compressor = compressor_for(ctx, call, &transparent);
  if (compressor != nullptr && !compress_across_hosts(ctx.comm(), call))
    co_return co_await compress::run(ctx, call, *compressor);
  Args a = args_for(call);
  if (is_reduction(call.kind)) {
    if (call.op.kind == RedOpKind::kPreMulSum && call.count > 0) {
      // Scale this rank's contribution once, aside, so the algorithm can read it anywhere.
      size_t n = send_elements(call, ctx.nranks());
      void* scaled = ctx.scratch(3, n * a.elem_size);
      const void* scalar = call.op.scalar_ptr ? call.op.scalar_ptr : call.op.scalar;
      kernels::scale_fn(call.dtype)(scaled, a.in, n, scalar);
      a.in = static_cast<const char*>(scaled);
    }
  }
  const bool blocked = blocked_call(call.kind);
  Choice choice = ctx.comm().choose(call.kind, choice_bytes(call, ctx.nranks()));
  if (compressor != nullptr) {
    choice = Choice{Algo::kHierarchical, 1};
    a.compressor = compressor;
    a.fold = call.op.kind == RedOpKind::kAvg ? RedOpKind::kSum : call.op.kind;
  }
  AlgoFn fn = algorithm(call.kind, choice.algo);
  if (fn == nullptr) co_return internal_error("no algorithm for {}", coll_name(call.kind));
  CHORUS_TRACE(kColl, "{}: {} x{} channel(s)", describe_tag(call.tag), algo_name(choice.algo),
               choice.channels);
  // Not a conditional expression of two co_awaits: GCC 12 destroys the awaited Task before
  // copying its result out of such an expression (a use after free on every error).
  Status status;
  if (choice.channels > 1 && !blocked) {
    status = co_await run_on_channels(ctx, fn, a, choice.channels);
  } else {
    status = co_await fn(ctx, a);
  }
  CHORUS_CO_RETURN_IF_ERROR(status);
  divide_average(call, ctx.nranks(), ctx.rank());
  co_return Status();
}

}  // namespace

bool blocked_call(CollKind kind) {
  return kind != CollKind::kAllReduce && kind != CollKind::kBroadcast &&
         kind != CollKind::kReduce;
}

size_t choice_bytes(const CollCall& call, int nranks) {
  return call.count * datatype_size(call.dtype) *
         (blocked_call(call.kind) ? static_cast<size_t>(nranks) : 1);
}

void divide_average(const CollCall& call, int nranks, int rank) {
  if (call.op.kind != RedOpKind::kAvg || !is_reduction(call.kind) || call.count == 0) return;
  if (call.kind == CollKind::kReduce && rank != call.root) return;  // no result here
  kernels::divide_fn(call.dtype)(call.recvbuf, call.count, nranks);
}

Args args_for(const CollCall& call) {
  Args a;
  a.in = static_cast<const char*>(call.sendbuf);
  a.out = static_cast<char*>(call.recvbuf);
  a.count = call.count;
  a.dtype = call.dtype;
  a.elem_size = datatype_size(call.dtype);
  a.root = call.root;
  if (is_reduction(call.kind)) a.reduce = kernels::reduce_fn(call.dtype, kernel_op(call.op.kind));
  return a;
}

Task run_call(OpContext& ctx, CollCall call) { return run_collective(ctx, std::move(call)); }

Task run_op(Comm& comm, Op& op) {
  if (op.is_internal()) {
    OpContext ctx(comm, op.calls().front().tag, &op);
    co_return co_await op.body()(ctx);
  }
  if (op.p2p_batch()) {
    OpContext ctx(comm, op.calls().front().tag, &op);
    co_return co_await send_recv_batch(ctx, op.calls(), op.recv_watch);
  }
  const CollCall& call = op.calls().front();
  OpContext ctx(comm, call.tag, &op);
  co_return co_await run_collective(ctx, call);
}

}  // namespace chorus::algo
