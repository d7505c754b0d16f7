// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_scatter_ring.cc
// Ring ReduceScatter: n-1 steps; at step s the rank at ring position p forwards the partial of
// the block of the rank at position p-s-1 and folds its own input into the partial of the block
// of position p-s-2 arriving from prev (RingView: each host's ranks are adjacent). Partials
// alternate between two scratch buffers; the last step lands in recvbuf.
#include <cstring>

#include "algo/algo.h"

namespace chorus::algo {

Task reduce_scatter_ring(OpContext& ctx, Args a) {
  const int n = ctx.nranks();
  const RingView ring(ctx);
  const size_t bytes = a.count * a.elem_size;  // one block (count = recvcount)
  if (bytes == 0) co_return Status();
  if (n == 1) {
    if (a.out != a.in) std::memcpy(a.out, a.in, bytes);
    co_return Status();
  }
  const int next = ring.next(), prev = ring.prev();
  char* tmp[2] = {static_cast<char*>(ctx.scratch(0, bytes)),
                  static_cast<char*>(ctx.scratch(1, bytes))};
  const char* partial = nullptr;  // what step s sends when s > 0
  for (int s = 0; s < n - 1; ++s) {
    int sb = ring.at(-s - 1), rb = ring.at(-s - 2);  // the last rb is this rank's block
    char* acc = (s == n - 2) ? a.out : tmp[s % 2];
    SendRequest sreq;
    RecvRequest rreq;
    ctx.send(sreq, next, a.channel, s == 0 ? a.in + sb * bytes : partial, bytes);
    ctx.recv_reduce(rreq, prev, a.channel, acc, a.in + rb * bytes, bytes, a.reduce, a.elem_size);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(rreq));
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sreq));
    partial = acc;
  }
  co_return Status();
}

}  // namespace chorus::algo
