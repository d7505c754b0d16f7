// SPDX-License-Identifier: Apache-2.0
#include "transports/direct/direct_connection.h"

#include <cstring>

#include "common/process.h"
#include "kernels/reduce/reduce.h"
#include "transports/protocol.h"

namespace chorus::direct {

DirectConnection::DirectConnection(int my_rank, int peer, int channel, std::shared_ptr<Inbox> out,
                                   std::shared_ptr<Inbox> in)
    : Connection(peer, channel), my_rank_(my_rank), out_(std::move(out)), in_(std::move(in)) {
  if (channel == 0) {
    box_ = std::make_unique<SmallBox>(out_->box_memory->bytes, in_->box_memory->bytes,
                                      ProcessContext::get().doorbell(), my_rank, peer);
  }
}

DirectConnection::~DirectConnection() {
  // Whatever the peer still queued for us fails; so do our sends it has not consumed (their
  // buffers may go away with us).
  Status why = remote_error("rank {} has left the communicator", my_rank_);
  for (Inbox* box : {in_.get(), out_.get()}) {
    std::lock_guard<std::mutex> lock(box->mutex);
    if (!box->closed) close_locked(box, why);
  }
  if (box_) box_->close();
  ProcessContext::get().ring_local();
}

void DirectConnection::close_locked(Inbox* box, const Status& why) {
  box->closed = true;
  box->closed_by = my_rank_;
  box->error = why;
  for (SendRequest* s : box->sends) s->fail();
  box->finished += box->sends.size();
  box->sends.clear();
}

void DirectConnection::post_send(SendRequest* req) {
  {
    std::lock_guard<std::mutex> lock(out_->mutex);
    if (!out_->closed) {
      out_->sends.push_back(req);
      ++posted_;
      ProcessContext::get().ring_local();
      return;
    }
    set_error(out_->error);
  }
  req->fail();
}

void DirectConnection::post_recv(RecvRequest* req) {
  if (!error().ok()) {
    req->fail();
    return;
  }
  recvs_.push_back(req);
  if (Status st = check_reducing_receive(*req, peer()); !st.ok()) fail_all(st);
}

bool DirectConnection::consume_one() {
  std::lock_guard<std::mutex> lock(in_->mutex);
  if (in_->closed) {
    fail_all(in_->error);
    return true;
  }
  if (in_->sends.empty()) return false;
  SendRequest* s = in_->sends.front();
  RecvRequest* r = recvs_.front();
  if (Status why = accept_incoming(r, s->tag, s->bytes, peer(), my_rank_); !why.ok()) {
    // Both sides learn why: the sender through the closed inbox.
    close_locked(in_.get(), why);
    fail_all(why);
    ProcessContext::get().ring_local();
    return true;
  }
  if (r->reduce != nullptr) {
    if (r->bytes > 0) r->reduce(r->dst, r->src, s->buf, r->bytes / r->elem_size);
  } else if (r->bytes > 0 && r->dst != s->buf) {
    kernels::copy_to_output(r->dst, s->buf, r->bytes);
  }
  in_->sends.pop_front();
  ++in_->finished;
  s->bytes_done.store(s->bytes, std::memory_order_relaxed);
  r->bytes_done.store(r->bytes, std::memory_order_relaxed);
  s->complete();
  r->complete();
  recvs_.pop_front();
  ProcessContext::get().ring_local();  // the sender may be asleep waiting for s
  return true;
}

bool DirectConnection::peek(MsgTag* tag, uint64_t* bytes) {
  if (!error().ok() || !recvs_.empty() || !peer_closed().ok()) return false;
  std::lock_guard<std::mutex> lock(in_->mutex);
  if (in_->closed) {
    // The peer left between messages: what it sent on its other channels may still wait there
    // (transport.h, peer_closed()). A receive posted here fails on the closed inbox.
    if (in_->closed_by == peer()) {
      set_peer_closed(in_->error);
    } else {
      fail_all(in_->error);
    }
    return false;
  }
  if (in_->sends.empty()) return false;
  *tag = in_->sends.front()->tag;
  *bytes = in_->sends.front()->bytes;
  return true;
}

bool DirectConnection::progress() {
  bool moved = false;
  while (!recvs_.empty() && consume_one()) moved = true;
  // Our sends are completed (or failed) by the peer; we never touch them again after posting,
  // since their owner may free them as soon as they complete. Only learn why a send failed.
  if (error().ok() && posted_ > 0) {
    std::lock_guard<std::mutex> lock(out_->mutex);
    if (out_->closed && !out_->error.ok()) {
      set_error(out_->error);
      moved = true;
    }
  }
  return moved;
}

bool DirectConnection::idle() const {
  if (!recvs_.empty()) return false;
  std::lock_guard<std::mutex> lock(out_->mutex);
  return out_->finished == posted_;
}

void DirectConnection::fail_all(Status status) {
  set_error(std::move(status));
  for (RecvRequest* r : recvs_) r->fail();
  recvs_.clear();
  // Our own queued sends are failed by whoever closes; the peer's were consumed or failed.
}

}  // namespace chorus::direct
