// SPDX-License-Identifier: Apache-2.0
// File: src/algo/scatter_direct.cc
// Direct Scatter: the root sends block i straight to rank i, all at once.
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task scatter_direct(OpContext& ctx, Args a) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  if (r != a.root) {
    RecvRequest rreq;
    ctx.recv(rreq, a.root, 0, a.out, bytes);
    co_return co_await ctx.wait(rreq);
  }
  copy_result_if_needed(a.out, a.in + r * bytes, bytes);
  RequestArray<SendRequest> sends(n);
  for (int i = 0; i < n; ++i)
    if (i != r) ctx.send(sends[i], i, 0, a.in + i * bytes, bytes);
  for (int i = 0; i < n; ++i)
    if (i != r) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[i]));
  co_return Status();
}

}  // namespace chorus::algo
