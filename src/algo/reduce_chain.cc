// SPDX-License-Identifier: Apache-2.0
// File: src/algo/reduce_chain.cc
// Pipelined chain Reduce towards the root along the ring (RingView): the rank farthest from
// the root sends its input, every rank in between folds its own input into what arrives and
// passes it on, chunk by chunk, and the root folds the last step into recvbuf.
#include <algorithm>
#include <cstring>
#include <memory>

#include "algo/algo.h"
#include "common/params.h"

namespace chorus::algo {

Task reduce_chain(OpContext& ctx, Args a) {
  const int n = ctx.nranks();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  if (n == 1) {
    if (a.out != a.in) std::memcpy(a.out, a.in, bytes);
    co_return Status();
  }
  const RingView ring(ctx);
  const int pos = mod(ring.pos() - ring.pos_of(a.root), n);  // hops from the root
  const int from = pos < n - 1 ? ring.next() : -1;  // farther from the root
  const int to = pos > 0 ? ring.prev() : -1;        // nearer the root

  size_t chunk = static_cast<size_t>(params::kChunkBytes.get());
  chunk = std::max(a.elem_size, chunk / a.elem_size * a.elem_size);
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto chunk_len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };

  // Where this rank's partial result goes: recvbuf on the root, scratch in between; the last
  // rank of the chain forwards its input as is.
  char* acc = pos == 0 ? a.out : (from >= 0 ? static_cast<char*>(ctx.scratch(8 + a.channel, bytes)) : nullptr);
  const char* outgoing = from >= 0 ? acc : a.in;

  ChunkRequests<RecvRequest> recvs(from >= 0 ? nchunks : 0);
  ChunkRequests<SendRequest> sends(to >= 0 ? nchunks : 0);
  if (from >= 0) {
    for (size_t c = 0; c < nchunks; ++c) {
      ctx.recv_reduce(recvs[c], from, a.channel, acc + c * chunk, a.in + c * chunk, chunk_len(c),
                      a.reduce, a.elem_size);
    }
  }
  for (size_t c = 0; c < nchunks; ++c) {
    if (from >= 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[c]));
    if (to >= 0) ctx.send(sends[c], to, a.channel, outgoing + c * chunk, chunk_len(c));
  }
  if (to >= 0)
    for (size_t c = 0; c < nchunks; ++c) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[c]));
  co_return Status();
}

}  // namespace chorus::algo
