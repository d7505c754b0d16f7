// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_connection.cc
// Messages as slots: each slot is one signaled RDMA WRITE_WITH_IMM of a 64-byte header and up
// to slot_bytes - 64 of payload into the receiver's ring, at most `slots` unconsumed at a time
// (credits); the receiver copies or reduces each slot straight into the destination and
// returns credits as 0-byte SEND_WITH_IMM. Large messages from registered memory are announced
// by a header-only slot; the receiver answers with its buffer's address (registered: the
// sender writes the message there, zero copy) or asks for slots. No verbs callbacks: the CQ is
// polled.
#include "transports/verbs/verbs_connection.h"

#include <endian.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/log.h"

namespace chorus::verbs {

namespace {

constexpr int kFarewellDrainMs = 200;  // how long a farewell may take to be acknowledged
// Closing: the goodbye is best effort (a peer closing at the same time no longer acknowledges).
constexpr int kGoodbyeDrainMs = 50;
constexpr int kFailDrainMs = 500;      // how long the HCA may keep the caller's buffers

// An fd that is always readable: poll_fd() returns it while completions wait to be handled,
// so the caller progresses instead of sleeping. Never closed.
int always_ready_fd() {
  static const int fd = [] {
    int e = eventfd(1, EFD_CLOEXEC);
    return e;
  }();
  return fd;
}

const char* wr_name(uint64_t wr_id) {
  switch (wr_id) {
    case 1: return "slot write";
    case 2: return "credit";
    case 3: return "hello";
    case 4: return "farewell";
    case 5: return "receive";
    case 6: return "rendezvous reply";
    case 7: return "zero-copy write";
    default: return "work request";
  }
}

}  // namespace

Rings::~Rings() {
  rx_mr.reset();
  tx_mr.reset();
  if (rx != nullptr) ::munmap(rx, bytes);
  if (tx != nullptr) ::munmap(tx, bytes);
}

template <typename Done>
void VerbsConnection::drain(int ms, Done done) {
  Deadline deadline = Deadline::after_ms(ms);
  while (!done() && !deadline.expired()) {
    if (!poll_cq()) std::this_thread::yield();
  }
}

VerbsConnection::VerbsConnection(ConnectionSetup setup)
    : Connection(setup.peer, setup.channel),
      s_(std::move(setup)),
      written_(s_.slots + kMaxZeroCopyWrites + 1) {
  credit_threshold_ = std::max<uint32_t>(1, s_.slots / 4);
  tx_landed_.assign(s_.slots, 0);
  rx_landed_.assign(s_.slots, 0);
  for (uint32_t q = 0; q < nqps(); ++q) rx_next_.push_back(q);
  // A hello over each QP proves it connected to its peer QP.
  for (uint32_t q = 0; q < nqps() && !broken_; ++q) {
    Hello h{kHelloMagic, static_cast<uint32_t>(s_.my_rank), static_cast<uint32_t>(s_.peer),
            static_cast<uint32_t>(s_.channel), s_.comm_uid, s_.qp.qps[q]->qp_num, q};
    const size_t at = kHelloOffset + q * kHelloBytes;
    std::memcpy(tx_aux() + at, &h, sizeof(h));
    ibv_sge sge{reinterpret_cast<uintptr_t>(tx_aux() + at), static_cast<uint32_t>(sizeof(h)),
                s_.rings->tx_mr->lkey};
    post_write(q, kWrHello, IBV_WR_RDMA_WRITE_WITH_IMM, kImmHello, &sge, 1,
               s_.remote_ring + uint64_t{s_.slots} * s_.slot_bytes + at, s_.remote_rkey);
  }
}

VerbsConnection::~VerbsConnection() {
  if (!broken_) {
    // A peer still waiting for us learns at once that we are gone.
    if (!farewell_sent_) send_farewell(Code::kOk, "");
    broken_ = true;
    if (farewell_sent_) drain(kGoodbyeDrainMs, [&] { return farewell_done_; });
  }
  // Sends must be flushed before the QPs go; receives carry no buffers and go with them.
  for (auto& qp : s_.qp.qps) qp_to_error(qp.get());
  drain(kFarewellDrainMs, [&] { return sq_outstanding_ == 0; });
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  unsigned events = 0;
  while (ibv_get_cq_event(s_.qp.channel.get(), &cq, &cq_ctx) == 0) ++events;
  if (events > 0) ibv_ack_cq_events(s_.qp.cq.get(), events);
}

// ---- Work requests --------------------------------------------------------------------------

bool VerbsConnection::post_wr(WrKind kind, ibv_wr_opcode opcode, uint32_t imm, ibv_sge* sge,
                              int nsge, uint64_t remote_offset) {
  return post_write(0, kind, opcode, imm, sge, nsge, s_.remote_ring + remote_offset,
                    s_.remote_rkey);
}

bool VerbsConnection::post_write(uint32_t q, uint64_t wr_id, ibv_wr_opcode opcode, uint32_t imm,
                                 ibv_sge* sge, int nsge, uint64_t remote_addr, uint32_t rkey,
                                 unsigned extra_flags) {
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED | extra_flags;
  wr.imm_data = htobe32(imm);
  if (opcode != IBV_WR_SEND_WITH_IMM) {
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
  }
  if (int rc = ibv_post_send(s_.qp.qps[q].get(), &wr, &bad); rc != 0) {
    if (!broken_) {
      fail_all(remote_error("verbs: rank {} could not post a {} to {} on {} QP {:#x}: {} {}",
                            s_.my_rank, wr_name(wr_id & 0xff), s_.peer_label,
                            s_.rings->device->name(), s_.qp.qps[q]->qp_num, std::strerror(rc),
                            situation()),
               false);
    }
    return false;
  }
  ++sq_outstanding_;
  return true;
}

bool VerbsConnection::post_receive(uint32_t q) {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = kWrRecv;
  wr.num_sge = 0;  // immediate data only: slot payloads land by RDMA WRITE
  if (int rc = ibv_post_recv(s_.qp.qps[q].get(), &wr, &bad); rc != 0) {
    fail_all(remote_error("verbs: rank {} could not post a receive on {} QP {:#x} to {}: {}",
                          s_.my_rank, s_.rings->device->name(), s_.qp.qps[q]->qp_num,
                          s_.peer_label, std::strerror(rc)),
             false);
    return false;
  }
  return true;
}

uint32_t VerbsConnection::qp_index(uint32_t qp_num) const {
  uint32_t q = 0;
  while (q < nqps() && s_.qp.qps[q]->qp_num != qp_num) ++q;
  return q;
}

void VerbsConnection::post_send(SendRequest* req) {
  if (broken_) {
    req->fail();
    return;
  }
  sends_.push(req);
  if (!peer_closed().ok()) {
    fail_all(peer_closed(), false);
    return;
  }
  // A message that fits one slot, with nothing queued ahead of it, is written now rather than
  // at the next progress(): a lone small send then costs one ibv_post_send, not a pass over the
  // completion queue, the receives and the credits first (soft-RoCE guest: about a third of a
  // small ncclSend's instructions). Larger ones wait for progress(), which answers the peer's
  // announcements before posting more of our own data.
  if (sends_.size() == 1 && send_phase_ == SendPhase::kFresh && req->bytes <= payload_bytes())
    progress_sends();
}

void VerbsConnection::post_recv(RecvRequest* req) {
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
  if (!st.ok()) {
    fail_all(std::move(st), true);
    return;
  }
  // The chunk layer posts a receive once it has peeked at the message's first slot: consume
  // what has landed now (no completion-queue pass needed).
  if (recvs_.size() == 1 && rx_seq_ < rx_arrived_) progress_recvs();
}

// ---- Completions ----------------------------------------------------------------------------

int VerbsConnection::poll_fd(short* events) const {
  if (broken_) return -1;
  *events = POLLIN;
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  unsigned acked = 0;
  while (ibv_get_cq_event(s_.qp.channel.get(), &cq, &cq_ctx) == 0) ++acked;
  if (acked > 0) ibv_ack_cq_events(s_.qp.cq.get(), acked);
  if (ibv_req_notify_cq(s_.qp.cq.get(), 0) != 0) return always_ready_fd();
  // A completion that came before the arm raises no event: look once more.
  if (stash_n_ == 0) stash_n_ = std::max(0, ibv_poll_cq(s_.qp.cq.get(), kBatch, stash_.data()));
  if (stash_n_ > 0) return always_ready_fd();
  return s_.qp.channel->fd;
}

bool VerbsConnection::poll_cq() {
  bool moved = false;
  std::array<ibv_wc, kBatch> wcs;
  for (;;) {
    int n = 0;
    if (stash_n_ > 0) {
      n = stash_n_;
      std::copy_n(stash_.begin(), n, wcs.begin());
      stash_n_ = 0;
    } else {
      n = ibv_poll_cq(s_.qp.cq.get(), kBatch, wcs.data());
      if (n < 0) {
        if (!broken_) {
          fail_all(remote_error("verbs: ibv_poll_cq failed on {} QP {:#x} (to {})",
                                s_.rings->device->name(), qpn(), s_.peer_label),
                   false);
        }
        return true;
      }
      if (n == 0) return moved;
    }
    moved = true;
    for (int i = 0; i < n; ++i) on_completion(wcs[i]);
  }
}

bool VerbsConnection::on_completion(const ibv_wc& wc) {
  const uint64_t kind = wc.wr_id & 0xff;
  if (kind != kWrRecv) {
    --sq_outstanding_;
    if (kind == kWrFarewell) farewell_done_ = true;
  }
  if (broken_) return false;  // flushed, or late: bookkeeping only
  if (wc.status != IBV_WC_SUCCESS) {
    fail_all(wc_error(wc), false);
    return false;
  }
  switch (kind) {
    case kWrSlot: {
      // Slots complete in order per QP only: the staging slots are free up to the first one
      // still in flight.
      const uint64_t seq = wc.wr_id >> 8;
      if (seq < tx_done_ || seq >= tx_seq_) {
        fail_all(internal_error("verbs: completion of slot {} on QP {:#x} when slots [{}, {}) "
                                "were in flight",
                                seq, wc.qp_num, tx_done_, tx_seq_),
                 false);
        return false;
      }
      tx_landed_[seq % s_.slots] = 1;
      while (tx_done_ < tx_seq_ && tx_landed_[tx_done_ % s_.slots] != 0) {
        tx_landed_[tx_done_ % s_.slots] = 0;
        ++tx_done_;
      }
      return true;
    }
    case kWrCredit:
      credit_in_flight_ = false;
      return true;
    case kWrHello:
      ++hellos_sent_;
      return true;
    case kWrFarewell:
    case kWrReply:
      return true;
    case kWrZeroCopy:
      ++zc_done_;
      return true;
    case kWrRecv: {
      const uint32_t q = qp_index(wc.qp_num);
      if (q == nqps()) {
        fail_all(internal_error("verbs: a receive completion from QP {:#x}, not one of {}'s",
                                wc.qp_num, s_.peer_label),
                 false);
        return false;
      }
      return on_receive(wc, q);
    }
    default:
      fail_all(internal_error("verbs: completion with unknown id {} on QP {:#x}", wc.wr_id,
                              wc.qp_num),
               false);
      return false;
  }
}

bool VerbsConnection::on_receive(const ibv_wc& wc, uint32_t q) {
  if (!post_receive(q)) return false;
  const RecvRequest* front = recvs_.empty() ? nullptr : recvs_.front();
  if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
    fail_all(corrupt(front, "a message without immediate data"), true);
    return false;
  }
  const uint32_t imm = be32toh(wc.imm_data);
  if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM && !is_credit_imm(imm)) {
    fail_all(corrupt(front, fmt::format("a SEND with immediate data {:#x}", imm)), true);
    return false;
  }
  if (is_slot_imm(imm)) return on_slot(imm, q, front);
  if (is_rdv_done_imm(imm)) {
    // Each QP that carries a part of the message ends it with this immediate; RC has placed
    // the part's earlier writes by then.
    const uint32_t bit = uint32_t{1} << q;
    if (!rx_zero_copy_ || (rx_owed_ & bit) == 0 || imm != rdv_done_imm(rx_announce_seq_)) {
      fail_all(corrupt(front, fmt::format("the end of a zero-copy message ({:#x}) over QP {} "
                                          "where {}",
                                          imm, q,
                                          rx_zero_copy_ && !rx_done_
                                              ? fmt::format("{:#x} was due over QPs {:#x}",
                                                            rdv_done_imm(rx_announce_seq_),
                                                            rx_owed_)
                                              : std::string("none was announced"))),
               true);
      return false;
    }
    rx_owed_ &= ~bit;
    rx_done_ = rx_owed_ == 0;
    return true;
  }
  if (imm == kImmRdvReply) {
    if (q != 0 || send_phase_ != SendPhase::kAwaitReply || reply_arrived_) {
      fail_all(remote_error("verbs: {} sent a rendezvous reply on verbs channel {} that rank {} "
                            "did not ask for {}",
                            s_.peer_label, s_.channel, s_.my_rank, situation()),
               true);
      return false;
    }
    reply_arrived_ = true;
    return true;
  }
  if (is_credit_imm(imm)) return take_credit(widen_credit(tx_credit_, imm));
  if (imm == kImmHello) return check_hello(q);
  if (imm == kImmFarewell) {
    read_farewell();
    return true;
  }
  fail_all(corrupt(front, fmt::format("immediate data {:#x}", imm)), true);
  return false;
}

bool VerbsConnection::take_credit(uint64_t consumed) {
  if (consumed > tx_seq_) {
    const RecvRequest* front = recvs_.empty() ? nullptr : recvs_.front();
    fail_all(corrupt(front, fmt::format("credit for {} slots when {} were sent", consumed, tx_seq_)),
             true);
    return false;
  }
  tx_credit_ = std::max(tx_credit_, consumed);
  return true;
}

// A slot write over QP q: the next slot due over that QP, within the ring's window. Slots over
// different QPs may land out of order; rx_arrived_ counts those that landed without a gap.
bool VerbsConnection::on_slot(uint32_t imm, uint32_t q, const RecvRequest* front) {
  const uint64_t seq = rx_next_[q];
  if (imm != slot_imm(seq) || seq - rx_seq_ >= s_.slots) {
    fail_all(corrupt(front, fmt::format("slot write {:#x} over QP {} where slot {} was due ({} "
                                        "of {} slots unconsumed)",
                                        imm, q, seq, rx_arrived_ - rx_seq_, s_.slots)),
             true);
    return false;
  }
  if (rx_zero_copy_ && (rx_owed_ & (uint32_t{1} << q)) != 0) {
    fail_all(corrupt(front, fmt::format("slot {} over QP {} before the end of the zero-copy "
                                        "message it announced in slot {}",
                                        seq, q, rx_announce_seq_)),
             true);
    return false;
  }
  // The credit it carries counts now (it is checked as a whole when consumed).
  SlotHeader h{};
  std::memcpy(&h, rx_slot(seq), sizeof(h));
  if ((h.flags & kSlotCredit) != 0 && !take_credit(widen_slot_credit(tx_credit_, h.credit)))
    return false;
  rx_next_[q] = seq + nqps();
  rx_landed_[seq % s_.slots] = 1;
  while (rx_landed_[rx_arrived_ % s_.slots] != 0) {
    rx_landed_[rx_arrived_ % s_.slots] = 0;
    ++rx_arrived_;
  }
  return true;
}

bool VerbsConnection::check_hello(uint32_t q) {
  Hello h{};
  std::memcpy(&h, rx_aux() + kHelloOffset + q * kHelloBytes, sizeof(h));
  const bool again = (hellos_received_ & (uint32_t{1} << q)) != 0;
  if (again || h.magic != kHelloMagic || h.from != static_cast<uint32_t>(s_.peer) ||
      h.to != static_cast<uint32_t>(s_.my_rank) || h.channel != static_cast<uint32_t>(s_.channel) ||
      h.comm_uid != s_.comm_uid || h.qpn != s_.remote_qpns[q] || h.index != q) {
    fail_all(remote_error("verbs: the hello from {} on channel {} was rejected: it names rank {} "
                          "-> {} channel {} QP {:#x} ({} of the connection) of communicator "
                          "{:#x} (magic {:#x}{}), not rank {} -> {} channel {} QP {:#x} ({}) of "
                          "{:#x}",
                          s_.peer_label, s_.channel, h.from, h.to, h.channel, h.qpn, h.index,
                          h.comm_uid, h.magic, again ? ", a second one" : "", s_.peer,
                          s_.my_rank, s_.channel, s_.remote_qpns[q], q, s_.comm_uid),
             true);
    return false;
  }
  hellos_received_ |= uint32_t{1} << q;
  return true;
}

void VerbsConnection::read_farewell() {
  FarewellHeader h{};
  std::memcpy(&h, rx_aux() + kFarewellOffset, sizeof(h));
  fw_arrived_ = true;
  if (h.magic != kFarewellMagic || h.bytes > kMaxFarewellBytes) {
    fw_wire_code_ = static_cast<uint32_t>(Code::kRemoteError);
    fw_text_ = "(a malformed farewell)";
    return;
  }
  fw_wire_code_ = h.code;
  fw_text_.assign(reinterpret_cast<const char*>(rx_aux() + kFarewellOffset + sizeof(h)), h.bytes);
}

// ---- Farewell and errors --------------------------------------------------------------------

void VerbsConnection::farewell(const Status& why) {
  if (broken_ || why.ok()) return;
  send_farewell(why.code(), why.message());
}

void VerbsConnection::send_farewell(Code code, const std::string& reason) {
  if (farewell_sent_) return;
  farewell_sent_ = true;
  const std::string text = reason.substr(0, kMaxFarewellBytes);
  FarewellHeader h{kFarewellMagic, static_cast<uint32_t>(code), text.size()};
  uint8_t* out = tx_aux() + kFarewellOffset;
  std::memcpy(out, &h, sizeof(h));
  std::memcpy(out + sizeof(h), text.data(), text.size());
  ibv_sge sge{reinterpret_cast<uintptr_t>(out), static_cast<uint32_t>(sizeof(h) + text.size()),
              s_.rings->tx_mr->lkey};
  if (!post_wr(kWrFarewell, IBV_WR_RDMA_WRITE_WITH_IMM, kImmFarewell, &sge, 1,
               uint64_t{s_.slots} * s_.slot_bytes + kFarewellOffset)) {
    farewell_done_ = true;
  }
}

bool VerbsConnection::check_gone(bool peeking) {
  if (!fw_arrived_ || rx_seq_ < rx_arrived_ || rx_done_) return false;
  if (fw_wire_code_ == 0) {
    Status closed = remote_error("verbs: {} closed its end of verbs channel {} (its communicator "
                                 "went away) {}", s_.peer_label, s_.channel, situation());
    if (peeking && idle()) {
      // Between messages: not a failure by itself (transport.h, peer_closed()).
      set_peer_closed(std::move(closed));
      return false;
    }
    fail_all(std::move(closed), false);
  } else {
    fail_all(Status(farewell_code(fw_wire_code_),
                    fmt::format("{} gave up {}: {}", s_.peer_label, situation(), fw_text_)),
             false);
  }
  return true;
}

void VerbsConnection::fail_all(Status status, bool tell_peer) {
  if (broken_) return;
  broken_ = true;
  if (tell_peer) send_farewell(status.code(), status.message());
  if (idle()) {
    CHORUS_INFO(kNet, "{}", status.message());
  } else {
    CHORUS_WARN(kNet, "{}", status.message());
  }
  set_error(std::move(status));
  // The farewell goes out first; then the QP stops, and its flushed work requests tell that
  // the HCA no longer reads the caller's buffers (registered sends are read in place).
  if (farewell_sent_) drain(kFarewellDrainMs, [&] { return farewell_done_; });
  for (auto& qp : s_.qp.qps) qp_to_error(qp.get());
  drain(kFailDrainMs, [&] { return sq_outstanding_ == 0; });
  if (sq_outstanding_ != 0) {
    CHORUS_WARN(kNet, "verbs: rank {}: {} work request(s) on QP {:#x} to {} were not flushed "
                "within {} ms",
                s_.my_rank, sq_outstanding_, qpn(), s_.peer_label, kFailDrainMs);
  }
  sends_.fail_all();
  while (written_count_ > 0) {
    SendRequest* req = written_[written_head_].req;
    written_head_ = (written_head_ + 1) % written_.size();
    --written_count_;
    req->fail();
  }
  recvs_.fail_all();
}

std::string VerbsConnection::situation() const {
  if (!recvs_.empty()) {
    return fmt::format("while rank {} was receiving {} on verbs channel {}", s_.my_rank,
                       describe_request(recvs_.front()), s_.channel);
  }
  if (!sends_.empty() || written_count_ > 0) {
    const SendRequest* req = written_count_ > 0 ? written_[written_head_].req : sends_.front();
    return fmt::format("while rank {} was sending {} on verbs channel {}", s_.my_rank,
                       describe_request(req), s_.channel);
  }
  return fmt::format("while rank {} had nothing pending on verbs channel {}", s_.my_rank,
                     s_.channel);
}

void VerbsConnection::fail_peer_gone(const std::string& why) {
  if (broken_) return;
  fail_all(remote_error("verbs: {} {} {}", s_.peer_label, why, situation()), false);
}

Status VerbsConnection::corrupt(const RecvRequest* req, const std::string& what) const {
  return remote_error("verbs: {} sent {} on verbs channel {} while rank {} was receiving {}",
                      s_.peer_label, what, s_.channel, s_.my_rank, describe_request(req));
}

Status VerbsConnection::wc_error(const ibv_wc& wc) const {
  const bool incoming = wc.wr_id == kWrRecv;
  const uint32_t q = qp_index(wc.qp_num);
  const uint32_t peer_qpn = q < nqps() ? s_.remote_qpns[q] : 0;
  return remote_error("verbs: a {} {} {} failed on {} QP {:#x} (peer QP {:#x}): {} (status {}, "
                      "vendor error {:#x}) {}",
                      wr_name(wc.wr_id & 0xff), incoming ? "from" : "to", s_.peer_label,
                      s_.rings->device->name(), wc.qp_num, peer_qpn,
                      ibv_wc_status_str(wc.status), static_cast<int>(wc.status), wc.vendor_err,
                      situation());
}

}  // namespace chorus::verbs
