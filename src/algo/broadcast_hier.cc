// SPDX-License-Identifier: Apache-2.0
// File: src/algo/broadcast_hier.cc
// Hierarchical Broadcast for communicators that span hosts with L ranks each. The root is
// R(rh, l), the l-th rank of host rh; R(h, l) is the "leader" of host h.
//   1. across hosts: the leaders (one per host, the root's local index: on its own rail when a
//      host has one per rank) broadcast from the root, a pipelined chain through the hosts
//      starting at rh, or a binomial tree for small calls;
//   2. within each host, its leader broadcasts to the host's other ranks (chain or tree over
//      the intra-host link).
// Each byte crosses the network once per host (H - 1 times in all), where a chain through
// every rank may cross once more (back into the root's host) and has n - 1 hops to fill.
//
// The call is cut in pieces of whole chunks (hier_rooted_plan, tuner.cc): a leader runs the
// two stages in two fibers, broadcasting piece p within its host as soon as the cross-host
// stage has delivered it, while the next pieces are still crossing. The fibers talk to
// different peers (other hosts, this host), so each peer sees this rank's messages in one order.
#include <algorithm>
#include <atomic>
#include <memory>

#include "algo/algo.h"
#include "algo/hier_rooted.h"
#include "algo/tuner.h"
#include "core/comm.h"

namespace chorus::algo {

namespace {

// The cross-host chain over the whole call, chunk by chunk (as broadcast_chain), counting the
// pieces it has received. The root sends from its input: its host stage copies to the output.
Task across_chain(const RootedStages& st, Args a, std::shared_ptr<StageProgress> progress) {
  OpContext& ctx = *st.across;
  const int n = ctx.nranks(), pos = mod(ctx.rank() - st.root_host, n);
  const int from = pos > 0 ? mod(ctx.rank() - 1, n) : -1;
  const int to = pos < n - 1 ? mod(ctx.rank() + 1, n) : -1;
  const size_t bytes = a.count * a.elem_size, chunk = st.chunk;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto chunk_len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };
  const char* src = pos == 0 ? a.in : a.out;
  ChunkRequests<RecvRequest> recvs(from >= 0 ? nchunks : 0);
  ChunkRequests<SendRequest> sends(to >= 0 ? nchunks : 0);
  if (from >= 0)
    for (size_t c = 0; c < nchunks; ++c)
      ctx.recv(recvs[c], from, a.channel, a.out + c * chunk, chunk_len(c));
  int delivered = 0;
  for (size_t c = 0; c < nchunks; ++c) {
    if (from >= 0) {
      Status status = co_await ctx.wait(recvs[c]);
      if (!status.ok()) {
        progress->fail();
        co_return status;
      }
    }
    if (to >= 0) ctx.send(sends[c], to, a.channel, src + c * chunk, chunk_len(c));
    const size_t received = std::min(bytes, (c + 1) * chunk);
    while (delivered < st.plan.pieces) {
      const Args p = st.piece(a, delivered);
      if (static_cast<size_t>(p.out - a.out) + p.count * a.elem_size > received) break;
      progress->pieces.store(static_cast<uint32_t>(++delivered), std::memory_order_release);
    }
  }
  if (to >= 0) {
    for (size_t c = 0; c < nchunks; ++c) {
      Status status = co_await ctx.wait(sends[c]);
      if (!status.ok()) {
        progress->fail();
        co_return status;
      }
    }
  }
  co_return Status();
}

// The cross-host binomial tree, once per piece.
Task across_tree(const RootedStages& st, Args a, std::shared_ptr<StageProgress> progress) {
  for (int p = 0; p < st.plan.pieces; ++p) {
    Args s = st.piece(a, p);
    s.root = st.root_host;
    // The root only sends (from its input); its host stage copies the piece to the output.
    if (st.root) s.out = const_cast<char*>(s.in);
    Status status = co_await broadcast_tree(*st.across, s);
    if (!status.ok()) {
      progress->fail();
      co_return status;
    }
    progress->pieces.store(static_cast<uint32_t>(p + 1), std::memory_order_release);
  }
  co_return Status();
}

// Within the host, piece by piece from its leader (once the cross-host stage has it).
Task within_host(const RootedStages& st, Args a, std::shared_ptr<StageProgress> progress) {
  for (int p = 0; p < st.plan.pieces; ++p) {
    if (st.leader && !st.root) {
      co_await wait_until(WaitCond{&progress->pieces, static_cast<uint32_t>(p + 1)});
      if (progress->failed) co_return Status();  // the other fiber's error is the operation's
    }
    Args s = st.piece(a, p);
    s.root = st.root_local;
    if (!st.root) s.in = s.out;  // a leader forwards what it received
    // Not a conditional expression of two co_awaits (GCC 12: see run.cc).
    Status status;
    if (st.plan.within == Algo::kTree) {
      status = co_await broadcast_tree(*st.host, s);
    } else {
      status = co_await broadcast_chain(*st.host, s);
    }
    if (!status.ok()) {
      progress->fail();
      co_return status;
    }
  }
  co_return Status();
}

}  // namespace

Task broadcast_hier(OpContext& ctx, Args a) {
  const Comm& comm = ctx.comm();
  const int local = comm.ranks_per_host();
  const auto& hosts = comm.hosts();
  const int nh = static_cast<int>(hosts.size());
  // A group view, one host, or hosts with different numbers of ranks: the flat chain.
  if (ctx.is_group() || nh < 2 || local < 2) co_return co_await broadcast_chain(ctx, a);
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  const RootedStages st(ctx, a, CollKind::kBroadcast);
  if (!st.leader) co_return co_await within_host(st, a, std::make_shared<StageProgress>());

  auto progress = std::make_shared<StageProgress>();
  FiberGroup group;
  if (st.plan.across == Algo::kTree) {
    group.spawn(across_tree(st, a, progress));
  } else {
    group.spawn(across_chain(st, a, progress));
  }
  group.spawn(within_host(st, a, progress));
  co_return co_await group.join();
}

}  // namespace chorus::algo
