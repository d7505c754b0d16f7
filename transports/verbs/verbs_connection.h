// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_connection.h
// One verbs connection (peer, channel): RC QPs whose messages travel as RDMA WRITE_WITH_IMM
// into a credit-controlled ring of slots on the receiver, or, for large messages between
// registered buffers, straight into the receiver's buffer (rendezvous). README.md has the
// protocol.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transports/protocol.h"
#include "transports/registration_key.h"
#include "transports/transport.h"
#include "transports/verbs/verbs_device.h"
#include "transports/verbs/verbs_qp.h"
#include "transports/verbs/verbs_stats.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {

// The registered memory of one instance: every connection's receive ring (peers write into
// it) and send staging ring, each [rank * channels + channel] of ring_stride() bytes. Members
// go MRs first, then the memory, then the device.
struct Rings {
  std::shared_ptr<Device> device;
  void* rx = nullptr;
  void* tx = nullptr;
  size_t bytes = 0;  // of each of rx and tx
  IbvPtr<ibv_mr> rx_mr;
  IbvPtr<ibv_mr> tx_mr;
  ~Rings();
};

// A registered range's MR (a RegistrationKey): sends from it skip the copy into the staging
// slot, or go zero copy; receives into it take rendezvous messages zero copy when the peer may
// write it (`remote_write`: read-only memory registers without). Holds the device, so the PD
// outlives the MR.
class MrKey final : public RegistrationKey {
 public:
  MrKey(std::shared_ptr<Device> device, IbvPtr<ibv_mr> mr, bool remote_write)
      : device_(std::move(device)), mr_(std::move(mr)), remote_write_(remote_write) {}
  const ibv_mr* mr() const { return mr_.get(); }
  bool remote_write() const { return remote_write_; }

 private:
  std::shared_ptr<Device> device_;
  IbvPtr<ibv_mr> mr_;
  bool remote_write_;
};

struct ConnectionSetup {
  std::shared_ptr<Rings> rings;
  QpResources qp;  // its QPs in RTS
  int my_rank = -1;
  int peer = -1;
  int channel = 0;
  std::string peer_label;  // "rank 1 (host h, pid p)"
  uint64_t comm_uid = 0;
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;
  uint8_t* rx_ring = nullptr;  // ours for (peer, channel): slots, then the aux area
  uint8_t* tx_ring = nullptr;  // staging, same layout
  uint64_t remote_ring = 0;    // the peer's ring for (us, channel)
  uint32_t remote_rkey = 0;
  std::vector<uint32_t> remote_qpns;  // the peer's QP for each of ours
  // Messages of at least this many bytes from registered memory are announced (rendezvous);
  // 0: never. Zero-copy writes are cut into pieces of at most max_write bytes
  // (VerbsConnection::kZeroCopyPieceBytes, or less where the port's max message is smaller).
  uint64_t rdv_bytes = 0;
  uint32_t max_write = 256 << 10;
  std::shared_ptr<ByteCounters> counters;  // the instance's
};

// Not thread-safe: post_*, progress() and the queries come from one thread at a time.
// Requests complete in posting order per direction.
class VerbsConnection final : public Connection {
 public:
  // Posts the receives and the hello; connected() tells when the peer's hello arrived.
  explicit VerbsConnection(ConnectionSetup setup);
  // Says goodbye (a farewell with code kOk), waits briefly for it, moves the QP to ERR and
  // drains its completions before the QP goes (never hangs on a dead peer).
  ~VerbsConnection() override;

  void post_send(SendRequest* req) override;
  void post_recv(RecvRequest* req) override;
  bool progress() override;
  bool idle() const override {
    return sends_.empty() && written_count_ == 0 && recvs_.empty();
  }
  // The completion channel's fd, armed; an always-readable fd while completions wait.
  int poll_fd(short* events) const override;
  bool peek(MsgTag* tag, uint64_t* bytes) override;
  const char* transport_name() const override { return "verbs"; }
  void farewell(const Status& why) override;

  // Setup: true once our hello was delivered and the peer's arrived and was checked.
  bool connected() const {
    return hellos_sent_ == nqps() && hellos_received_ == (uint32_t{1} << nqps()) - 1;
  }
  uint32_t qpn() const { return s_.qp.qps[0]->qp_num; }  // the first
  uint32_t nqps() const { return static_cast<uint32_t>(s_.qp.qps.size()); }
  const std::string& peer_label() const { return s_.peer_label; }
  // The side channel (verbs_side.h) says the peer is gone: fails every pending request with
  // kRemoteError "verbs: <peer> <why> <what this rank was doing>".
  void fail_peer_gone(const std::string& why);

 private:
  enum WrKind : uint64_t {
    kWrSlot = 1,
    kWrCredit,
    kWrHello,
    kWrFarewell,
    kWrRecv = kRecvWrId,
    kWrReply,
    kWrZeroCopy,
  };
  static_assert(kWrRecv == 5);
  static constexpr int kBatch = 32;

 public:
  // A zero-copy message is written in pieces of at most kZeroCopyPieceBytes, at most
  // kZeroCopyWritesPerQp of them outstanding per QP that carries a part. The bound is for the
  // other direction: our replies to the peer's announcements and our credits go over QP 0
  // behind whatever data we have posted there, and while the peer waits for a reply it sends
  // nothing. With whole 1 MiB pieces, 8 outstanding, a 4 MiB message in each direction made
  // the two directions take turns (soft-RoCE guest, sendrecv_lat -m bibw, 4 MiB: 43-52 MB/s
  // against ib_write_bw -b's 85; 2 x 256 KiB: 74-86). 512 KiB in flight per QP is still well
  // above a real link's bandwidth-delay product (200 Gbit/s x 10 us = 250 KB).
  static constexpr uint32_t kZeroCopyPieceBytes = 256 << 10;
  static constexpr uint32_t kZeroCopyWritesPerQp = 2;
  // Work requests beyond the ring's slots that a connection may have outstanding: a credit,
  // the hello, the farewell, rendezvous replies, zero-copy writes. QPs are sized for them.
  static constexpr uint32_t kMaxZeroCopyWrites = kZeroCopyWritesPerQp * kMaxQpsPerConnection;
  static constexpr uint32_t kExtraSendWrs = 3 + 2 + kMaxZeroCopyWrites;
  static constexpr uint32_t kExtraRecvWrs = 2 + 2 + 2;

 private:
  // Where the front send is: not begun; cut into slots; announced and waiting for the reply;
  // being written straight into the receiver's buffer.
  enum class SendPhase { kFresh, kSlots, kAwaitReply, kZeroCopy };
  struct Written {
    SendRequest* req;
    uint64_t slots;   // tx_seq_ after its last slot
    uint64_t writes;  // zc_posted_ after its last zero-copy write
  };

  size_t payload_bytes() const { return s_.slot_bytes - kSlotHeaderBytes; }
  uint8_t* rx_slot(uint64_t seq) const { return s_.rx_ring + (seq % s_.slots) * s_.slot_bytes; }
  uint8_t* tx_slot(uint64_t seq) const { return s_.tx_ring + (seq % s_.slots) * s_.slot_bytes; }
  uint8_t* rx_aux() const { return s_.rx_ring + size_t{s_.slots} * s_.slot_bytes; }
  uint8_t* tx_aux() const { return s_.tx_ring + size_t{s_.slots} * s_.slot_bytes; }

  // Posts one send work request on the first QP into the peer's ring area for us at
  // `remote_offset` (post_write: on QP `q`, to `remote_addr` of `rkey`, with `wr_id` = a kind
  // and, for slots, the sequence number << 8); false (connection failed) if the driver refuses.
  bool post_wr(WrKind kind, ibv_wr_opcode opcode, uint32_t imm, ibv_sge* sge, int nsge,
               uint64_t remote_offset);
  bool post_write(uint32_t q, uint64_t wr_id, ibv_wr_opcode opcode, uint32_t imm, ibv_sge* sge,
                  int nsge, uint64_t remote_addr, uint32_t rkey, unsigned extra_flags = 0);
  bool post_receive(uint32_t q);
  // Which of our QPs `qp_num` is (nqps() when none).
  uint32_t qp_index(uint32_t qp_num) const;
  bool poll_cq();
  bool on_completion(const ibv_wc& wc);
  bool on_receive(const ibv_wc& wc, uint32_t q);
  bool on_slot(uint32_t imm, uint32_t q, const RecvRequest* front);
  bool check_hello(uint32_t q);
  // The peer has consumed `consumed` of our slots (a credit, or one carried by a slot): fails
  // the connection if that is more than were sent; an older count changes nothing.
  bool take_credit(uint64_t consumed);
  void read_farewell();
  bool progress_sends();
  // The front send's next work request by its phase; false when it must wait.
  bool send_slot(SendRequest* req);
  bool send_zero_copy(SendRequest* req);
  bool take_reply(SendRequest* req);
  void finish_send(SendRequest* req);
  bool progress_recvs();
  // The front receive's answer to an announcement: zero copy when its buffer allows.
  bool answer_announcement(RecvRequest* req, const SlotHeader& h);
  void maybe_send_credit();
  void send_farewell(Code code, const std::string& reason);
  bool check_gone(bool peeking = false);
  // Records why the connection broke (logged once), tells the peer if `tell_peer`, stops the
  // QP so that the HCA lets go of the caller's buffers, and fails every pending request.
  void fail_all(Status status, bool tell_peer);
  // Polls completions for up to `ms` until `done()`; only bookkeeping, no data moves.
  template <typename Done>
  void drain(int ms, Done done);

  Status corrupt(const RecvRequest* req, const std::string& what) const;
  Status wc_error(const ibv_wc& wc) const;
  std::string situation() const;

  ConnectionSetup s_;
  bool broken_ = false;
  bool closing_ = false;
  bool farewell_sent_ = false;
  bool farewell_done_ = false;
  uint32_t hellos_sent_ = 0;      // delivered, one per QP
  uint32_t hellos_received_ = 0;  // bit q: the peer's hello over QP q came
  uint32_t sq_outstanding_ = 0;   // send work requests not completed
  uint32_t credit_threshold_ = 1;

  // Sending: sends_ are posted and not yet cut into slots completely (front: send_offset_
  // bytes are); written_ hold requests all of whose slots are posted, with the slot count after
  // their last, until that slot's write completes.
  RequestQueue<SendRequest> sends_;
  size_t send_offset_ = 0;
  std::vector<Written> written_;
  size_t written_head_ = 0;
  size_t written_count_ = 0;
  // Slot s goes over QP s % nqps(); their writes complete in order per QP only.
  uint64_t tx_seq_ = 0;     // slots posted
  uint64_t tx_done_ = 0;    // slot writes completed, all those before too
  std::vector<uint8_t> tx_landed_;  // [seq % slots]: completed beyond tx_done_
  uint64_t tx_credit_ = 0;  // slots the peer has consumed (its credits)
  SendPhase send_phase_ = SendPhase::kFresh;
  uint64_t announce_seq_ = 0;   // the front send's announcing slot
  bool reply_arrived_ = false;  // the peer's RdvReply to it is in our aux area
  uint64_t zc_addr_ = 0;        // the front send's zero-copy destination
  uint32_t zc_rkey_ = 0;
  ZeroCopySplit zc_split_;      // its parts, one per QP
  uint64_t zc_piece_ = 0;       // the next piece to consider (round robin over the parts)
  uint64_t zc_posted_ = 0;      // zero-copy writes posted
  uint64_t zc_done_ = 0;        // and completed

  // Receiving: slots [rx_seq_, rx_arrived_) have landed and wait to be consumed; later ones
  // that came over other QPs first are marked in rx_landed_. rx_next_[q]: the slot due over
  // QP q.
  RequestQueue<RecvRequest> recvs_;
  uint64_t rx_seq_ = 0;
  uint64_t rx_arrived_ = 0;
  std::vector<uint8_t> rx_landed_;
  std::vector<uint64_t> rx_next_;
  bool rx_in_message_ = false;  // the front receive accepted its message's first slot
  uint64_t rx_offset_ = 0;
  uint64_t rx_total_ = 0;
  uint64_t credit_sent_ = 0;
  bool credit_in_flight_ = false;
  // The front receive answered an announcement (slot rx_announce_seq_) with its address and
  // waits for the last zero-copy write over each QP in rx_owed_ (rx_done_ once all came).
  bool rx_zero_copy_ = false;
  bool rx_done_ = false;
  uint32_t rx_owed_ = 0;
  uint64_t rx_announce_seq_ = 0;

  bool fw_arrived_ = false;
  uint32_t fw_wire_code_ = 0;  // the farewell's Status code; 0: a goodbye
  std::string fw_text_;

  // Completions poll_fd() found after arming; progress() handles them first.
  mutable std::array<ibv_wc, kBatch> stash_{};
  mutable int stash_n_ = 0;
};

}  // namespace chorus::verbs
