// SPDX-License-Identifier: Apache-2.0
// File: src/algo/hier_rooted.cc
#include "algo/hier_rooted.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/params.h"
#include "core/comm.h"

namespace chorus::algo {

RootedStages::RootedStages(OpContext& ctx, const Args& a, CollKind coll) {
  const Comm& comm = ctx.comm();
  const auto& hosts = comm.hosts();
  const int me = ctx.rank();
  plan = hier_rooted_plan(comm.cost_model(), coll, a.count * a.elem_size, comm.shape());
  root_host = comm.host_of(a.root);
  root_local = comm.local_index(a.root);
  leader = comm.local_index(me) == root_local;
  root = me == a.root;
  const size_t bytes = static_cast<size_t>(params::kChunkBytes.get());
  chunk = std::max(a.elem_size, bytes / a.elem_size * a.elem_size);
  host.emplace(ctx, hosts[comm.host_of(me)]);
  if (!leader) return;
  std::vector<int> leaders;
  for (const auto& h : hosts) leaders.push_back(h[root_local]);
  across.emplace(ctx, std::move(leaders));
}

size_t RootedStages::offset(const Args& a, int p) const {
  return unit_offset(a.count, plan.pieces, p, chunk / a.elem_size) * a.elem_size;
}

Args RootedStages::piece(const Args& a, int p) const {
  const size_t begin = offset(a, p);
  Args s = a;
  s.in = a.in + begin;
  s.out = a.out != nullptr ? a.out + begin : nullptr;
  s.count = (offset(a, p + 1) - begin) / a.elem_size;
  return s;
}

}  // namespace chorus::algo
