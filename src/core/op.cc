// SPDX-License-Identifier: Apache-2.0
#include "core/op.h"

#include <fmt/format.h>

#include "core/comm.h"

namespace chorus {

std::string Op::describe() const {
  if (is_host_fn()) return "host function";
  if (is_internal()) return internal_;
  if (p2p_batch_) {
    size_t sends = 0;
    for (const auto& c : calls_) sends += c.kind == CollKind::kSend ? 1 : 0;
    return fmt::format("group of {} sends and {} receives", sends, calls_.size() - sends);
  }
  return describe_tag(calls_.front().tag);
}

std::string Op::describe_detailed() const {
  if (!p2p_batch_) return describe();
  std::string text = describe() + ":";
  size_t shown = 0;
  for (const auto& c : calls_) {
    if (++shown > 8) {
      text += fmt::format(" ... ({} more)", calls_.size() - 8);
      break;
    }
    bool send = c.kind == CollKind::kSend;
    text += fmt::format(" {} {} #{} ({} x {})", send ? "send to" : "receive from",
                        send ? c.root : c.tag.root, c.tag.seq, c.count, datatype_name(c.dtype));
  }
  return text;
}

size_t Op::bytes() const {
  size_t total = 0;
  for (const auto& c : calls_) total += c.count * datatype_size(c.dtype);
  return total;
}

bool Op::deps_done() const {
  for (const auto& d : deps_)
    if (!d->done()) return false;
  return true;
}

void Op::complete(Status status) {
  status_ = std::move(status);
  done_.store(1, std::memory_order_release);
}

OpContext::OpContext(Comm& comm, const MsgTag& tag)
    : comm_(comm),
      rank_(comm.rank()),
      nranks_(comm.nranks()),
      channels_(comm.channels()),
      tag_(tag) {}

void OpContext::post(Request& req, int peer, size_t bytes, const MsgTag& tag) {
  req.peer = peer;
  req.bytes = bytes;
  req.tag = tag;
}

void OpContext::send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes) {
  send_tagged(req, peer, channel, buf, bytes, tag_);
}

void OpContext::recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes) {
  recv_tagged(req, peer, channel, dst, bytes, tag_);
}

void OpContext::send_tagged(SendRequest& req, int peer, int channel, const void* buf,
                            size_t bytes, const MsgTag& tag) {
  post(req, peer, bytes, tag);
  req.buf = buf;
  Connection* conn = comm_.conn(peer, channel);
  conn->post_send(&req);
  comm_.activate(conn);
}

void OpContext::recv_tagged(RecvRequest& req, int peer, int channel, void* dst, size_t bytes,
                            const MsgTag& tag) {
  post(req, peer, bytes, tag);
  req.dst = dst;
  req.reduce = nullptr;
  Connection* conn = comm_.conn(peer, channel);
  conn->post_recv(&req);
  comm_.activate(conn);
}

void OpContext::recv_reduce(RecvRequest& req, int peer, int channel, void* dst, const void* src,
                            size_t bytes, kernels::ReduceFn fn, size_t elem_size) {
  post(req, peer, bytes, tag_);
  req.dst = dst;
  req.src = src;
  req.reduce = fn;
  req.elem_size = elem_size;
  Connection* conn = comm_.conn(peer, channel);
  conn->post_recv(&req);
  comm_.activate(conn);
}

Status OpContext::check(const Request& req) const {
  if (!req.failed()) return Status();
  for (int ch = 0; ch < channels_; ++ch) {
    Connection* conn = comm_.conn(req.peer, ch);
    if (conn != nullptr && !conn->error().ok()) return conn->error();
  }
  if (comm_.aborting()) return remote_error("{} was aborted", comm_.describe());
  return remote_error("a transfer with {} failed", comm_.peer(req.peer).describe());
}

void* OpContext::scratch(int slot, size_t bytes) { return comm_.scratch(slot, bytes); }

}  // namespace chorus
