// SPDX-License-Identifier: Apache-2.0
// File: src/algo/send_recv.cc
// The sends and receives of one group on one comm, posted together so that any order of
// matching calls completes. Between a pair of ranks they match in issue order (FIFO per
// connection); a rank sending to itself is served by a copy, matched in order with its own
// receives.
#include <cstring>
#include <memory>

#include "algo/algo.h"

namespace chorus::algo {

Task send_recv_batch(OpContext& ctx, const std::vector<CollCall>& calls,
                     const std::function<void(size_t)>& watch) {
  const int r = ctx.rank();
  RequestArray<SendRequest> sends(calls.size());
  RequestArray<RecvRequest> recvs(calls.size());
  std::vector<const CollCall*> self_sends, self_recvs;
  for (size_t i = 0; i < calls.size(); ++i) {
    const CollCall& c = calls[i];
    size_t bytes = c.count * datatype_size(c.dtype);
    if (c.root == r) {
      (c.kind == CollKind::kSend ? self_sends : self_recvs).push_back(&c);
    } else if (c.kind == CollKind::kSend) {
      ctx.send_tagged(sends[i], c.root, 0, c.sendbuf, bytes, c.tag);
    } else {
      ctx.recv_tagged(recvs[i], c.root, 0, c.recvbuf, bytes, c.tag);
    }
  }
  if (self_sends.size() != self_recvs.size()) {
    co_return invalid_usage("rank {} posted {} sends to itself but {} receives from itself", r,
                            self_sends.size(), self_recvs.size());
  }
  for (size_t i = 0; i < self_sends.size(); ++i) {
    const CollCall& s = *self_sends[i];
    const CollCall& d = *self_recvs[i];
    if (s.count != d.count || s.dtype != d.dtype) {
      co_return invalid_usage("rank {} sends {} x {} to itself but receives {} x {}", r, s.count,
                              datatype_name(s.dtype), d.count, datatype_name(d.dtype));
    }
    if (s.count > 0 && d.recvbuf != s.sendbuf)
      std::memmove(d.recvbuf, s.sendbuf, s.count * datatype_size(s.dtype));
  }
  // Watched (Op::recv_watch): the receives first, in posting order, each reported.
  if (watch) {
    size_t arrived = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].root == r || calls[i].kind != CollKind::kRecv) continue;
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[i]));
      watch(++arrived);
    }
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].root == r || (watch && calls[i].kind == CollKind::kRecv)) continue;
    const Request& req = calls[i].kind == CollKind::kSend
                             ? static_cast<const Request&>(sends[i])
                             : static_cast<const Request&>(recvs[i]);
    CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(req));
  }
  co_return Status();
}

}  // namespace chorus::algo
