// SPDX-License-Identifier: Apache-2.0
// File: src/algo/broadcast_chain.cc
// Pipelined chain Broadcast from the root around the ring (RingView: each host's ranks
// adjacent, so the chain crosses between hosts once per host), in chunks of CHORUS_CHUNK_BYTES,
// so a rank forwards chunk c while chunk c+1 is still arriving. Time ~ size/bandwidth +
// (n-1) chunk latencies.
#include <algorithm>
#include <memory>

#include "algo/algo.h"
#include "common/params.h"

namespace chorus::algo {

Task broadcast_chain(OpContext& ctx, Args a) {
  const int n = ctx.nranks();
  const size_t bytes = a.count * a.elem_size;
  if (bytes == 0) co_return Status();
  const RingView ring(ctx);
  const int pos = mod(ring.pos() - ring.pos_of(a.root), n);  // hops from the root
  const int from = pos > 0 ? ring.prev() : -1;
  const int to = pos < n - 1 ? ring.next() : -1;
  if (pos == 0) copy_result_if_needed(a.out, a.in, bytes);
  if (n == 1) co_return Status();

  size_t chunk = static_cast<size_t>(params::kChunkBytes.get());
  chunk = std::max(a.elem_size, chunk / a.elem_size * a.elem_size);
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  auto chunk_len = [&](size_t c) { return std::min(chunk, bytes - c * chunk); };
  const char* src = pos == 0 ? a.in : a.out;

  ChunkRequests<RecvRequest> recvs(from >= 0 ? nchunks : 0);
  ChunkRequests<SendRequest> sends(to >= 0 ? nchunks : 0);
  if (from >= 0)
    for (size_t c = 0; c < nchunks; ++c) ctx.recv(recvs[c], from, a.channel, a.out + c * chunk, chunk_len(c));
  for (size_t c = 0; c < nchunks; ++c) {
    if (from >= 0) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[c]));
    if (to >= 0) ctx.send(sends[c], to, a.channel, src + c * chunk, chunk_len(c));
  }
  if (to >= 0)
    for (size_t c = 0; c < nchunks; ++c) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[c]));
  co_return Status();
}

}  // namespace chorus::algo
