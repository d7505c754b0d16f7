// SPDX-License-Identifier: Apache-2.0
// File: src/algo/all_gather_bruck.cc
// Bruck's AllGather: ceil(log2 n) steps for any n. Blocks are gathered in rotated order (slot i
// holds rank r+i's block): at step k a rank sends its first min(k, n-k) slots to rank r-k and
// receives as many from rank r+k into slots k.., then rotates them into place.
#include <algorithm>

#include "algo/algo.h"

namespace chorus::algo {

Task all_gather_bruck(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t block = a.count * a.elem_size;
  if (block == 0) co_return Status();
  if (n == 1) {
    copy_if_needed(a.out, a.in, block);
    co_return Status();
  }
  char* slots = static_cast<char*>(ctx.scratch(0, block * n));
  copy_if_needed(slots, a.in, block);
  for (int k = 1; k < n; k <<= 1) {
    int cnt = std::min(k, n - k);
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, mod(r - k, n), a.channel, slots, cnt * block);
    ctx.recv(rreq, mod(r + k, n), a.channel, slots + k * block, cnt * block);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
  }
  for (int i = 0; i < n; ++i)
    copy_result_if_needed(a.out + mod(r + i, n) * block, slots + i * block, block);
  co_return Status();
}

}  // namespace chorus::algo
