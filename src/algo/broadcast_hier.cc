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
#include <climits>
#include <memory>
#include <vector>

#include "algo/algo.h"
#include "algo/tuner.h"
#include "common/params.h"
#include "core/comm.h"

namespace chorus::algo {

namespace {

// Pieces of a.out the cross-host stage has delivered to this leader. A failed stage sets it
// to the end, so that the other fiber never waits for it.
struct Progress {
  std::atomic<uint32_t> pieces{0};
  bool failed = false;
  void fail() {
    failed = true;
    pieces.store(UINT_MAX, std::memory_order_release);
  }
};

struct Stages {
  OpContext* host = nullptr;    // this host's ranks
  OpContext* across = nullptr;  // the root's local index on every host, in host order
  RootedPlan plan;
  int root_host = 0;   // the root's host: its group rank in `across`
  int root_local = 0;  // the root's local index: its group rank in `host`
  bool leader = false;  // this rank is in `across`
  bool root = false;
  size_t chunk = 1;     // bytes, a multiple of the element size
  // Piece p of the call, cut at whole chunks.
  Args piece(const Args& a, int p) const {
    const size_t unit = chunk / a.elem_size;
    const size_t begin = unit_offset(a.count, plan.pieces, p, unit);
    Args s = a;
    s.in = a.in + begin * a.elem_size;
    s.out = a.out + begin * a.elem_size;
    s.count = unit_offset(a.count, plan.pieces, p + 1, unit) - begin;
    return s;
  }
};

// The cross-host chain over the whole call, chunk by chunk (as broadcast_chain), counting the
// pieces it has received. The root sends from its input: its host stage copies to the output.
Task across_chain(const Stages& st, Args a, std::shared_ptr<Progress> progress) {
  OpContext& ctx = *st.across;
  const int n = ctx.nranks(), pos = mod(ctx.rank() - st.root_host, n);
  const int from = pos > 0 ? mod(ctx.rank() - 1, n) : -1;
  const int to = pos < n - 1 ? mod(ctx.rank() + 1, n) : -1;
  const size_t bytes = a.count * a.elem_size, chunk = st.chunk;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto chunk_len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };
  const char* src = pos == 0 ? a.in : a.out;
  auto recvs = std::make_unique<RecvRequest[]>(from >= 0 ? nchunks : 0);
  auto sends = std::make_unique<SendRequest[]>(to >= 0 ? nchunks : 0);
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
Task across_tree(const Stages& st, Args a, std::shared_ptr<Progress> progress) {
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
Task within_host(const Stages& st, Args a, std::shared_ptr<Progress> progress) {
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
  const int me = ctx.rank(), mh = comm.host_of(me);

  Stages st;
  st.plan = hier_rooted_plan(comm.cost_model(), CollKind::kBroadcast, bytes, comm.shape());
  st.root_host = comm.host_of(a.root);
  st.root_local = comm.local_index(a.root);
  st.leader = comm.local_index(me) == st.root_local;
  st.root = me == a.root;
  const size_t chunk = static_cast<size_t>(params::kChunkBytes.get());
  st.chunk = std::max(a.elem_size, chunk / a.elem_size * a.elem_size);
  OpContext host(ctx, hosts[mh]);
  st.host = &host;
  if (!st.leader) co_return co_await within_host(st, a, std::make_shared<Progress>());

  std::vector<int> leaders;
  for (const auto& h : hosts) leaders.push_back(h[st.root_local]);
  OpContext across(ctx, std::move(leaders));
  st.across = &across;
  auto progress = std::make_shared<Progress>();
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
