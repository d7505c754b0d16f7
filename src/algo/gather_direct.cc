// SPDX-License-Identifier: Apache-2.0
// File: src/algo/gather_direct.cc
// Direct Gather: every rank sends its block straight to the root, which receives them all at
// once.
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task gather_direct(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  if (r != a.root) {
    SendRequest sreq;
    ctx.send(sreq, a.root, 0, a.in, bytes);
    co_return co_await ctx.wait(sreq);
  }
  copy_result_if_needed(a.out + r * bytes, a.in, bytes);
  RequestArray<RecvRequest> recvs(n);
  for (int i = 0; i < n; ++i)
    if (i != r) ctx.recv(recvs[i], i, 0, a.out + i * bytes, bytes);
  for (int i = 0; i < n; ++i)
    if (i != r) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[i]));
  co_return Status();
}

}  // namespace chorus::algo
