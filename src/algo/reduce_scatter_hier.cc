// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_scatter_hier.cc
// Hierarchical ReduceScatter for communicators that span hosts with L ranks each. R(h, j) is
// the j-th rank of host h; this rank is R(me, l).
//   1. within the host: local rank l folds, for every host h, the host's blocks of rank R(h, l)
//      (one message per host from each local peer) into scratch block h;
//   2. across hosts: a direct ReduceScatter of those H blocks among R(., l), one per host.
// A host's link carries (H-1)/H of the input each way, where the host-aware ring carries
// (n-1)/n. Folds run in a fixed order: the same input gives the same bits on every run.
#include "algo/algo.h"
#include "core/comm.h"

namespace chorus::algo {

Task reduce_scatter_hier(OpContext& ctx, Args a) {
  const Comm& comm = ctx.comm();
  const int local = comm.ranks_per_host();
  const auto& hosts = comm.hosts();
  const int nh = static_cast<int>(hosts.size());
  if (ctx.is_group() || nh < 2 || local < 2) co_return co_await reduce_scatter_ring(ctx, a);
  const size_t bs = a.count * a.elem_size;
  if (bs == 0) co_return Status();
  const int me = ctx.rank(), l = comm.local_index(me);
  OpContext host(ctx, hosts[comm.host_of(me)]);
  std::vector<int> peers;
  for (const auto& h : hosts) peers.push_back(h[l]);
  OpContext across(ctx, std::move(peers));

  // 1. Scratch block h: the host's sum of the blocks of R(h, l).
  char* acc = static_cast<char*>(ctx.scratch(6, bs * nh));
  const size_t messages = static_cast<size_t>(local - 1) * nh;
  RequestArray<SendRequest> sends(messages);
  RequestArray<RecvRequest> recvs(static_cast<size_t>(nh));
  size_t s = 0;
  for (int k = 1; k < local; ++k) {
    const int j = mod(l + k, local);
    for (int h = 0; h < nh; ++h) host.send(sends[s++], j, a.channel, a.in + hosts[h][j] * bs, bs);
  }
  for (int k = 1; k < local; ++k) {
    const int from = mod(l - k, local);
    for (int h = 0; h < nh; ++h) {
      // The first fold reads our own block from the input.
      const char* src = k == 1 ? a.in + hosts[h][l] * bs : acc + h * bs;
      recvs[h].reset();
      host.recv_reduce(recvs[h], from, a.channel, acc + h * bs, src, bs, a.reduce, a.elem_size);
    }
    for (int h = 0; h < nh; ++h) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[h]));
  }
  for (size_t i = 0; i < messages; ++i) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[i]));
  // 2. Block h of the scratch belongs to R(h, l): rank h of `across`.
  Args part = a;
  part.in = acc;
  co_return co_await reduce_scatter_direct(across, part);
}

}  // namespace chorus::algo
