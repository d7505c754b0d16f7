// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_datapath.cc
// The data path of a verbs connection (verbs_connection.cc has its setup, work requests,
// completions, farewell and errors): sends cut into slots, announced and written zero copy;
// receives that copy or reduce each slot, or answer an announcement; credits.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "transports/verbs/verbs_connection.h"

namespace chorus::verbs {

bool VerbsConnection::progress() {
  if (broken_) return false;
  bool moved = poll_cq();
  // Receives first: their answers to announcements and their credits are small, and the peer
  // waits for them; posted after our own next large write they would wait behind it in the send
  // queue, and the two directions of an exchange would take turns instead of overlapping.
  if (!broken_) moved |= progress_recvs();
  if (!broken_) maybe_send_credit();
  if (!broken_) moved |= progress_sends();
  if (broken_) return true;
  if (s_.rings->device->any_failure()) {  // one clock read while none is recorded
    for (auto& qp : s_.qp.qps) {
      if (std::string why = s_.rings->device->failure(qp->qp_num); !why.empty()) {
        fail_all(remote_error("verbs: {} for {} QP {:#x} (to {}) {}", why,
                              s_.rings->device->name(), qp->qp_num, s_.peer_label, situation()),
                 false);
        return true;
      }
    }
  }
  // The peer's farewell counts once the data that came before it is consumed, and only while
  // something waits here (a peer that sent its last message and left is no failure).
  if (!idle() && check_gone()) return true;
  return moved;
}

// The registered range's MR that covers all of [buf, buf + bytes), or null. With
// `remote_write`, only one the peer may write into.
static const ibv_mr* mr_covering(const RegistrationKey* key, const void* buf, size_t bytes,
                                 bool remote_write) {
  if (key == nullptr) return nullptr;
  const auto* mk = static_cast<const MrKey*>(key);
  if (remote_write && !mk->remote_write()) return nullptr;
  const ibv_mr* mr = mk->mr();
  const auto base = reinterpret_cast<uintptr_t>(mr->addr);
  const auto p = reinterpret_cast<uintptr_t>(buf);
  if (p < base || p - base > mr->length || mr->length - (p - base) < bytes) return nullptr;
  return mr;
}

bool VerbsConnection::progress_sends() {
  bool moved = false;
  while (!sends_.empty() && !broken_) {
    // Completed sends wait in written_ behind one whose writes are still in flight (over
    // another QP, or zero copy): a new message starts only while it has room.
    if (send_phase_ == SendPhase::kFresh && written_count_ == written_.size()) break;
    SendRequest* req = sends_.front();
    bool went = false;
    switch (send_phase_) {
      case SendPhase::kFresh:
      case SendPhase::kSlots:
        went = send_slot(req);
        break;
      case SendPhase::kAwaitReply:
        went = take_reply(req);
        break;
      case SendPhase::kZeroCopy:
        went = send_zero_copy(req);
        break;
    }
    if (!went) break;
    moved = true;
  }
  while (written_count_ > 0 && written_[written_head_].slots <= tx_done_ &&
         written_[written_head_].writes <= zc_done_) {
    SendRequest* req = written_[written_head_].req;
    written_head_ = (written_head_ + 1) % written_.size();
    --written_count_;
    moved = true;
    req->complete();  // the caller may free it now
  }
  return moved;
}

// One slot of the front send: its announcement (a large message from registered memory, not
// yet begun), or its next piece of payload.
bool VerbsConnection::send_slot(SendRequest* req) {
  if (tx_seq_ - tx_credit_ >= s_.slots || tx_seq_ - tx_done_ >= s_.slots) return false;
  const ibv_mr* mr = req->bytes > 0 ? mr_covering(req->key, req->buf, req->bytes, false) : nullptr;
  const bool announce = send_phase_ == SendPhase::kFresh && mr != nullptr &&
                        s_.rdv_bytes > 0 && req->bytes >= s_.rdv_bytes;
  const size_t n = announce ? 0 : std::min(payload_bytes(), req->bytes - send_offset_);
  // A message that fits in one inline send has its payload copied when it is posted: the
  // caller's buffer is free at once, so the request completes now rather than when the write is
  // acknowledged (an eager send, as NCCL's), unless an earlier request still waits for its
  // writes (requests complete in order).
  const bool inline_send = !announce && send_offset_ == 0 && n == req->bytes &&
                           kSlotHeaderBytes + n <= s_.qp.max_inline;
  uint8_t* slot = tx_slot(tx_seq_);
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.payload = static_cast<uint32_t>(n);
  h.tag = req->tag;
  h.total = req->bytes;
  h.offset = send_offset_;
  h.seq = tx_seq_;
  // Every slot returns the credits we have (the peer's ring slots consumed here), so an
  // exchange needs no credit work requests of its own (maybe_send_credit).
  h.flags = (announce ? kSlotAnnounce : 0) | kSlotCredit;
  h.credit = static_cast<uint32_t>(rx_seq_);
  credit_sent_ = std::max(credit_sent_, rx_seq_);
  std::memcpy(slot, &h, sizeof(h));
  const auto* src = static_cast<const uint8_t*>(req->buf) + send_offset_;
  ibv_sge sge[2];
  sge[0].addr = reinterpret_cast<uintptr_t>(slot);
  sge[0].lkey = s_.rings->tx_mr->lkey;
  int nsge = 1;
  if (n > 0 && mr != nullptr) {  // registered: the HCA reads the payload where it is
    sge[0].length = kSlotHeaderBytes;
    sge[1].addr = reinterpret_cast<uintptr_t>(src);
    sge[1].length = static_cast<uint32_t>(n);
    sge[1].lkey = mr->lkey;
    nsge = 2;
  } else {
    if (n > 0) std::memcpy(slot + kSlotHeaderBytes, src, n);
    sge[0].length = static_cast<uint32_t>(kSlotHeaderBytes + n);
  }
  // Slots go round robin over the QPs (each its own path through the network).
  if (!post_write(static_cast<uint32_t>(tx_seq_ % nqps()), kWrSlot | tx_seq_ << 8,
                  IBV_WR_RDMA_WRITE_WITH_IMM, slot_imm(tx_seq_), sge, nsge,
                  s_.remote_ring + (tx_seq_ % s_.slots) * s_.slot_bytes, s_.remote_rkey,
                  inline_send ? IBV_SEND_INLINE : 0)) {
    return false;
  }
  if (announce) {
    announce_seq_ = tx_seq_;
    ++tx_seq_;
    send_phase_ = SendPhase::kAwaitReply;
    return true;
  }
  send_phase_ = SendPhase::kSlots;
  ++tx_seq_;
  send_offset_ += n;
  s_.counters->ring_sent(n);
  req->bytes_done.store(send_offset_, std::memory_order_relaxed);
  if (send_offset_ != req->bytes) return true;
  if (inline_send && written_count_ == 0) {
    sends_.pop();
    send_offset_ = 0;
    send_phase_ = SendPhase::kFresh;
    s_.counters->inline_sent(n);
    req->complete();  // the caller may free it now
  } else {
    finish_send(req);
  }
  return true;
}

// The receiver's answer to the front send's announcement: where to write it, or "as slots".
bool VerbsConnection::take_reply(SendRequest* req) {
  if (!reply_arrived_) return false;
  reply_arrived_ = false;
  RdvReply r{};
  std::memcpy(&r, rx_aux() + kRdvReplyOffset, sizeof(r));
  if (std::string bad = check_reply(r, announce_seq_, req->bytes); !bad.empty()) {
    fail_all(remote_error("verbs: {} sent {} on verbs channel {} {}", s_.peer_label, bad,
                          s_.channel, situation()),
             true);
    return false;
  }
  send_offset_ = 0;
  if (r.mode == kRdvRing) {
    send_phase_ = SendPhase::kSlots;
  } else {
    send_phase_ = SendPhase::kZeroCopy;
    zc_addr_ = r.addr;
    zc_rkey_ = r.rkey;
    zc_split_ = zero_copy_split(req->bytes, nqps());
    zc_piece_ = 0;
  }
  return true;
}

// The next piece of the front send, written straight into the receiver's buffer: part q of the
// message over QP q (zero_copy_split), in pieces of at most max_write taken round robin over the
// parts, at most kZeroCopyWritesPerQp x parts outstanding (why: kZeroCopyPieceBytes); each
// part's last piece carries the immediate that the receiver counts (RC has placed the part's
// earlier writes before it). The send completes when every write has: counting writes in total
// is exact because the next zero-copy message's writes start only after the receiver saw all of
// this one's.
bool VerbsConnection::send_zero_copy(SendRequest* req) {
  const uint64_t part = zc_split_.part, parts = zc_split_.parts;
  // parts <= kMaxQpsPerConnection, so this stays within kMaxZeroCopyWrites (the QPs' sizing).
  if (zc_posted_ - zc_done_ >= kZeroCopyWritesPerQp * parts) return false;
  const ibv_mr* mr = mr_covering(req->key, req->buf, req->bytes, false);
  const uint64_t per_part = (part + s_.max_write - 1) / s_.max_write;
  for (;; ++zc_piece_) {
    if (zc_piece_ >= per_part * parts) {  // every piece posted
      s_.counters->zero_copy_sent(req->bytes);
      finish_send(req);
      return true;
    }
    const uint64_t q = zc_piece_ % parts;
    const uint64_t start = q * part + zc_piece_ / parts * s_.max_write;
    const uint64_t end = std::min<uint64_t>((q + 1) * part, req->bytes);
    if (start >= end) continue;  // the last part is shorter
    const uint64_t n = std::min<uint64_t>(s_.max_write, end - start);
    const bool last = start + n == end;
    ibv_sge sge{reinterpret_cast<uintptr_t>(static_cast<const uint8_t*>(req->buf) + start),
                static_cast<uint32_t>(n), mr->lkey};
    if (!post_write(static_cast<uint32_t>(q), kWrZeroCopy,
                    last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                    rdv_done_imm(announce_seq_), &sge, 1, zc_addr_ + start, zc_rkey_)) {
      return false;
    }
    ++zc_posted_;
    ++zc_piece_;
    send_offset_ += n;
    req->bytes_done.store(send_offset_, std::memory_order_relaxed);
    return true;
  }
}

// Every work request of the front send is posted: it completes once they have.
void VerbsConnection::finish_send(SendRequest* req) {
  sends_.pop();
  written_[(written_head_ + written_count_) % written_.size()] = {req, tx_seq_, zc_posted_};
  ++written_count_;
  send_offset_ = 0;
  send_phase_ = SendPhase::kFresh;
}

bool VerbsConnection::progress_recvs() {
  bool moved = false;
  while (!recvs_.empty() && !broken_) {
    RecvRequest* req = recvs_.front();
    if (rx_zero_copy_) {  // the sender writes the message into dst
      if (!rx_done_) break;
      rx_zero_copy_ = rx_done_ = false;
      rx_in_message_ = false;
      s_.counters->zero_copy_received(rx_total_);
      req->bytes_done.store(rx_total_, std::memory_order_relaxed);
      recvs_.pop();
      req->complete();  // the caller may free it now
      moved = true;
      continue;
    }
    if (rx_seq_ >= rx_arrived_) break;
    const uint8_t* slot = rx_slot(rx_seq_);
    SlotHeader h{};
    std::memcpy(&h, slot, sizeof(h));
    std::string bad = check_slot(h, rx_seq_, rx_in_message_, rx_offset_, rx_total_, s_.slot_bytes);
    if (!bad.empty()) {
      fail_all(corrupt(req, bad), true);
      return true;
    }
    if (!rx_in_message_) {
      if (Status st = accept_incoming(req, h.tag, h.total, peer(), s_.my_rank); !st.ok()) {
        fail_all(std::move(st), true);
        return true;
      }
      rx_in_message_ = true;
      rx_total_ = h.total;
      rx_offset_ = 0;
    }
    if ((h.flags & kSlotAnnounce) != 0) {
      ++rx_seq_;
      moved = true;
      if (!answer_announcement(req, h)) return true;
      continue;
    }
    if (h.payload > 0) {
      const uint8_t* payload = slot + kSlotHeaderBytes;
      auto* dst = static_cast<uint8_t*>(req->dst) + rx_offset_;
      if (req->reduce != nullptr) {
        if (h.payload % req->elem_size != 0) {
          fail_all(corrupt(req, fmt::format("a slot of {} bytes for {}-byte elements", h.payload,
                                            req->elem_size)),
                   true);
          return true;
        }
        const auto* src = static_cast<const uint8_t*>(req->src != nullptr ? req->src : req->dst);
        req->reduce(dst, src + rx_offset_, payload, h.payload / req->elem_size);
      } else {
        std::memcpy(dst, payload, h.payload);
      }
      s_.counters->ring_received(h.payload);
    }
    rx_offset_ += h.payload;
    ++rx_seq_;
    moved = true;
    req->bytes_done.store(rx_offset_, std::memory_order_relaxed);
    if (rx_offset_ == rx_total_) {
      rx_in_message_ = false;
      recvs_.pop();
      req->complete();  // the caller may free it now
    }
  }
  return moved;
}

// Zero copy when the receive's whole buffer lies in memory the peer may write and it only
// copies (a reducing receive combines each slot as it comes: it takes the ring). Otherwise the
// message follows as slots from offset 0.
bool VerbsConnection::answer_announcement(RecvRequest* req, const SlotHeader& h) {
  const ibv_mr* mr = req->reduce == nullptr ? mr_covering(req->key, req->dst, h.total, true)
                                            : nullptr;
  RdvReply r{};
  r.magic = kRdvReplyMagic;
  r.mode = mr != nullptr ? kRdvZeroCopy : kRdvRing;
  r.seq = h.seq;
  r.bytes = h.total;
  if (mr != nullptr) {
    r.addr = reinterpret_cast<uintptr_t>(req->dst);
    r.rkey = mr->rkey;
  }
  std::memcpy(tx_aux() + kRdvReplyOffset, &r, sizeof(r));
  ibv_sge sge{reinterpret_cast<uintptr_t>(tx_aux() + kRdvReplyOffset),
              static_cast<uint32_t>(sizeof(r)), s_.rings->tx_mr->lkey};
  if (!post_wr(kWrReply, IBV_WR_RDMA_WRITE_WITH_IMM, kImmRdvReply, &sge, 1,
               uint64_t{s_.slots} * s_.slot_bytes + kRdvReplyOffset)) {
    return false;
  }
  if (mr != nullptr) {
    rx_zero_copy_ = true;
    rx_done_ = false;
    rx_announce_seq_ = h.seq;
    rx_owed_ = (uint32_t{1} << zero_copy_split(h.total, nqps()).parts) - 1;
  }
  return true;
}

void VerbsConnection::maybe_send_credit() {
  if (credit_in_flight_ || broken_) return;
  if (rx_seq_ - credit_sent_ < credit_threshold_) return;
  if (!post_wr(kWrCredit, IBV_WR_SEND_WITH_IMM, credit_imm(rx_seq_), nullptr, 0, 0)) return;
  credit_sent_ = rx_seq_;
  credit_in_flight_ = true;
}

bool VerbsConnection::peek(MsgTag* tag, uint64_t* bytes) {
  if (broken_ || !recvs_.empty() || !peer_closed().ok()) return false;
  // The completions only, and only while nothing is known to have landed: they say what has.
  // The rest of progress() (our sends, credits, the device's events) has nothing to do with the
  // next incoming message, and the chunk layer has just called it.
  if (rx_seq_ >= rx_arrived_) poll_cq();
  if (broken_) return false;
  if (rx_seq_ < rx_arrived_) {
    SlotHeader h{};
    std::memcpy(&h, rx_slot(rx_seq_), sizeof(h));
    if (std::string bad = check_slot(h, rx_seq_, false, 0, 0, s_.slot_bytes); !bad.empty()) {
      fail_all(corrupt(nullptr, bad), true);
      return false;
    }
    *tag = h.tag;
    *bytes = h.total;
    return true;
  }
  check_gone(/*peeking=*/true);  // nothing arrived: a peer that has gone sends nothing more
  return false;
}

}  // namespace chorus::verbs
