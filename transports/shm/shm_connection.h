// SPDX-License-Identifier: Apache-2.0
// File: transports/shm/shm_connection.h
// One shared-memory connection (peer, channel): a single-producer single-consumer byte FIFO in
// each direction, and the wire layout of those FIFOs. README.md describes the protocol.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/process.h"
#include "transports/protocol.h"
#include "transports/small_box.h"
#include "transports/transport.h"

namespace chorus::shm {

// Every message starts on, and is padded to, this boundary: no element straddles the wrap.
inline constexpr size_t kFifoAlign = 64;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics need lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory atomics need lock-free");

// Control block of one FIFO; ring data follows it. Wire layout (shared by processes). The two
// counters are byte positions in the stream, multiples of kFifoAlign, never wrapping (2^64
// bytes); ring offset = position % fifo_bytes. Each line has exactly one writer.
struct FifoControl {
  // Line 0, written by the producer only.
  // head: bytes published. Release store after the ring bytes before it are written; the
  // consumer's acquire load of head pairs with it.
  alignas(64) std::atomic<uint64_t> head{0};
  // Single-copy probe: the address, in the producer's process, of a word holding probe_value.
  // probe_value is written before probe_addr is stored (release); the consumer loads
  // probe_addr (acquire), then reads the word with process_vm_readv and compares.
  uint64_t probe_value = 0;
  std::atomic<uint64_t> probe_addr{0};
  // Line 1, written by the consumer only.
  // tail: bytes consumed. Release store after the consumer finished reading the ring bytes
  // before it; the producer's acquire load pairs with it before overwriting them.
  alignas(64) std::atomic<uint64_t> tail{0};
  // kCmaUnknown until the consumer probed whether it can read the producer's memory; the
  // producer sends large messages by reference only once it loads (acquire) kCmaWorks.
  std::atomic<uint32_t> cma_state{0};
  // Messages sent by reference that the consumer has finished reading (release, after its
  // last process_vm_readv); the producer's acquire load lets it complete those sends.
  std::atomic<uint64_t> by_reference_done{0};
  // Line 2, written once per side: the flags each side polls while it works, apart from the
  // lines written per message, so polling them moves no line between the cores.
  // Set (release, after the last head store) when the producer's connection is destroyed;
  // the consumer's acquire load pairs with it, then re-reads head.
  alignas(64) std::atomic<uint32_t> producer_closed{0};
  // Set (release) when the consumer's connection is destroyed; producer loads it (acquire).
  std::atomic<uint32_t> consumer_closed{0};
};
inline constexpr uint32_t kCmaUnknown = 0, kCmaWorks = 1, kCmaDenied = 2;
static_assert(sizeof(FifoControl) == 3 * kFifoAlign);

// Header of one message in the stream; the payload follows, then padding to kFifoAlign.
// A message sent by reference (kByReference) carries no payload in the ring: the consumer
// copies it from `address` in the producer's process with process_vm_readv (one copy instead
// of two), then counts it in FifoControl::by_reference_done. A payload of at most
// kInlineBytes travels inside the header (kInline): one cache line per small message.
inline constexpr size_t kInlineBytes = 16;
struct MsgHeader {
  uint32_t magic;
  uint32_t index;  // low 32 bits of the message's ordinal on this FIFO: detects a desync
  MsgTag tag;
  uint64_t bytes;  // payload bytes
  uint32_t flags;
  uint32_t reserved;
  union {
    uint64_t address;  // kByReference: the payload's address in the producer's process
    unsigned char inline_payload[kInlineBytes];  // kInline: the payload
    struct {
      uint64_t offset;  // kByMapping: where the payload starts in the producer's memfd
      uint64_t inode;   // and that memfd's inode; its fd number is in `reserved`
    } mapped;
  };
};
inline constexpr uint32_t kByReference = 1;
// A farewell (Connection::farewell): `bytes` of reason text follow, `address` holds the Status
// code; the producer has closed after it.
inline constexpr uint32_t kFarewell = 2;
inline constexpr uint32_t kInline = 4;
// With kByReference: the payload lies in a memfd of the producer (registered ncclMemAlloc
// memory); the consumer maps it (/proc/<pid>/fd/<reserved>, once per memfd) and copies or
// reduces straight from the mapping: one copy, no system call per piece.
inline constexpr uint32_t kByMapping = 8;
static_assert(sizeof(MsgHeader) == kFifoAlign);
inline constexpr uint32_t kMsgMagic = 0x4d534843;  // "CHSM"

// One FIFO as mapped in this process.
struct FifoRef {
  FifoControl* control = nullptr;
  std::byte* data = nullptr;  // fifo_bytes of ring, kFifoAlign-aligned
  uint64_t fifo_bytes = 0;    // a multiple of kFifoAlign
};

struct ShmConnectionConfig {
  int self_rank = -1;
  int peer_rank = -1;
  int peer_pid = -1;
  int channel = 0;
  FifoRef send_fifo;                      // in the peer's segment: we produce, the peer consumes
  FifoRef recv_fifo;                      // in our segment: the peer produces, we consume
  DoorbellWord* peer_doorbell = nullptr;  // the peer process's doorbell
  // Channel 0's small-message boxes (SmallBox::region_bytes() each): in the peer's segment (we
  // produce) and in ours (we consume); null on other channels.
  void* send_box = nullptr;
  void* recv_box = nullptr;
  // Owners of the memory the pointers above point into (mappings); kept alive by the connection.
  std::vector<std::shared_ptr<const void>> keep_alive;
};

// Sends and receives are matched in posting order. Not thread-safe: one thread at a time calls
// post_*(), progress() and idle() (the progress engine). progress() never blocks; it moves at
// most about one FIFO's worth of bytes per direction per call.
class ShmConnection final : public Connection {
 public:
  explicit ShmConnection(ShmConnectionConfig config);
  // Fails our pending requests and tells the peer (closed flags + doorbell), so that its
  // pending requests fail too instead of hanging.
  ~ShmConnection() override;

  void post_send(SendRequest* req) override;
  void post_recv(RecvRequest* req) override;
  bool progress() override;
  bool idle() const override {
    return sends_.empty() && recvs_.empty() && by_reference_.empty();
  }
  bool peek(MsgTag* tag, uint64_t* bytes) override;
  const char* transport_name() const override { return "shm"; }
  void farewell(const Status& why) override;
  SmallBox* small_box() override { return box_.get(); }

 private:
  bool progress_sends();
  bool progress_recvs();
  // Writes the front send's header and payload while space allows; true when it is all written.
  bool write_front(SendRequest* req, uint64_t* budget);
  // Consumes the front receive's header (if not yet) and payload; true when it is all consumed.
  bool read_front(RecvRequest* req, uint64_t* budget);
  // Checks the front receive's header, adopting the sender's size where the receive asks so.
  Status check_header(const MsgHeader& header, RecvRequest* req);
  // The header at the read position is a message of this FIFO (magic, ordinal, inline size).
  Status check_framing(const MsgHeader& header) const;
  Status check_recv_request(const RecvRequest& req) const;
  // Free bytes in the send FIFO, refreshing the cached tail when `want` bytes are not free.
  uint64_t send_space(uint64_t want);
  // Published bytes not yet consumed, refreshing the cached head when fewer than `want`.
  uint64_t recv_available(uint64_t want);
  // Messages by reference (single copy between processes).
  bool by_reference(const SendRequest& req);
  bool read_by_reference(RecvRequest* req, uint64_t* budget);
  bool by_mapping(const SendRequest& req) const;
  bool read_by_mapping(RecvRequest* req, uint64_t* budget);
  // After the last read of a message by reference: tells the producer it may reuse its buffer.
  bool finish_by_reference(const RecvRequest* req);
  // The producer's memfd `fd` (inode `inode`) mapped here, at least `end` bytes long (cached).
  Result<const std::byte*> map_producer_memfd(int fd, uint64_t inode, uint64_t end,
                                              const RecvRequest& req);
  void probe_cma();
  bool complete_by_reference_sends();
  void publish_head();  // release-stores head (the doorbell is rung by flush_head)
  void flush_head();    // publish_head + ring the peer if anything new was published
  void flush_tail();    // release-stores tail + rings the peer (a sender waiting for space)
  // Fail every pending request if the peer has closed its end of the connection and what is
  // pending can no longer complete. True if they failed (or, for the latter, bytes moved).
  bool check_consumer_closed();
  bool check_producer_closed();
  // Records the error, fails every pending request and closes both directions.
  void fail_all(Status status);
  // The peer's farewell (its header is at recv_pos_): fails everything with its reason.
  void read_farewell(const MsgHeader& header, const RecvRequest* req);
  // Publishes what was written, sets our closed flags and rings the peer. Idempotent.
  void close();

  const int self_rank_;
  const int peer_pid_;
  const FifoRef send_;
  const FifoRef recv_;
  DoorbellWord* const peer_doorbell_;
  const std::vector<std::shared_ptr<const void>> keep_alive_;
  const uint64_t publish_bytes_;  // publish progress at least every this many bytes
  std::unique_ptr<SmallBox> box_;  // channel 0 only; closes with the connection
  bool closed_ = false;

  RequestQueue<SendRequest> sends_;
  RequestQueue<RecvRequest> recvs_;
  // Sends whose header is out but whose payload the consumer still reads by reference.
  RequestQueue<SendRequest> by_reference_;
  uint64_t by_reference_completed_ = 0;  // of those, how many we completed
  const uint64_t cma_min_bytes_;     // 0: never by reference
  const uint64_t map_min_bytes_;     // 0: never by mapping
  const uint64_t stream_min_bytes_;  // a receive this large lands with streaming stores
  uint64_t probe_word_;                  // read by the consumer's probe (FifoControl::probe_*)
  // Consumer side of a message by reference being read.
  uint64_t ref_address_ = 0;             // or, by mapping, the offset in the memfd
  int ref_fd_ = -1;                       // by mapping: the producer's fd number
  uint64_t ref_inode_ = 0;
  bool recv_by_mapping_ = false;
  const std::byte* ref_view_ = nullptr;   // by mapping: the payload, mapped here
  // The producer's memfds mapped here, most recently used last (a few: one per buffer).
  struct ProducerMemfd {
    int fd;
    uint64_t inode;
    Mapping mapping;
  };
  std::vector<ProducerMemfd> producer_memfds_;
  uint64_t ref_done_ = 0;                // payload bytes copied
  uint64_t ref_finished_ = 0;            // by-reference messages read, ever
  std::unique_ptr<std::byte[]> bounce_;  // staging for reducing receives

  // Producer state (send_ FIFO). Positions are stream byte counts (see FifoControl).
  uint64_t send_pos_ = 0;        // written locally, published or not
  uint64_t head_published_ = 0;  // last value stored to send_.control->head
  uint64_t head_rung_ = 0;       // last head value the peer was rung for
  uint64_t tail_cached_ = 0;     // last value loaded from send_.control->tail
  uint64_t send_cursor_ = 0;     // bytes of the front message written (header included)
  bool send_by_reference_ = false;  // the front message goes by reference
  bool send_inline_ = false;        // the front message's payload is in its header
  uint32_t send_index_ = 0;      // ordinal of the front message

  // Consumer state (recv_ FIFO).
  uint64_t recv_pos_ = 0;        // consumed locally, released or not
  uint64_t tail_published_ = 0;  // last value stored to recv_.control->tail
  uint64_t head_cached_ = 0;     // last value loaded from recv_.control->head
  uint64_t recv_cursor_ = 0;     // bytes of the front message consumed (header included)
  bool recv_by_reference_ = false;  // the front message is read by reference
  uint32_t recv_index_ = 0;      // ordinal of the front message
};

}  // namespace chorus::shm
