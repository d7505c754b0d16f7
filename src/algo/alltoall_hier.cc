// SPDX-License-Identifier: Apache-2.0
// File: src/algo/alltoall_hier.cc
// Hierarchical AlltoAll for communicators that span hosts with L ranks each. R(h, j) is the
// j-th rank of host h; this rank is R(me, l).
//   1. within the host: to each local peer R(me, j), the H blocks bound for local index j of
//      every host (one message each); the blocks from R(me, i) bound for R(g, l) gather in a
//      staging row per host g, L blocks long (those bound for this rank go straight to place);
//   2. across hosts: to R(g, l), rail-aligned, staging row g in one message of L blocks; the
//      row from R(h, l) holds what every rank of host h sends this rank.
// A host's link carries what the flat AlltoAll carries, (H-1)/H of the data each way, but in
// H-1 messages per rank instead of n-L: the win is in latency, and in rail alignment (local
// rank l talks across hosts only to local ranks l). A host's row is sent as soon as its L-1
// blocks have arrived, so the stages overlap. Hosts in rank order (block placement) receive
// straight into the output; others through a second staging area.
#include <cstring>

#include "algo/algo.h"
#include "core/comm.h"

namespace chorus::algo {

namespace {

// Whether host `h`'s ranks are consecutive (h[0], h[0] + 1, ...), so that the blocks they send
// lie side by side in an AlltoAll's output.
bool consecutive(const std::vector<int>& h) {
  for (size_t i = 1; i < h.size(); ++i)
    if (h[i] != h[0] + static_cast<int>(i)) return false;
  return true;
}

}  // namespace

Task alltoall_hier(OpContext& ctx, Args a) {
  const Comm& comm = ctx.comm();
  const int local = comm.ranks_per_host();
  const auto& hosts = comm.hosts();
  const int nh = static_cast<int>(hosts.size());
  if (ctx.is_group() || nh < 2 || local < 2) co_return co_await alltoall_pairwise(ctx, a);
  const size_t bs = a.count * a.elem_size;  // one block
  if (bs == 0) co_return Status();
  const int me = ctx.rank(), mh = comm.host_of(me), l = comm.local_index(me);
  const size_t row = bs * local;  // one host's blocks in a staging row
  const char* in = a.in;
  if (in == a.out) {
    char* copy = static_cast<char*>(ctx.scratch(2, bs * ctx.nranks()));
    std::memcpy(copy, a.in, bs * ctx.nranks());
    in = copy;
  }
  // stage + g * row + i * bs: the block R(me, i) sends R(g, l), for every host g but ours.
  char* stage = static_cast<char*>(ctx.scratch(0, row * nh));
  char* landing = nullptr;  // rows from hosts whose ranks are not consecutive
  copy_result_if_needed(a.out + me * bs, in + me * bs, bs);

  // Hosts in the order both stages visit them: the next one first, our own (whose blocks need
  // no second hop) last.
  auto host_at = [&](int k) { return mod(mh + 1 + k, nh); };

  // Stage 2's receives first: they do not depend on stage 1.
  std::vector<int> across_peers;
  for (const auto& h : hosts) across_peers.push_back(h[l]);
  OpContext across(ctx, std::move(across_peers));
  RequestArray<RecvRequest> rows_in(static_cast<size_t>(nh));
  for (int k = 0; k + 1 < nh; ++k) {
    const int from = mod(mh - 1 - k, nh);
    char* dst;
    if (consecutive(hosts[from])) {
      dst = a.out + hosts[from][0] * bs;
    } else {
      if (landing == nullptr) landing = static_cast<char*>(ctx.scratch(1, row * nh));
      dst = landing + from * row;
    }
    across.recv(rows_in[from], from, a.channel, dst, row);
  }

  // Stage 1: every block bound for local index j of host g to R(me, j); ours into the rows.
  OpContext host(ctx, hosts[mh]);
  const size_t messages = static_cast<size_t>(local) * nh;  // [g * local + j], j != l
  RequestArray<SendRequest> sends(messages);
  RequestArray<RecvRequest> recvs(messages);
  for (int k = 0; k < nh; ++k) {
    const int g = host_at(k);
    for (int j = 1; j < local; ++j) {
      const int to = mod(l + j, local), from = mod(l - j, local);
      host.send(sends[g * local + to], to, a.channel, in + hosts[g][to] * bs, bs);
      char* dst = g == mh ? a.out + hosts[mh][from] * bs : stage + g * row + from * bs;
      host.recv(recvs[g * local + from], from, a.channel, dst, bs);
    }
    if (g != mh) std::memcpy(stage + g * row + l * bs, in + hosts[g][l] * bs, bs);
  }

  // Stage 2: a host's row goes as soon as its blocks are in.
  RequestArray<SendRequest> rows_out(static_cast<size_t>(nh));
  for (int k = 0; k + 1 < nh; ++k) {
    const int g = host_at(k);
    for (int i = 0; i < local; ++i)
      if (i != l) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[g * local + i]));
    across.send(rows_out[g], g, a.channel, stage + g * row, row);
  }
  for (int i = 0; i < local; ++i)
    if (i != l) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[mh * local + i]));
  for (int k = 0; k + 1 < nh; ++k) {
    const int from = mod(mh - 1 - k, nh);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rows_in[from]));
    if (landing != nullptr && !consecutive(hosts[from])) {
      for (int i = 0; i < local; ++i)
        copy_result_if_needed(a.out + hosts[from][i] * bs, landing + from * row + i * bs, bs);
    }
  }
  for (int k = 0; k + 1 < nh; ++k) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rows_out[host_at(k)]));
  for (int g = 0; g < nh; ++g) {
    for (int j = 0; j < local; ++j)
      if (j != l) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[g * local + j]));
  }
  co_return Status();
}

}  // namespace chorus::algo
