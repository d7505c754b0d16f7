// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_gather_hier.cc
// Hierarchical AllGather for communicators that span hosts with L ranks each. R(h, j) is the
// j-th rank of host h; this rank is R(me, l).
//   1. across hosts: this rank's block to R(h, l) of every other host, theirs into place;
//   2. within the host: the H blocks of local index l to every local peer (one message each),
//      theirs into place.
// A host's link carries (H-1)/H of the output each way, where the host-aware ring carries
// (n-1)/n.
#include "algo/algo.h"
#include "core/comm.h"

namespace chorus::algo {

Task all_gather_hier(OpContext& ctx, Args a) {
  const Comm& comm = ctx.comm();
  const int local = comm.ranks_per_host();
  const auto& hosts = comm.hosts();
  const int nh = static_cast<int>(hosts.size());
  if (ctx.is_group() || nh < 2 || local < 2) co_return co_await all_gather_ring(ctx, a);
  const size_t bs = a.count * a.elem_size;
  if (bs == 0) co_return Status();
  const int me = ctx.rank(), mh = comm.host_of(me), l = comm.local_index(me);
  copy_result_if_needed(a.out + me * bs, a.in, bs);
  {
    std::vector<int> peers;
    for (const auto& h : hosts) peers.push_back(h[l]);
    OpContext across(ctx, std::move(peers));
    RequestArray<SendRequest> sends(static_cast<size_t>(nh));
    RequestArray<RecvRequest> recvs(static_cast<size_t>(nh));
    for (int k = 1; k < nh; ++k) {
      const int to = mod(mh + k, nh), from = mod(mh - k, nh);
      across.send(sends[k], to, a.channel, a.out + me * bs, bs);
      across.recv(recvs[k], from, a.channel, a.out + hosts[from][l] * bs, bs);
    }
    for (int k = 1; k < nh; ++k) {
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
    }
  }
  OpContext host(ctx, hosts[mh]);
  const size_t messages = static_cast<size_t>(local - 1) * nh;
  RequestArray<SendRequest> sends(messages);
  RequestArray<RecvRequest> recvs(messages);
  size_t i = 0;
  for (int k = 1; k < local; ++k) {
    const int to = mod(l + k, local), from = mod(l - k, local);
    for (int h = 0; h < nh; ++h, ++i) {
      host.send(sends[i], to, a.channel, a.out + hosts[h][l] * bs, bs);
      host.recv(recvs[i], from, a.channel, a.out + hosts[h][from] * bs, bs);
    }
  }
  for (i = 0; i < messages; ++i) {
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[i]));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[i]));
  }
  co_return Status();
}

}  // namespace chorus::algo
