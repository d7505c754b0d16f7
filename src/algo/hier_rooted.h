// SPDX-License-Identifier: Apache-2.0
// File: src/algo/hier_rooted.h
// What the hierarchical Broadcast and Reduce (broadcast_hier.cc, reduce_hier.cc) share: their
// two stages' group views, the plan, where the root is, and the pieces the call is cut in; and
// the counter through which one stage's fiber tells the other how far it is.
#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "algo/algo.h"
#include "algo/tuner.h"

namespace chorus::algo {

// Pieces one stage has finished (Broadcast: received across hosts; Reduce: reduced within the
// host). A failed stage sets it to the end, so that the other fiber never waits for it.
struct StageProgress {
  std::atomic<uint32_t> pieces{0};
  bool failed = false;
  void fail() {
    failed = true;
    pieces.store(UINT_MAX, std::memory_order_release);
  }
};

// The stages of a rooted collective on a communicator of hosts with the same number of ranks.
// The root is R(rh, l), the l-th rank of host rh; R(h, l) is the "leader" of host h.
struct RootedStages {
  // The stages send through these views from const fibers: they are not part of the plan.
  mutable std::optional<OpContext> host;    // this host's ranks
  mutable std::optional<OpContext> across;  // leaders only: the leaders, in host order
  RootedPlan plan;
  int root_host = 0;    // the root's host: its group rank in `across`
  int root_local = 0;   // the root's local index: its group rank in `host`
  bool leader = false;  // this rank is in `across`
  bool root = false;
  size_t chunk = 1;  // bytes, a multiple of the element size (CHORUS_CHUNK_BYTES)

  RootedStages(OpContext& ctx, const Args& a, CollKind coll);
  // Where piece p of the call starts, in bytes (pieces are cut at whole chunks).
  size_t offset(const Args& a, int p) const;
  // Piece p of the call (`out` may be null: Reduce off the root).
  Args piece(const Args& a, int p) const;
};

}  // namespace chorus::algo
