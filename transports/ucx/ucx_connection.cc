// SPDX-License-Identifier: Apache-2.0
// File: transports/ucx/ucx_connection.cc
// Tagged message IO on one UCP endpoint: a header message per request (carrying small payloads
// inline), large payloads as chunk messages received straight into the destination, or through
// a double bounce buffer for reducing receives. No UCX callbacks: requests are polled, so
// ucp_worker_progress() never re-enters a connection.
#include "transports/ucx/ucx_connection.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace chorus::ucx {

namespace {

constexpr int kFailDrainMs = 500;   // fail_all(): how long UCX may keep the caller's buffers
constexpr int kCloseDrainMs = 200;  // destructor: the same, before forcing the endpoint closed

bool in_progress(void* req) { return ucp_request_check_status(req) == UCS_INPROGRESS; }

// The memory handle a request's buffer goes with. Core sets Request::key only to a key of this
// connection's transport, i.e. one made by UcxInstance's factory: a MemoryKey.
ucp_mem_h memh_of(const Request& req) {
  return req.key != nullptr ? static_cast<const MemoryKey*>(req.key)->memh() : nullptr;
}

void set_memh(ucp_request_param_t* param, ucp_mem_h memh) {
  if (memh == nullptr) return;
  param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
  param->memh = memh;
}

}  // namespace

UcxConnection::UcxConnection(const ConnectionSetup& setup)
    : Connection(setup.peer->rank, setup.channel),
      worker_(setup.worker),
      peer_(setup.peer),
      my_rank_(setup.my_rank),
      chunk_bytes_(setup.chunk_bytes),
      out_header_tag_(make_tag(setup.comm_hash, Kind::kHeader, setup.channel, setup.my_rank)),
      out_payload_tag_(make_tag(setup.comm_hash, Kind::kPayload, setup.channel, setup.my_rank)),
      out_farewell_tag_(make_tag(setup.comm_hash, Kind::kFarewell, setup.channel, setup.my_rank)),
      in_header_tag_(make_tag(setup.comm_hash, Kind::kHeader, setup.channel, setup.peer->rank)),
      in_payload_tag_(make_tag(setup.comm_hash, Kind::kPayload, setup.channel, setup.peer->rank)),
      in_farewell_tag_(
          make_tag(setup.comm_hash, Kind::kFarewell, setup.channel, setup.peer->rank)),
      rx_header_buf_(kMaxHeaderMsgBytes),
      fw_buf_(kHeaderBytes + kMaxFarewellBytes) {
  auto fw = post_ucx_recv(fw_buf_.data(), fw_buf_.size(), in_farewell_tag_);
  if (fw.ok()) {
    fw_req_ = fw.value();
  } else {
    fail_all(fw.take_status(), false);
  }
}

UcxConnection::~UcxConnection() {
  // A peer still waiting for us learns at once that we are gone (else only when our worker is
  // destroyed, which waits for all its peers' acknowledgements).
  if (!broken_ && !farewell_sent_) send_farewell(Code::kOk, "");
  cancel_recvs();
  release_sends();
  reap();
  if (aux_.empty()) return;
  // Sends still in flight (or a receive UCX already matched): give them a moment, then cut the
  // endpoint so that UCX completes them with an error and lets go of the buffers.
  bool done = !peer_->failed() && drain(kCloseDrainMs);
  // An endpoint without failure handling cannot be forced; its worker's reaper bounds it.
  if (!done && peer_->watched) {
    worker_->force_close(peer_.get(), fmt::format("was cut off by rank {}, which closed ucx "
                                                  "channel {} with operations in flight",
                                                  my_rank_, channel()));
    done = drain(kFailDrainMs);
  }
  if (done) return;
  CHORUS_WARN(kNet, "ucx: rank {}: {} UCX operation(s) with {} on channel {} did not finish; "
              "their buffers (and memory handles) are kept until the worker goes",
              my_rank_, aux_.size(), peer_->label, channel());
  worker_->abandon_requests();
  for (Aux& a : aux_) {
    ucp_request_free(a.req);  // released by UCX once it completes
    worker_->bury(std::move(a.buf));
  }
  aux_.clear();
  worker_->bury(std::move(rx_header_buf_));
  worker_->bury(std::move(fw_buf_));
  worker_->bury(std::move(bounce_));
}

// ---- Posting --------------------------------------------------------------------------------

Status UcxConnection::send_msg(const void* buf, size_t bytes, uint64_t tag, SendOp* op,
                               size_t end, ucp_mem_h memh) {
  if (peer_->ep == nullptr || peer_->failed()) return peer_error();
  ucp_request_param_t param{};
  set_memh(&param, memh);
  ucs_status_ptr_t r = ucp_tag_send_nbx(peer_->ep, buf, bytes, tag, &param);
  if (UCS_PTR_IS_ERR(r)) {
    if (peer_->failed()) return peer_error();
    return remote_error("ucx: rank {} could not send {} bytes to {} on ucx channel {}: {}",
                        my_rank_, bytes, peer_->label, channel(),
                        ucs_status_string(UCS_PTR_STATUS(r)));
  }
  if (r != nullptr) op->pending.emplace_back(r, end);
  if (memh != nullptr) count_memh_message(true);
  return ok_status();
}

Result<void*> UcxConnection::post_ucx_recv(void* buf, size_t bytes, uint64_t tag,
                                           ucp_mem_h memh) {
  ucp_request_param_t param{};
  // Always a request to test: in UCX 1.13 an immediate completion does not report the length.
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  set_memh(&param, memh);
  ucs_status_ptr_t r =
      ucp_tag_recv_nbx(worker_->handle(), buf, bytes, tag, ~ucp_tag_t{0}, &param);
  if (UCS_PTR_IS_ERR(r) || r == nullptr) {
    return make_status(Code::kSystemError, "ucx: rank {} could not post a receive from {}: {}",
                       my_rank_, peer_->label, ucs_status_string(UCS_PTR_STATUS(r)));
  }
  if (memh != nullptr) count_memh_message(false);
  return static_cast<void*>(r);
}

void UcxConnection::post_send(SendRequest* req) {
  if (broken_) {
    req->fail();
    return;
  }
  std::unique_ptr<SendOp> op;
  if (!spare_.empty()) {
    op = std::move(spare_.back());
    spare_.pop_back();
  } else {
    op = std::make_unique<SendOp>();
  }
  op->req = req;
  op->pending.clear();
  op->next = 0;
  WireHeader h{};
  h.magic = kMsgMagic;
  h.tag = req->tag;
  h.bytes = req->bytes;
  const bool inline_payload = req->bytes <= kMaxInlineBytes;
  h.chunk_bytes = inline_payload ? 0 : chunk_bytes_;
  op->msg.resize(kHeaderBytes + (inline_payload ? req->bytes : 0));
  std::memcpy(op->msg.data(), &h, kHeaderBytes);
  if (inline_payload && req->bytes > 0)
    std::memcpy(op->msg.data() + kHeaderBytes, req->buf, req->bytes);
  SendOp* raw = op.get();
  sends_.push_back(std::move(op));
  Status st = send_msg(raw->msg.data(), raw->msg.size(), out_header_tag_, raw, 0);
  const auto* payload = static_cast<const uint8_t*>(req->buf);
  const ucp_mem_h memh = inline_payload ? nullptr : memh_of(*req);
  for (size_t off = 0; st.ok() && !inline_payload && off < req->bytes; off += chunk_bytes_) {
    size_t n = std::min(chunk_bytes_, req->bytes - off);
    st = send_msg(payload + off, n, out_payload_tag_, raw, off + n, memh);
  }
  if (!st.ok()) fail_all(std::move(st), false);
}

void UcxConnection::post_recv(RecvRequest* req) {
  if (broken_) {
    req->fail();
    return;
  }
  recvs_.push(req);
  if (!peer_closed().ok()) {
    fail_all(peer_closed(), false);
    return;
  }
  Status st = check_reducing_receive(*req, peer());
  if (!st.ok()) fail_all(std::move(st), true);
}

int UcxConnection::poll_fd(short* events) const {
  if (broken_) return -1;
  return worker_->poll_fd(events);
}

bool UcxConnection::progress() {
  if (broken_) {
    reap();
    return false;
  }
  bool moved = worker_->progress();
  moved |= progress_sends();
  if (!broken_) moved |= progress_recvs();
  // The peer's farewell and its endpoint's failure are looked at after the data that arrived
  // before them, and only while something waits here: a peer that sent its last message and
  // went away is no failure while that message waits to be taken (see peek()).
  if (!broken_ && !idle() && check_gone()) return true;
  return moved;
}

bool UcxConnection::check_gone(bool peeking) {
  if (check_farewell()) {
    if (fw_code_ == Code::kOk) {
      Status closed = remote_error("{} closed its end of ucx channel {} (its communicator went "
                                   "away) {}", peer_->label, channel(), situation());
      if (peeking && idle()) {
        // Between messages: not a failure by itself (transport.h, peer_closed()).
        set_peer_closed(std::move(closed));
        return false;
      }
      fail_all(std::move(closed), false);
      return true;
    }
    fail_all(Status(farewell_code(static_cast<uint32_t>(fw_code_)),
                    fmt::format("{} gave up {}: {}", peer_->label, situation(), fw_text_)),
             false);
    return true;
  }
  if (peer_->failed()) {
    fail_all(peer_error(), false);
    return true;
  }
  return false;
}

// ---- Sends ----------------------------------------------------------------------------------

bool UcxConnection::progress_sends() {
  bool moved = false;
  while (!sends_.empty()) {
    SendOp& op = *sends_.front();
    while (op.next < op.pending.size()) {
      auto [r, end] = op.pending[op.next];
      ucs_status_t st = ucp_request_check_status(r);
      if (st == UCS_INPROGRESS) break;
      ucp_request_free(r);
      ++op.next;
      moved = true;
      if (st != UCS_OK) {
        fail_all(peer_->failed() ? peer_error()
                                 : remote_error("ucx: sending {} to {} on ucx channel {} failed: {}",
                                                describe_request(op.req), peer_->label, channel(),
                                                ucs_status_string(st)),
                 false);
        return true;
      }
      op.req->bytes_done.store(end, std::memory_order_relaxed);
    }
    if (op.next < op.pending.size()) break;
    SendRequest* req = op.req;
    req->bytes_done.store(req->bytes, std::memory_order_relaxed);
    spare_.push_back(std::move(sends_.front()));
    sends_.pop_front();
    moved = true;
    req->complete();  // the caller may free it now
  }
  return moved;
}

// ---- Receives -------------------------------------------------------------------------------

bool UcxConnection::poll_header(const RecvRequest* req, bool* moved) {
  if (rx_phase_ == RxPhase::kArrived) return true;
  if (rx_phase_ == RxPhase::kIdle) {
    auto r = post_ucx_recv(rx_header_buf_.data(), rx_header_buf_.size(), in_header_tag_);
    if (!r.ok()) {
      fail_all(r.take_status(), true);
      *moved = true;
      return false;
    }
    rx_header_req_ = r.value();
    rx_phase_ = RxPhase::kHeader;
  }
  ucp_tag_recv_info_t info{};
  ucs_status_t st = ucp_tag_recv_request_test(rx_header_req_, &info);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(rx_header_req_);
  rx_header_req_ = nullptr;
  rx_phase_ = RxPhase::kIdle;
  *moved = true;
  if (st != UCS_OK) {
    fail_all(st == UCS_ERR_MESSAGE_TRUNCATED
                 ? corrupt(req, "a header message over 8 KiB")
                 : peer_->failed() ? peer_error()
                                   : corrupt(req, fmt::format("a header that could not be "
                                                              "received ({})",
                                                              ucs_status_string(st))),
             true);
    return false;
  }
  if (info.length < kHeaderBytes) {
    fail_all(corrupt(req, fmt::format("a {}-byte header message", info.length)), true);
    return false;
  }
  std::memcpy(&rx_header_, rx_header_buf_.data(), kHeaderBytes);
  if (rx_header_.magic != kMsgMagic) {
    fail_all(corrupt(req, fmt::format("a message header with magic {:#010x}", rx_header_.magic)),
             true);
    return false;
  }
  rx_header_len_ = info.length;
  rx_phase_ = RxPhase::kArrived;
  return true;
}

bool UcxConnection::peek(MsgTag* tag, uint64_t* bytes) {
  if (broken_ || !recvs_.empty() || !peer_closed().ok()) return false;
  bool moved = false;
  worker_->progress();
  if (!poll_header(nullptr, &moved)) {
    // Nothing arrived: a peer that has gone will send nothing more.
    if (!broken_) check_gone(/*peeking=*/true);
    return false;
  }
  *tag = rx_header_.tag;
  *bytes = rx_header_.bytes;
  return true;
}

bool UcxConnection::progress_recvs() {
  bool moved = false;
  while (!recvs_.empty() && !broken_) {
    RecvRequest* req = recvs_.front();
    if (rx_phase_ == RxPhase::kIdle || rx_phase_ == RxPhase::kHeader ||
        rx_phase_ == RxPhase::kArrived) {
      if (!poll_header(req, &moved)) return moved || broken_;
      rx_phase_ = RxPhase::kIdle;
      if (!on_header(req, rx_header_len_)) return true;
      continue;  // an inline message completed it, or its payload is next
    }
    if (!progress_payload(req, &moved)) return moved;
    finish_recv(req);
    moved = true;
  }
  return moved;
}

bool UcxConnection::on_header(RecvRequest* req, size_t length) {
  const WireHeader& h = rx_header_;  // framing checked by poll_header
  if (Status st = accept_incoming(req, h.tag, h.bytes, peer(), my_rank_); !st.ok()) {
    fail_all(std::move(st), true);
    return false;
  }
  if (h.chunk_bytes == 0) {
    if (length != kHeaderBytes + h.bytes) {
      fail_all(corrupt(req, fmt::format("an inline message of {} bytes for a {}-byte payload",
                                        length, h.bytes)),
               true);
      return false;
    }
    const uint8_t* payload = rx_header_buf_.data() + kHeaderBytes;
    if (req->bytes > 0) {
      if (req->reduce != nullptr) {
        const void* src = req->src != nullptr ? req->src : req->dst;
        req->reduce(req->dst, src, payload, req->bytes / req->elem_size);
      } else {
        std::memcpy(req->dst, payload, req->bytes);
      }
    }
    finish_recv(req);
    return true;
  }
  if (length != kHeaderBytes || h.chunk_bytes < kMinChunkBytes || h.chunk_bytes > kMaxChunkBytes ||
      h.chunk_bytes % kMinChunkBytes != 0 ||
      (req->reduce != nullptr && h.chunk_bytes % req->elem_size != 0)) {
    fail_all(corrupt(req, fmt::format("a header of {} bytes announcing {}-byte chunks", length,
                                      h.chunk_bytes)),
             true);
    return false;
  }
  rx_chunk_ = h.chunk_bytes;
  rx_chunks_ = (req->bytes + rx_chunk_ - 1) / rx_chunk_;
  rx_posted_ = 0;
  rx_done_ = 0;
  if (req->reduce != nullptr) {
    size_t half = std::min(rx_chunk_, req->bytes);
    if (bounce_.size() < 2 * half) bounce_.resize(2 * half);
  }
  rx_phase_ = RxPhase::kPayload;
  return true;
}

bool UcxConnection::progress_payload(RecvRequest* req, bool* moved) {
  const bool reducing = req->reduce != nullptr;
  const size_t window = reducing ? 2 : kWindow;
  // Chunks of a reducing receive land in our bounce buffer, which the key does not cover.
  const ucp_mem_h memh = reducing ? nullptr : memh_of(*req);
  const size_t half = std::min(rx_chunk_, req->bytes);
  auto* dst = static_cast<uint8_t*>(req->dst);
  const auto* src = static_cast<const uint8_t*>(req->src != nullptr ? req->src : req->dst);
  for (;;) {
    while (rx_posted_ < rx_chunks_ && rx_posted_ - rx_done_ < window) {
      size_t off = rx_posted_ * rx_chunk_;
      size_t n = std::min(rx_chunk_, req->bytes - off);
      uint8_t* into = reducing ? bounce_.data() + (rx_posted_ % 2) * half : dst + off;
      auto r = post_ucx_recv(into, n, in_payload_tag_, memh);
      if (!r.ok()) {
        fail_all(r.take_status(), true);
        return false;
      }
      rx_chunk_reqs_[rx_posted_ % kWindow] = r.value();
      ++rx_posted_;
    }
    if (rx_done_ == rx_chunks_) {
      rx_phase_ = RxPhase::kIdle;
      return true;
    }
    void*& r = rx_chunk_reqs_[rx_done_ % kWindow];
    ucp_tag_recv_info_t info{};
    ucs_status_t st = ucp_tag_recv_request_test(r, &info);
    if (st == UCS_INPROGRESS) return false;
    ucp_request_free(r);
    r = nullptr;
    *moved = true;
    size_t off = rx_done_ * rx_chunk_;
    size_t n = std::min(rx_chunk_, req->bytes - off);
    ++rx_done_;
    if (st != UCS_OK || info.length != n) {
      Status why = st == UCS_OK ? corrupt(req, fmt::format("a payload chunk of {} bytes at "
                                                           "offset {} instead of {}",
                                                           info.length, off, n))
                   : st == UCS_ERR_MESSAGE_TRUNCATED
                       ? corrupt(req, fmt::format("a payload chunk of more than {} bytes at "
                                                  "offset {}",
                                                  n, off))
                   : peer_->failed() ? peer_error()
                                     : corrupt(req, fmt::format("a payload chunk that could not "
                                                                "be received ({})",
                                                                ucs_status_string(st)));
      fail_all(std::move(why), true);
      return false;
    }
    if (reducing) {
      const uint8_t* incoming = bounce_.data() + ((rx_done_ - 1) % 2) * half;
      req->reduce(dst + off, src + off, incoming, n / req->elem_size);
    }
    req->bytes_done.store(off + n, std::memory_order_relaxed);
  }
}

void UcxConnection::finish_recv(RecvRequest* req) {
  req->bytes_done.store(req->bytes, std::memory_order_relaxed);
  recvs_.pop();
  rx_phase_ = RxPhase::kIdle;
  req->complete();  // the caller may free it now
}

// ---- Farewell and errors --------------------------------------------------------------------

void UcxConnection::farewell(const Status& why) {
  if (broken_ || why.ok()) return;
  send_farewell(why.code(), why.message());
}

void UcxConnection::send_farewell(Code code, const std::string& reason) {
  if (farewell_sent_ || peer_->ep == nullptr || peer_->failed()) return;
  farewell_sent_ = true;
  std::string text = reason.substr(0, kMaxFarewellBytes);
  WireHeader h{};
  h.magic = kFarewellMagic;
  h.code = static_cast<uint32_t>(code);
  h.bytes = text.size();
  std::vector<uint8_t> msg(kHeaderBytes + text.size());
  std::memcpy(msg.data(), &h, kHeaderBytes);
  std::memcpy(msg.data() + kHeaderBytes, text.data(), text.size());
  ucp_request_param_t param{};
  ucs_status_ptr_t r = ucp_tag_send_nbx(peer_->ep, msg.data(), msg.size(), out_farewell_tag_,
                                        &param);
  if (UCS_PTR_IS_PTR(r)) aux_.push_back(Aux{r, std::move(msg)});
}

bool UcxConnection::check_farewell() {
  if (fw_arrived_) return true;
  if (fw_req_ == nullptr) return false;
  ucp_tag_recv_info_t info{};
  ucs_status_t st = ucp_tag_recv_request_test(fw_req_, &info);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(fw_req_);
  fw_req_ = nullptr;
  if (st == UCS_ERR_CANCELED) return false;
  WireHeader h{};
  if (st == UCS_OK && info.length >= kHeaderBytes) std::memcpy(&h, fw_buf_.data(), kHeaderBytes);
  fw_arrived_ = true;
  if (st != UCS_OK || h.magic != kFarewellMagic || info.length != kHeaderBytes + h.bytes) {
    fw_code_ = Code::kRemoteError;
    fw_text_ = st == UCS_OK ? "(a malformed farewell)"
                            : fmt::format("(a farewell that could not be received: {})",
                                          ucs_status_string(st));
    return true;
  }
  fw_code_ = static_cast<Code>(h.code);
  fw_text_.assign(reinterpret_cast<const char*>(fw_buf_.data() + kHeaderBytes), h.bytes);
  return true;
}

void UcxConnection::cancel_recvs() {
  auto cancel = [&](void*& r) {
    if (r == nullptr) return;
    ucp_request_cancel(worker_->handle(), r);
    aux_.push_back(Aux{r, {}});
    r = nullptr;
  };
  cancel(rx_header_req_);
  for (size_t i = rx_done_; i < rx_posted_; ++i) cancel(rx_chunk_reqs_[i % kWindow]);
  rx_posted_ = rx_done_ = rx_chunks_ = 0;
  rx_phase_ = RxPhase::kIdle;
  cancel(fw_req_);
}

void UcxConnection::release_sends() {
  for (auto& op : sends_) {
    for (size_t i = op->next; i < op->pending.size(); ++i) {
      // The first request may be the header message, which lives in op->msg.
      aux_.push_back(Aux{op->pending[i].first, i == 0 ? std::move(op->msg) : std::vector<uint8_t>()});
    }
    op->pending.clear();
    op->next = 0;
  }
}

void UcxConnection::reap() {
  std::erase_if(aux_, [](const Aux& a) {
    if (in_progress(a.req)) return false;
    ucp_request_free(a.req);
    return true;
  });
}

bool UcxConnection::drain(int ms) {
  return progress_until(*worker_, [&] {
    reap();
    return aux_.empty();
  }, ms);
}

void UcxConnection::fail_all(Status status, bool tell_peer) {
  if (broken_) return;
  if (tell_peer) farewell(status);
  broken_ = true;
  if (idle()) {
    CHORUS_INFO(kNet, "{}", status.message());
  } else {
    CHORUS_WARN(kNet, "{}", status.message());
  }
  set_error(std::move(status));
  // UCX must let go of the caller's buffers before the caller gets its requests back.
  cancel_recvs();
  release_sends();
  reap();
  if (!aux_.empty()) {
    bool done = !peer_->failed() && drain(kFailDrainMs);
    if (!done && peer_->watched) {
      worker_->force_close(peer_.get(),
                           fmt::format("was cut off by rank {} after an error on ucx channel {}",
                                       my_rank_, channel()));
      done = drain(kFailDrainMs);
    }
    if (!done) {
      CHORUS_WARN(kNet, "ucx: rank {}: {} UCX operation(s) with {} did not finish after an error",
                  my_rank_, aux_.size(), peer_->label);
    }
  }
  while (!sends_.empty()) {
    SendRequest* req = sends_.front()->req;
    spare_.push_back(std::move(sends_.front()));
    sends_.pop_front();
    req->fail();
  }
  recvs_.fail_all();
}

std::string UcxConnection::situation() const {
  if (!recvs_.empty()) {
    return fmt::format("while rank {} was receiving {} on ucx channel {}", my_rank_,
                       describe_request(recvs_.front()), channel());
  }
  if (!sends_.empty()) {
    return fmt::format("while rank {} was sending {} on ucx channel {}", my_rank_,
                       describe_request(sends_.front()->req), channel());
  }
  return fmt::format("while rank {} had nothing pending on ucx channel {}", my_rank_, channel());
}

Status UcxConnection::peer_error() const {
  return remote_error("{} {} {}", peer_->label, peer_->why(), situation());
}

Status UcxConnection::corrupt(const RecvRequest* req, const std::string& what) const {
  return remote_error("{} sent {} on ucx channel {} while rank {} was receiving {}", peer_->label,
                      what, channel(), my_rank_, describe_request(req));
}

}  // namespace chorus::ucx
