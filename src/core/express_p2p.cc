// SPDX-License-Identifier: Apache-2.0
// File: src/core/express_p2p.cc
// The express path of small blocking sends and receives (Comm::run_p2p_express): a lone
// ncclSend or ncclRecv, or a small group of them, on an idle blocking communicator and the NULL
// stream, posts its messages from the caller's frame and progresses the connections until they
// are done: no operation object, coroutine frames, registration pins or queue. The messages
// are tagged as the send/receive batch of a queued operation tags them (Comm::admit, and
// algo::send_recv_batch's channel 0), so a peer on either path matches them. The wait is the
// bounded wait of an operation (Comm::check_wait): abort, a dead same-host peer, a remote path
// that stopped answering, and CHORUS_TIMEOUT_MS without progress, each naming the peer waited
// for; a failure poisons the communicator as a failed operation does.
#include <fmt/format.h>

#include <array>
#include <span>

#include "common/clock.h"
#include "common/params.h"
#include "core/comm.h"
#include "core/engine.h"

namespace chorus {

bool Comm::run_p2p_express(std::span<const CollCall* const> calls, Status* result) {
  if (calls.size() > kExpressP2pCalls || params::kExpress.get() == 0) return false;
  size_t nonempty = 0;
  for (const CollCall* c : calls) {
    // A rank's messages to itself are the batch's copy; large messages take the queued path,
    // whose registration pins give transports their zero-copy keys.
    if (c->root == rank() || c->compressor ||
        c->count * datatype_size(c->dtype) > kExpressP2pBytes)
      return false;
    nonempty += c->count != 0;
  }
  if (nonempty == 0) {  // NCCL skips empty sends and receives
    *result = Status();
    return true;
  }
  std::unique_lock<std::mutex> drive(drive_mutex_, std::try_to_lock);
  if (!drive.owns_lock() || current_ != nullptr ||
      pending_ops_.load(std::memory_order_acquire) != 0)
    return false;

  // What admit() does for a queued operation.
  if (Status unusable = check_usable(); !unusable.ok()) {
    *result = std::move(unusable);
    return true;
  }
  const size_t n = nonempty;
  std::array<const CollCall*, kExpressP2pCalls> call{};
  std::array<MsgTag, kExpressP2pCalls> tag{};
  for (size_t i = 0, k = 0; i < calls.size(); ++i) {
    const CollCall& c = *calls[i];
    if (c.count == 0) continue;
    // Between a pair, the k-th send matches the k-th receive; the tag names the sender.
    const bool send = c.kind == CollKind::kSend;
    MsgTag& t = tag[k];
    t.coll = static_cast<uint8_t>(CollKind::kSendRecv);
    t.dtype = static_cast<uint8_t>(c.dtype);
    t.redop = 0;
    t.count = c.count;
    t.seq = send ? send_seq_[c.root]++ : recv_seq_[c.root]++;
    t.root = send ? rank() : c.root;
    call[k++] = &c;
  }
  auto summarize = [&](OpSummary* what) {  // as Op::summarize for a send/receive batch
    what->kind = OpSummary::Kind::kP2p;
    what->ncalls = n;
    what->nsends = 0;
    what->bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool send = call[i]->kind == CollKind::kSend;
      what->nsends += send ? 1 : 0;
      what->bytes += call[i]->count * datatype_size(call[i]->dtype);
      if (i < what->calls.size()) what->calls[i] = {tag[i], call[i]->root, send};
    }
  };
  auto describe_calls = [&] {
    OpSummary what;
    summarize(&what);
    return what.describe(false);
  };

  // Post every message, then wait for all: any order of matching calls on the peers completes.
  OpContext ctx(*this, tag[0]);
  RequestArray<SendRequest, kExpressP2pCalls> sends(n);
  RequestArray<RecvRequest, kExpressP2pCalls> recvs(n);
  auto request = [&](size_t i) -> Request& {
    return call[i]->kind == CollKind::kSend ? static_cast<Request&>(sends[i])
                                            : static_cast<Request&>(recvs[i]);
  };
  for (size_t i = 0; i < n; ++i) {
    const CollCall& c = *call[i];
    const size_t bytes = c.count * datatype_size(c.dtype);
    if (c.kind == CollKind::kSend) {
      ctx.send_tagged(sends[i], c.root, 0, c.sendbuf, bytes, tag[i]);
    } else {
      ctx.recv_tagged(recvs[i], c.root, 0, c.recvbuf, bytes, tag[i]);
    }
  }
  // The first request not yet done (n: all are); the earlier ones are not looked at again. A
  // failed one ends the wait with its connection's error.
  Status status;
  size_t pending = 0;
  auto first_pending = [&] {
    for (; pending < n && request(pending).done(); ++pending) {
      if (request(pending).failed()) {
        status = ctx.check(request(pending));
        return n;
      }
    }
    return pending;
  };
  auto waiting = [&] {
    std::string text;
    for (size_t i = pending; i < n; ++i) {
      const Request& r = request(i);
      if (!r.done()) text += waiting_for(r);
    }
    return text;
  };
  ExpressWait wait;
  Idler idler;
  while (first_pending() < n && status.ok()) {
    if (progress_connections()) {
      wait.since_ns = 0;
      idler.reset();
      continue;
    }
    status = express_stalled(
        &wait,
        [&](std::vector<int>* peers) {
          for (size_t i = pending; i < n; ++i)
            if (!request(i).done()) peers->push_back(request(i).peer);
        },
        describe_calls, waiting, summarize);
    if (!status.ok()) break;
    idler.idle([&] { return progress_connections() || first_pending() == n; },
               [&](std::vector<pollfd>* fds) { return collect_poll_fds(fds); });
  }

  // Before the requests in this frame go.
  end_express(std::move(status), describe_calls, wait, summarize, result);
  return true;
}

}  // namespace chorus
