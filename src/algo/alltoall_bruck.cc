// SPDX-License-Identifier: Apache-2.0
// File: src/algo/alltoall_bruck.cc
// Bruck's AlltoAll: ceil(log2 n) steps instead of n-1, for small blocks. Blocks are rotated so
// that slot i holds the block for rank r+i; at step k every slot with bit k set is packed and
// sent to rank r+k, and the same slots are refilled from rank r-k. Afterwards slot i holds the
// block from rank r-i.
#include <vector>

#include "algo/algo.h"

namespace chorus::algo {

Task alltoall_bruck(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t block = a.count * a.elem_size;
  if (block == 0) co_return Status();
  char* slots = static_cast<char*>(ctx.scratch(0, block * n));
  char* packed_out = static_cast<char*>(ctx.scratch(1, block * n));
  char* packed_in = static_cast<char*>(ctx.scratch(2, block * n));
  for (int i = 0; i < n; ++i) copy_if_needed(slots + i * block, a.in + mod(r + i, n) * block, block);
  std::vector<int> moving;
  for (int k = 1; k < n; k <<= 1) {
    moving.clear();
    for (int i = 1; i < n; ++i)
      if (i & k) moving.push_back(i);
    for (size_t j = 0; j < moving.size(); ++j)
      copy_if_needed(packed_out + j * block, slots + moving[j] * block, block);
    size_t bytes = moving.size() * block;
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, mod(r + k, n), a.channel, packed_out, bytes);
    ctx.recv(rreq, mod(r - k, n), a.channel, packed_in, bytes);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    for (size_t j = 0; j < moving.size(); ++j)
      copy_if_needed(slots + moving[j] * block, packed_in + j * block, block);
  }
  for (int i = 0; i < n; ++i) copy_if_needed(a.out + mod(r - i, n) * block, slots + i * block, block);
  co_return Status();
}

}  // namespace chorus::algo
