// SPDX-License-Identifier: Apache-2.0
// File: transports/transport.h
// The transport interface: mechanisms that move bytes between two ranks, no policy.
//
// A Connection is one reliable, ordered channel from this rank to one peer (a comm has
// `channels` of them per peer: the paths of the chunk layer, transports/chunk.h). A receive
// posted on a connection takes the next message that arrives on it; peek() shows that message
// first, so the chunk layer posts the receive it belongs to. Every message carries a MsgTag that
// the receiver checks, so that a rank calling a different collective gets a clear error instead
// of garbage.
//
// Requests are owned by the caller (they live in coroutine frames) and must stay alive until
// they complete. Nothing here blocks: progress() moves what it can and returns.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/reduce/reduce.h"

namespace chorus {

// Largest farewell text (see Connection::farewell) a transport sends or accepts.
inline constexpr size_t kMaxFarewellBytes = 2048;

// What the sender was doing when it produced a message; the receiver compares it with what it
// is doing itself. 24 bytes, sent on the wire.
//
// It also names the chunk a message is (transports/chunk.h): which message of the operation
// between the pair (`lane`, `ordinal`) and which piece of it (`chunk`, kLastChunk). Equality
// compares the operation only.
struct MsgTag {
  static constexpr uint8_t kLastChunk = 1;  // flags: no chunk of the message follows this one
  static constexpr uint32_t kChunkBits = 18, kOrdinalBits = 8, kLaneBits = 6;
  static constexpr uint32_t kMaxChunks = 1u << kChunkBits;
  static constexpr uint32_t kMaxLanes = 1u << kLaneBits;

  uint32_t seq = 0;    // collective sequence number, or per-peer p2p sequence number
  uint8_t coll = 0;    // CollKind
  uint8_t dtype = 0;   // DataType
  uint8_t redop = 0;   // RedOpKind
  uint8_t flags = kLastChunk;
  int32_t root = -1;   // root or peer, -1 when not applicable
  uint32_t chunk_id = 0;  // chunk index | ordinal << kChunkBits | lane << (kChunkBits + kOrdinalBits)
  uint64_t count = 0;  // the count argument of the call
  bool operator==(const MsgTag& o) const {
    return seq == o.seq && coll == o.coll && dtype == o.dtype && redop == o.redop &&
           root == o.root && count == o.count;
  }
  bool operator!=(const MsgTag& o) const { return !(*this == o); }

  // Which piece of which message: `lane` (the channel the algorithm posted it on), `ordinal`
  // (the how-manieth message of the operation between the pair on that lane, modulo 256) and
  // `chunk` (its index in the message).
  uint32_t chunk() const { return chunk_id & (kMaxChunks - 1); }
  uint32_t ordinal() const { return (chunk_id >> kChunkBits) & ((1u << kOrdinalBits) - 1); }
  uint32_t lane() const { return chunk_id >> (kChunkBits + kOrdinalBits); }
  bool last_chunk() const { return (flags & kLastChunk) != 0; }
  void set_message(uint32_t lane, uint32_t ordinal) {
    chunk_id = (lane & (kMaxLanes - 1)) << (kChunkBits + kOrdinalBits) |
               (ordinal & ((1u << kOrdinalBits) - 1)) << kChunkBits;
    flags = kLastChunk;
  }
  void set_chunk(uint32_t index, bool last) {
    chunk_id = (chunk_id & ~(kMaxChunks - 1)) | (index & (kMaxChunks - 1));
    flags = last ? kLastChunk : 0;
  }
};
static_assert(sizeof(MsgTag) == 24);

// "AllReduce #12 (count 1024, float, sum)".
std::string describe_tag(const MsgTag& tag);
// One message of an operation: "AllReduce #12 (count 1024, float, sum) in a message of 1024
// bytes". A message is often a part of the call (a ring step: 1/nranks of it); "(count 1024,
// float, sum) (1024 bytes)" read as if the call were 1024 bytes. `at_least`: the sender's size
// is not known yet (a chunk that is not the last).
std::string describe_message(const MsgTag& tag, uint64_t bytes, bool at_least = false);

class RegistrationKey;  // transports/registration_key.h
class SmallBox;         // transports/small_box.h

struct Request {
  enum : uint32_t { kPending = 0, kDone = 1, kFailed = 2 };
  std::atomic<uint32_t> state{kPending};
  int peer = -1;
  bool is_send = false;
  size_t bytes = 0;                    // message size
  std::atomic<size_t> bytes_done{0};   // for diagnostics of stuck operations
  MsgTag tag;
  // When the chunk layer posted it and saw it complete (now_ns()); set for messages it cut
  // into chunks and for the chunks themselves, 0 otherwise.
  int64_t posted_ns = 0;
  int64_t done_ns = 0;
  // Set when the buffer (a send's buf, a receive's dst) lies in memory registered with the
  // communicator: the key this connection's transport made for that registration (its factory,
  // TransportInstance::key_factory), valid until the request completes. Null otherwise.
  const RegistrationKey* key = nullptr;

  bool done() const { return state.load(std::memory_order_acquire) != kPending; }
  bool failed() const { return state.load(std::memory_order_acquire) == kFailed; }
  void complete() { state.store(kDone, std::memory_order_release); }
  void fail() { state.store(kFailed, std::memory_order_release); }
  void reset() {
    state.store(kPending, std::memory_order_relaxed);
    bytes_done.store(0, std::memory_order_relaxed);
    posted_ns = done_ns = 0;
  }
};

// Where a buffer lies in memory that same-host peers can map: byte `offset` of the memfd that
// is `fd` in the owner's process, whose inode is `inode` (fd numbers are reused; the inode
// tells a stale mapping from a current one). fd -1: not in such memory.
struct MemfdLocation {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t inode = 0;
};

struct SendRequest : Request {
  SendRequest() { is_send = true; }
  const void* buf = nullptr;
  // Set when buf lies in registered ncclMemAlloc memory: a same-host transport may let the
  // receiver read it through its own mapping (one copy), holding the send until it has.
  MemfdLocation memfd;
};

// Receives `bytes` into dst. With `reduce` set, combines instead of copying:
// dst[i] = reduce(src[i], incoming[i]) element-wise (dst may equal src).
//
// With `size_from_sender`, the sender decides how much arrives (MoE dispatch, where a rank
// learns how many tokens a peer routes to it only from the peer): `bytes` is the capacity when
// posted; once the message's header arrives, the transport sets `bytes` to the size sent (at
// most the capacity, else the receive fails with kInvalidUsage) and `tag.count` to the
// sender's count. Not with `reduce`.
struct RecvRequest : Request {
  bool size_from_sender = false;
  void* dst = nullptr;
  const void* src = nullptr;
  kernels::ReduceFn reduce = nullptr;
  size_t elem_size = 1;
};

class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const { return peer_; }
  int channel() const { return channel_; }

  // Queue a request. Never blocks; the request completes (or fails) during progress(), of this
  // connection or of the peer's side (direct memory transfers are done by the receiver).
  virtual void post_send(SendRequest* req) = 0;
  virtual void post_recv(RecvRequest* req) = 0;
  // Moves data. Returns true if anything changed. On failure every pending request fails and
  // error() says why, naming the peer.
  virtual bool progress() = 0;
  // True when no request is pending on this side.
  virtual bool idle() const = 0;
  const Status& error() const { return error_; }
  // A file descriptor to poll while sleeping, or -1 when the peer rings the doorbell instead.
  virtual int poll_fd(short* events) const {
    (void)events;
    return -1;
  }
  // The next incoming message, once its header has arrived, while no receive is posted here:
  // its tag and size, without consuming it (the chunk layer then posts the receive it belongs
  // to). False while nothing has arrived, while a receive is posted, or once the connection
  // failed (error() says why; a peer's farewell fails it too). Moves incoming bytes as
  // progress() does, and keeps the connection polled for input until a receive is posted.
  virtual bool peek(MsgTag* tag, uint64_t* bytes) = 0;
  virtual const char* transport_name() const = 0;
  // Best effort, before closing because of `why`: tells the peer why this side gives up, so
  // that its pending receive fails with our reason and code (a mismatch stays ncclInvalidUsage
  // on both sides) instead of a bare "connection closed". Only possible between messages; the
  // connection is unusable afterwards.
  virtual void farewell(const Status& why) { (void)why; }
  // What the network holds of this connection's sends, for routing chunks (transports/chunk.h):
  // bytes handed to the kernel and not yet acknowledged by the peer, and the rate at which the
  // peer has lately been acknowledging them (bytes per ns; 0: not measured yet). False when
  // the transport cannot tell (the chunk layer then judges a path by its completions alone).
  struct PathState {
    uint64_t unacked_bytes = 0;
    double delivery_rate = 0;
    double rtt_ns = 0;  // smoothed round-trip time, 0 when not known
  };
  virtual bool path_state(PathState* out) const {
    (void)out;
    return false;
  }
  // Asked every CHORUS_LIVENESS_MS while an operation waits on this connection's peer: false
  // when the transport can tell that the peer stopped answering (TCP: data sent and not
  // acknowledged for CHORUS_PEER_TIMEOUT_MS: its host is gone or every route to it is down).
  // The connection has then failed: error() names the peer and says so.
  virtual bool check_alive() { return error_.ok(); }
  // True once the path broke and the transport carries its traffic on another path to the same
  // peer (TCP failover): its requests go on working, at the other path's pace.
  virtual bool failed_over() const { return false; }
  // Where the path runs, for humans (TCP: "local address -> peer address"); empty if nothing
  // to say.
  virtual std::string path_name() const { return {}; }
  // The small-message box to the same peer beside this connection (transports/small_box.h),
  // or null when the transport has none. Shared memory offers one on channel 0; it lives as
  // long as the connection and closes with it.
  virtual SmallBox* small_box() { return nullptr; }
  // Not OK once the peer closed this path in order while nothing of ours was posted on it (its
  // communicator went away between messages, or its process exited): nothing more will arrive
  // on it. That alone is no failure of the path: what the peer sent on its other paths before
  // closing may still be on its way (over TCP a FIN on one rail can overtake data on another,
  // and a memory transport may be looked at in the wrong order), so the chunk layer fails a
  // waiting receive only once every path to the peer is closed or failed. A request posted on
  // the path afterwards fails with this reason (error() then says it too).
  const Status& peer_closed() const { return peer_closed_; }

 protected:
  Connection(int peer, int channel) : peer_(peer), channel_(channel) {}
  // Records the first error; the caller then fails its pending requests.
  void set_error(Status status) {
    if (error_.ok()) error_ = std::move(status);
  }
  // Records that the peer closed in order (peer_closed()); the first reason stays.
  void set_peer_closed(Status why) {
    if (peer_closed_.ok()) peer_closed_ = std::move(why);
  }

 private:
  int peer_;
  int channel_;
  Status error_;
  Status peer_closed_;
};

}  // namespace chorus
