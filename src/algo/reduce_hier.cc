// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_hier.cc
// Hierarchical Reduce, the mirror of broadcast_hier.cc, for communicators that span hosts with
// L ranks each. The root is R(rh, l); R(h, l) is the "leader" of host h.
//   1. within each host, its ranks reduce to the leader (chain or tree over the intra-host
//      link): the host's sum, in recvbuf on the root, in scratch on the other leaders;
//   2. across hosts, the leaders (one per host, the root's local index: on its own rail when a
//      host has one per rank) reduce the host sums to the root: a pipelined chain through the
//      hosts ending at rh, or a binomial tree for small calls.
// Each byte crosses the network once per host.
//
// The call is cut in pieces of whole chunks (hier_rooted_plan, tuner.cc): a leader runs the
// two stages in two fibers, sending piece p across hosts as soon as its host has reduced it,
// while the host reduces the next pieces. The fibers talk to different peers.
#include <algorithm>
#include <atomic>
#include <memory>

#include "algo/algo.h"
#include "algo/hier_rooted.h"
#include "algo/tuner.h"
#include "core/comm.h"

namespace chorus::algo {

namespace {

// A leader's host sum (recvbuf on the root), folded in place across hosts.
struct Stages : RootedStages {
  using RootedStages::RootedStages;
  char* sum = nullptr;
};

// Within the host, piece by piece, to its leader.
Task within_host(const Stages& st, Args a, std::shared_ptr<StageProgress> progress) {
  for (int p = 0; p < st.plan.pieces; ++p) {
    Args s = st.piece(a, p);
    s.root = st.root_local;
    if (st.leader) s.out = st.sum + st.offset(a, p);
    // Not a conditional expression of two co_awaits (GCC 12: see run.cc).
    Status status;
    if (st.plan.within == Algo::kTree) {
      status = co_await reduce_tree(*st.host, s);
    } else {
      status = co_await reduce_chain(*st.host, s);
    }
    if (!status.ok()) {
      progress->fail();
      co_return status;
    }
    progress->pieces.store(static_cast<uint32_t>(p + 1), std::memory_order_release);
  }
  co_return Status();
}

// The cross-host chain towards the root, chunk by chunk, each piece once this host has it:
// the leader farthest from the root sends its host's sum, every other folds what arrives into
// its own (in place) and passes it on.
Task across_chain(const Stages& st, Args a, std::shared_ptr<StageProgress> progress) {
  OpContext& ctx = *st.across;
  const int n = ctx.nranks(), pos = mod(ctx.rank() - st.root_host, n);
  const int from = pos < n - 1 ? mod(ctx.rank() + 1, n) : -1;  // farther from the root
  const int to = pos > 0 ? mod(ctx.rank() - 1, n) : -1;        // nearer the root
  const size_t bytes = a.count * a.elem_size, chunk = st.chunk;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto chunk_len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };
  ChunkRequests<RecvRequest> recvs(from >= 0 ? nchunks : 0);
  ChunkRequests<SendRequest> sends(to >= 0 ? nchunks : 0);
  size_t c = 0;
  for (int p = 0; p < st.plan.pieces; ++p) {
    co_await wait_until(WaitCond{&progress->pieces, static_cast<uint32_t>(p + 1)});
    if (progress->failed) co_return Status();  // the other fiber's error is the operation's
    const size_t end = st.offset(a, p + 1);
    const size_t first = c;
    for (size_t k = first; k * chunk < end; ++k) {
      if (from >= 0)
        ctx.recv_reduce(recvs[k], from, a.channel, st.sum + k * chunk, st.sum + k * chunk,
                        chunk_len(k), a.reduce, a.elem_size);
    }
    for (; c * chunk < end; ++c) {
      if (from >= 0) {
        Status status = co_await ctx.wait(recvs[c]);
        if (!status.ok()) {
          progress->fail();
          co_return status;
        }
      }
      if (to >= 0) ctx.send(sends[c], to, a.channel, st.sum + c * chunk, chunk_len(c));
    }
  }
  if (to >= 0) {
    for (c = 0; c < nchunks; ++c) {
      Status status = co_await ctx.wait(sends[c]);
      if (!status.ok()) {
        progress->fail();
        co_return status;
      }
    }
  }
  co_return Status();
}

// The cross-host binomial tree, once per piece (its input is this host's sum; the root's
// output is that sum too, in recvbuf, folded in place).
Task across_tree(const Stages& st, Args a, std::shared_ptr<StageProgress> progress) {
  for (int p = 0; p < st.plan.pieces; ++p) {
    co_await wait_until(WaitCond{&progress->pieces, static_cast<uint32_t>(p + 1)});
    if (progress->failed) co_return Status();
    Args s = st.piece(a, p);
    s.out = st.sum + st.offset(a, p);
    s.in = s.out;
    s.root = st.root_host;
    Status status = co_await reduce_tree(*st.across, s);
    if (!status.ok()) {
      progress->fail();
      co_return status;
    }
  }
  co_return Status();
}

}  // namespace

Task reduce_hier(OpContext& ctx, Args a) {
  const Comm& comm = ctx.comm();
  const int local = comm.ranks_per_host();
  const auto& hosts = comm.hosts();
  const int nh = static_cast<int>(hosts.size());
  // A group view, one host, or hosts with different numbers of ranks: the flat chain.
  if (ctx.is_group() || nh < 2 || local < 2) co_return co_await reduce_chain(ctx, a);
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  Stages st(ctx, a, CollKind::kReduce);
  if (!st.leader) co_return co_await within_host(st, a, std::make_shared<StageProgress>());
  // Scratch slot 7: not used by the stages' algorithms (reduce_tree: 4, reduce_chain: 8 + channel).
  st.sum = st.root ? a.out : static_cast<char*>(ctx.scratch(7, bytes));

  auto progress = std::make_shared<StageProgress>();
  FiberGroup group;
  group.spawn(within_host(st, a, progress));
  if (st.plan.across == Algo::kTree) {
    group.spawn(across_tree(st, a, progress));
  } else {
    group.spawn(across_chain(st, a, progress));
  }
  co_return co_await group.join();
}

}  // namespace chorus::algo
