// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_reduce_twoshot.cc
// Two-shot AllReduce: a direct reduce-scatter (block j of every rank goes straight to rank j,
// which folds them) and a direct all-gather of the reduced blocks. Two message latencies and
// the optimal 2(n-1)/n of the data per rank: for medium sizes among a few ranks of one host.
// The owner folds the blocks in a fixed order (from rank r-1, then r-2, ...), receiving the
// next only once the previous is folded: the same input gives the same bits on every run (the
// transports buffer what arrives meanwhile). The two halves are also the local stages of the
// hierarchical AllReduce (all_reduce_hier.cc).
#include "algo/algo.h"

namespace chorus::algo {

Task direct_reduce_scatter_blocks(OpContext& ctx, Args a, size_t unit) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t es = a.elem_size;
  auto off = [&](int b) { return unit_offset(a.count, n, b, unit) * es; };
  auto len = [&](int b) { return off(b + 1) - off(b); };
  RequestArray<SendRequest> sends(n);
  RequestArray<RecvRequest> recvs(n);
  // We send from the input; in place, the blocks we send are never written here (only block r).
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n);
    if (len(to) > 0) ctx.send(sends[k], to, a.channel, a.in + off(to), len(to));
  }
  if (n == 1) copy_if_needed(a.out + off(r), a.in + off(r), len(r));
  for (int k = 1; k < n && len(r) > 0; ++k) {
    // The first fold reads our own block from the input: no copy of it beforehand.
    const char* acc = k == 1 ? a.in + off(r) : a.out + off(r);
    ctx.recv_reduce(recvs[k], mod(r - k, n), a.channel, a.out + off(r), acc, len(r), a.reduce, es);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
  }
  for (int k = 1; k < n; ++k) {
    if (len(mod(r + k, n)) > 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  }
  co_return Status();
}

Task direct_all_gather_blocks(OpContext& ctx, Args a, size_t unit) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t es = a.elem_size;
  auto off = [&](int b) { return unit_offset(a.count, n, b, unit) * es; };
  auto len = [&](int b) { return off(b + 1) - off(b); };
  RequestArray<SendRequest> sends(n);
  RequestArray<RecvRequest> recvs(n);
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n), from = mod(r - k, n);
    if (len(r) > 0) ctx.send(sends[k], to, a.channel, a.out + off(r), len(r));
    if (len(from) > 0) ctx.recv(recvs[k], from, a.channel, a.out + off(from), len(from));
  }
  for (int k = 1; k < n; ++k) {
    if (len(mod(r - k, n)) > 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
    if (len(r) > 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  }
  co_return Status();
}

Task all_reduce_twoshot(OpContext& ctx, Args a) {
  if (ctx.nranks() == 1 || a.count == 0) {
    copy_if_needed(a.out, a.in, a.count * a.elem_size);
    co_return Status();
  }
  CHORUS_CO_RETURN_IF_ERROR(co_await direct_reduce_scatter_blocks(ctx, a));
  co_return co_await direct_all_gather_blocks(ctx, a);
}

}  // namespace chorus::algo
