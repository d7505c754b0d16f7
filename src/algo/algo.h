// SPDX-License-Identifier: Apache-2.0
// File: src/algo/algo.h
// The collective algorithms: one coroutine per collective x algorithm, each in its own file.
// They receive validated calls whose reduction is already a plain kernels::ReduceOp (run.cc
// turns Avg into Sum + a final division and PreMulSum into a scaling pass + Sum), and post
// transfers through OpContext. Every algorithm works for any count (0 included), any number
// of ranks (1 included), any root, in place or not.
//
// A sender's buffer may be read by the receiver directly (the direct transport) until the send
// completes, so no algorithm writes to memory it has a send in flight from.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>

#include "core/op.h"
#include "core/task.h"
#include "kernels/reduce/reduce.h"

namespace chorus::compress {
class Compressor;
}

namespace chorus::algo {

// The root task of an operation: dispatches on the collective and algorithm.
Task run_op(Comm& comm, Op& op);
// The task of one collective call, `call.tag` set (as admit() sets it), without an operation:
// what run_op runs for a collective, from the express path (Comm::run_express).
Task run_call(OpContext& ctx, CollCall call);

// A call ready for an algorithm: reduction resolved to a kernel.
struct Args {
  const char* in = nullptr;  // sendbuf
  char* out = nullptr;       // recvbuf
  size_t count = 0;          // the count argument of the call
  size_t elem_size = 1;
  DataType dtype = DataType::kFloat32;
  kernels::ReduceFn reduce = nullptr;  // null for data-movement collectives
  int root = -1;
  int channel = 0;   // the connections to use
  int channels = 1;  // how many channels the tuner gave this call (ring splits over them)
  // A compressed AllReduce across hosts: the hierarchical AllReduce quantizes its cross-host
  // stage only (FP8 on the network, exact within each host), folding with `fold`.
  compress::Compressor* compressor = nullptr;
  RedOpKind fold = RedOpKind::kSum;
};

// A call's buffers, count, element and root as an algorithm takes them, with the reduction's
// kernel for a reduction (Avg and PreMulSum as Sum: the caller scales and divides).
Args args_for(const CollCall& call);
// Whether the collective's buffers hold a block per rank (ReduceScatter, AllGather, AlltoAll,
// Gather, Scatter), and the bytes the tuner chooses by: all of a rank's blocks for those.
bool blocked_call(CollKind kind);
size_t choice_bytes(const CollCall& call, int nranks);
// Avg, after its Sum: divides the result by nranks where this rank has one.
void divide_average(const CollCall& call, int nranks, int rank);

// AllReduce
Task all_reduce_ring(OpContext& ctx, Args a);        // reduce-scatter + all-gather rings
Task all_reduce_rd(OpContext& ctx, Args a);          // recursive doubling (latency)
Task all_reduce_rhd(OpContext& ctx, Args a);         // Rabenseifner: halving + doubling
Task all_reduce_oneshot(OpContext& ctx, Args a);     // everyone sends everything to everyone
Task all_reduce_twoshot(OpContext& ctx, Args a);     // direct reduce-scatter + all-gather
Task all_reduce_tree(OpContext& ctx, Args a);        // binomial reduce + binomial broadcast
Task all_reduce_hier(OpContext& ctx, Args a);        // within hosts, across hosts, within hosts
// The halves of the two-shot AllReduce, over a.count elements cut in nranks blocks of whole
// units (unit_offset): block r of a.out becomes the fold of every rank's block r of a.in (the
// other blocks of a.out are not touched: no copy of the input is needed); then every rank's
// block b of a.out is rank b's block b.
Task direct_reduce_scatter_blocks(OpContext& ctx, Args a, size_t unit = 1);
Task direct_all_gather_blocks(OpContext& ctx, Args a, size_t unit = 1);
// ReduceScatter
Task reduce_scatter_ring(OpContext& ctx, Args a);
Task reduce_scatter_rhd(OpContext& ctx, Args a);     // recursive halving (power of two)
Task reduce_scatter_direct(OpContext& ctx, Args a);  // every block straight to its owner
Task reduce_scatter_hier(OpContext& ctx, Args a);    // within hosts, then across hosts
// AllGather
Task all_gather_ring(OpContext& ctx, Args a);
Task all_gather_bruck(OpContext& ctx, Args a);       // log2(n) steps, any n
Task all_gather_direct(OpContext& ctx, Args a);
Task all_gather_hier(OpContext& ctx, Args a);        // across hosts, then within hosts
// Broadcast and Reduce
Task broadcast_chain(OpContext& ctx, Args a);        // pipelined chain (bandwidth)
Task broadcast_tree(OpContext& ctx, Args a);         // binomial tree (latency)
Task broadcast_hier(OpContext& ctx, Args a);         // across hosts, then within hosts
Task reduce_chain(OpContext& ctx, Args a);
Task reduce_tree(OpContext& ctx, Args a);
Task reduce_hier(OpContext& ctx, Args a);            // within hosts, then across hosts
// AlltoAll
Task alltoall_pairwise(OpContext& ctx, Args a);
Task alltoall_bruck(OpContext& ctx, Args a);         // log2(n) steps of packed blocks
Task alltoall_hier(OpContext& ctx, Args a);          // within hosts, then one row per host across
// Gather, Scatter, send/receive
Task gather_direct(OpContext& ctx, Args a);
Task scatter_direct(OpContext& ctx, Args a);
// `watch` (may be empty): Op::recv_watch.
Task send_recv_batch(OpContext& ctx, const std::vector<CollCall>& calls,
                     const std::function<void(size_t)>& watch);
// Every collective in one round through the shared-memory boxes (box.cc): the tuner's choice
// for small messages among ranks of one host.
Task box_all_reduce(OpContext& ctx, Args a);
Task box_reduce_scatter(OpContext& ctx, Args a);
Task box_all_gather(OpContext& ctx, Args a);
Task box_broadcast(OpContext& ctx, Args a);
Task box_reduce(OpContext& ctx, Args a);
Task box_alltoall(OpContext& ctx, Args a);
Task box_gather(OpContext& ctx, Args a);
Task box_scatter(OpContext& ctx, Args a);

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
// block_offset over runs of `unit` elements (the last may be short): where block i of `parts`
// starts, a multiple of unit (or count); i == parts gives count.
inline size_t unit_offset(size_t count, int parts, int i, size_t unit) {
  const size_t units = (count + unit - 1) / unit;
  return std::min(count, block_offset(units, parts, i) * unit);
}

// The requests of a pipeline of `n` chunks: in place for one chunk (every small message: no
// allocation per call), on the heap for more.
template <class R>
class ChunkRequests {
 public:
  explicit ChunkRequests(size_t n) : many_(n > 1 ? std::make_unique<R[]>(n) : nullptr) {}
  R& operator[](size_t i) { return many_ ? many_[i] : one_; }

 private:
  R one_;
  std::unique_ptr<R[]> many_;
};

// The communicator's ring (Comm::ring(): each host's ranks adjacent) seen from this rank; in a
// group view (a stage of a hierarchical algorithm), the group's rank order.
class RingView {
 public:
  explicit RingView(const OpContext& ctx);
  int pos() const { return pos_; }
  int pos_of(int rank) const;
  // The rank `offset` positions after this one (before it when negative).
  int at(int offset) const {
    const int p = mod(pos_ + offset, n_);
    return order_ != nullptr ? (*order_)[p] : p;
  }
  int next() const { return at(1); }
  int prev() const { return at(-1); }

 private:
  const Comm& comm_;
  const std::vector<int>* order_;  // null: rank order (a group view)
  int pos_, n_;
};

// The order a rooted tree runs in across hosts: the root, the other ranks of its host, then
// every other host's ranks, host after host (Comm::hosts()), each from the rank of the root's
// local index on (where the tree's message from another host arrives), so that each host is one block of
// the tree's order from the root on and few of its edges cross hosts (H - 1 of a binomial
// tree's n - 1 with hosts of 2^k ranks). Empty in a group view or on one host: the tree then
// runs in rank order.
std::vector<int> host_tree_order(const OpContext& ctx, int root);

// Folds n ranks onto the largest power of two p2 <= n, as recursive doubling and halving
// need: of the first 2*(n - p2) ranks, the even ones hand their data to the next (odd) rank
// and sit out; every other rank takes part with a virtual rank in [0, p2).
struct PowerOfTwoFold {
  int p2 = 1;
  int rem = 0;
  explicit PowerOfTwoFold(int n) {
    while (p2 * 2 <= n) p2 *= 2;
    rem = n - p2;
  }
  bool sits_out(int rank) const { return rank < 2 * rem && rank % 2 == 0; }
  bool absorbs(int rank) const { return rank < 2 * rem && rank % 2 == 1; }  // takes a partner's data
  int vrank(int rank) const { return rank < 2 * rem ? rank / 2 : rank - rem; }
  int real(int vrank) const { return vrank < rem ? 2 * vrank + 1 : vrank + rem; }
};

// Copies `bytes` unless source and destination are the same.
void copy_if_needed(void* dst, const void* src, size_t bytes);
// The same for a copy that is part of the collective's result (not read again by it): large
// ones bypass the caches (kernels::copy_to_output).
void copy_result_if_needed(void* dst, const void* src, size_t bytes);

}  // namespace chorus::algo
