// SPDX-License-Identifier: Apache-2.0
// File: src/algo/alltoall_pairwise.cc
// Pairwise AlltoAll: every block is posted at once (to r+k, from r-k), so transfers to all
// peers overlap; the transports' flow control bounds what is in flight. In place, the input is
// copied aside first.
#include <cstring>
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task alltoall_pairwise(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;  // one block
  if (bytes == 0) co_return Status();
  const char* in = a.in;
  if (in == a.out && n > 1) {
    char* copy = static_cast<char*>(ctx.scratch(2, bytes * n));
    std::memcpy(copy, a.in, bytes * n);
    in = copy;
  }
  copy_result_if_needed(a.out + r * bytes, in + r * bytes, bytes);
  RequestArray<SendRequest> sends(n);
  RequestArray<RecvRequest> recvs(n);
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n), from = mod(r - k, n);
    ctx.recv(recvs[k], from, 0, a.out + from * bytes, bytes);
    ctx.send(sends[k], to, 0, in + to * bytes, bytes);
  }
  for (int k = 1; k < n; ++k) {
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[k]));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  }
  co_return Status();
}

}  // namespace chorus::algo
