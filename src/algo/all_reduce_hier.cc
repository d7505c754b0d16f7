// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_hier.cc
// Hierarchical AllReduce for communicators that span hosts with L ranks each:
//   1. within each host, a direct reduce-scatter: local rank l holds block l (of L) of the
//      host's sum;
//   2. across hosts, the ranks of local index l (one per host) AllReduce block l, the L of
//      them side by side: local rank l talks to local rank l of every other host (on its own
//      rail when a host has one per rank);
//   3. within each host, a direct all-gather of the blocks.
// Between two hosts the host's link carries S bytes each way (the least an AllReduce of S
// bytes can), where a ring through every rank carries 2(n-1)/n S over its busiest hop. The
// cross-host AllReduce is the cheapest of ring, two-shot, halving-doubling and recursive
// doubling for its size (tuner.cc: across_hosts_algo).
//
// Large calls are cut into pieces that flow through the stages as a pipeline, so that the
// stages within a host run while the network carries another piece: one fiber runs the local
// stages (reduce-scatter of piece p + 1 before the all-gather of piece p), another the
// cross-host stage. They talk to different peers, so each peer still sees this rank's messages
// in one order on every run.
//
// A compressed AllReduce (chorusAllReduceCompressed, CHORUS_COMPRESS) across such hosts runs
// here too, with only the cross-host stage in FP8 (compress::all_reduce_part): exact over
// shared memory, a quarter of the bytes on the network.
#include <algorithm>
#include <atomic>
#include <climits>
#include <memory>
#include <vector>

#include "algo/algo.h"
#include "algo/tuner.h"
#include "compress/compressed_coll.h"
#include "compress/compressor.h"
#include "core/comm.h"

namespace chorus::algo {

namespace {

// Pieces of at least this many bytes (the network stage wants long transfers), at most
// kMaxPieces of them.
constexpr size_t kMinPieceBytes = size_t{2} << 20;
constexpr int kMaxPieces = 8;
constexpr int kMaxCompressedPieces = 3;

Task run_across(Algo algo, OpContext& ctx, Args a) {
  switch (algo) {
    case Algo::kTwoShot: return all_reduce_twoshot(ctx, a);
    case Algo::kHalvingDoubling: return all_reduce_rhd(ctx, a);
    case Algo::kRecursiveDoubling: return all_reduce_rd(ctx, a);
    default: return all_reduce_ring(ctx, a);
  }
}

// Progress shared by the two fibers: pieces reduced within the host, pieces reduced across
// hosts. A fiber that fails sets both to the end, so that the other never waits for it.
struct Pipeline {
  std::atomic<uint32_t> local_done{0};
  std::atomic<uint32_t> across_done{0};
  bool failed = false;
  void fail() {
    failed = true;
    local_done.store(UINT_MAX, std::memory_order_release);
    across_done.store(UINT_MAX, std::memory_order_release);
  }
};

struct Stages {
  OpContext* host;    // this host's ranks
  OpContext* across;  // local index l of every host
  Algo across_algo;
  // Compressed cross-host stage (Args::compressor): the settings, the residual (null without
  // error feedback) and the call's tag and datatype for the compressed AllReduce of each block.
  const compress::Settings* settings = nullptr;
  float* residual = nullptr;
  CollCall call;
  int pieces;
  int local;  // ranks per host
  int l;      // this rank's local index
  // Pieces and blocks are cut at multiples of `unit` elements: the codec block when the
  // cross-host stage compresses (each block then quantizes whole codec blocks), else 1.
  size_t unit = 1;
  Args piece(const Args& a, int p) const {
    Args s = a;
    const size_t begin = unit_offset(a.count, pieces, p, unit);
    s.in = a.in + begin * a.elem_size;
    s.out = a.out + begin * a.elem_size;
    s.count = unit_offset(a.count, pieces, p + 1, unit) - begin;
    return s;
  }
  // This rank's block of piece p (in a.out), reduced in place across hosts.
  Args block(const Args& a, int p) const {
    Args s = piece(a, p);
    const size_t begin = unit_offset(s.count, local, l, unit);
    s.count = unit_offset(s.count, local, l + 1, unit) - begin;
    s.in = s.out = s.out + begin * a.elem_size;
    return s;
  }
};

Task local_stages(const Stages& st, Args a, std::shared_ptr<Pipeline> pipe) {
  Status status;
  for (int p = 0; p <= st.pieces && status.ok(); ++p) {
    if (p < st.pieces) {
      status = co_await direct_reduce_scatter_blocks(*st.host, st.piece(a, p), st.unit);
      if (!status.ok()) break;
      pipe->local_done.store(static_cast<uint32_t>(p + 1), std::memory_order_release);
    }
    if (p == 0) continue;
    co_await wait_until(WaitCond{&pipe->across_done, static_cast<uint32_t>(p)});
    if (pipe->failed) co_return Status();  // the other fiber's error is the operation's
    status = co_await direct_all_gather_blocks(*st.host, st.piece(a, p - 1), st.unit);
  }
  if (!status.ok()) pipe->fail();
  co_return status;
}

Task across_stage(const Stages& st, Args a, std::shared_ptr<Pipeline> pipe) {
  for (int p = 0; p < st.pieces; ++p) {
    co_await wait_until(WaitCond{&pipe->local_done, static_cast<uint32_t>(p + 1)});
    if (pipe->failed) co_return Status();
    const Args b = st.block(a, p);
    Status status;
    if (st.settings != nullptr) {
      CollCall part = st.call;
      part.sendbuf = b.in;
      part.recvbuf = b.out;
      part.count = b.count;
      const size_t base = static_cast<size_t>(b.out - a.out) / a.elem_size;
      status = co_await compress::all_reduce_part(*st.across, part, *st.settings, st.residual, base);
    } else {
      status = co_await run_across(st.across_algo, *st.across, b);
    }
    if (!status.ok()) {
      pipe->fail();
      co_return status;
    }
    pipe->across_done.store(static_cast<uint32_t>(p + 1), std::memory_order_release);
  }
  co_return Status();
}

}  // namespace

Task all_reduce_hier(OpContext& ctx, Args a) {
  const Comm& comm = ctx.comm();
  const int local = comm.ranks_per_host();
  const int hosts = static_cast<int>(comm.hosts().size());
  // A group view, one host, or hosts with different numbers of ranks: the flat ring.
  if (ctx.is_group() || hosts < 2 || local < 2) co_return co_await all_reduce_ring(ctx, a);
  if (a.count == 0) co_return Status();
  const int me = ctx.rank(), l = comm.local_index(me);
  OpContext host(ctx, comm.hosts()[comm.host_of(me)]);
  std::vector<int> peers;  // local index l of every host
  for (const auto& h : comm.hosts()) peers.push_back(h[l]);
  OpContext across(ctx, std::move(peers));

  const size_t bytes = a.count * a.elem_size;
  Stages st;
  st.host = &host;
  st.across = &across;
  st.across_algo = across_hosts_algo(comm.cost_model(), bytes, comm.shape());
  st.pieces = static_cast<int>(std::clamp<size_t>(bytes / kMinPieceBytes, 1, kMaxPieces));
  st.local = local;
  st.l = l;
  Result<float*> residual = static_cast<float*>(nullptr);
  if (a.compressor != nullptr) {
    residual = a.compressor->begin_run();
    if (!residual.ok()) co_return residual.take_status();
    st.settings = &a.compressor->settings();
    st.residual = *residual;
    st.call.kind = CollKind::kAllReduce;
    st.call.dtype = a.dtype;
    st.call.op.kind = a.fold;
    st.call.tag = ctx.tag();
    // A compressed block travels in up to 2 x 32 messages per peer (compressed_coll.cc); a
    // message's ordinal between two ranks wraps at 256 per operation.
    st.pieces = std::min(st.pieces, kMaxCompressedPieces);
    st.unit = st.settings->block;
  }
  // Ends the compressor's run however the coroutine ends: done, failed, or destroyed by an abort.
  struct RunGuard {
    compress::Compressor* c;
    ~RunGuard() {
      if (c != nullptr) c->end_run();
    }
  } guard{a.compressor};
  auto pipe = std::make_shared<Pipeline>();
  FiberGroup group;
  group.spawn(local_stages(st, a, pipe));
  group.spawn(across_stage(st, a, pipe));
  co_return co_await group.join();
}

}  // namespace chorus::algo
