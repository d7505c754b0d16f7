// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_gather_direct.cc
// Direct AllGather: every rank sends its block straight to every other rank, all at once.
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task all_gather_direct(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t block = a.count * a.elem_size;
  if (block == 0) co_return Status();
  copy_result_if_needed(a.out + r * block, a.in, block);
  RequestArray<SendRequest> sends(n);
  RequestArray<RecvRequest> recvs(n);
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n), from = mod(r - k, n);
    ctx.send(sends[k], to, a.channel, a.out + r * block, block);
    ctx.recv(recvs[k], from, a.channel, a.out + from * block, block);
  }
  for (int k = 1; k < n; ++k) {
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  }
  co_return Status();
}

}  // namespace chorus::algo
