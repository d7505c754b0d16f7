// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_connection.h
// One TCP connection (peer, channel): ordered, tagged messages over a non-blocking socket.
// Each message is a 40-byte header (magic, tag, payload bytes) followed by the payload.
// Connections to one peer over several rails form a group that fails over: when one of them
// breaks, its traffic continues through a sibling (README.md, "Failover").
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "net/socket.h"
#include "common/unique_fd.h"
#include "transports/protocol.h"
#include "transports/transport.h"

namespace chorus::tcp {

// Header of one message on the wire (host byte order; the magic exposes a mismatch).
struct WireHeader {
  uint32_t magic;
  uint32_t reserved;
  MsgTag tag;
  uint64_t bytes;  // payload bytes that follow
};
static_assert(sizeof(WireHeader) == 40);
inline constexpr uint32_t kWireMagic = 0x43484d54;  // "CHMT"
// A farewell: `reserved` holds the Status code, `bytes` the length of the reason text that
// follows (<= kMaxFarewellBytes); the sender closes after it.
inline constexpr uint32_t kFarewellMagic = 0x43484657;  // "CHFW"
// Failover control frames (README.md, "Failover"); `reserved` holds the channel they are about.
// Abandon: the sender gave up on that channel; its 8-byte payload is how many bytes of that
// channel's incoming stream the sender read. Tunnel: the payload continues that channel's
// stream (the sender's bytes for it, from where the peer said it stopped reading). Switch: the
// channel's stream continues on its new socket from the byte in the 8-byte payload on.
inline constexpr uint32_t kAbandonMagic = 0x43484142;  // "CHAB"
inline constexpr uint32_t kTunnelMagic = 0x4348544e;   // "CHTN"
inline constexpr uint32_t kSwitchMagic = 0x43485357;   // "CHSW"
inline constexpr bool is_failover_frame(uint32_t magic) {
  return magic == kAbandonMagic || magic == kTunnelMagic || magic == kSwitchMagic;
}

// Bytes in order: appended at the back, taken from the front; grows by doubling, no zero fill.
class ByteQueue {
 public:
  size_t size() const { return end_ - begin_; }
  bool empty() const { return end_ == begin_; }
  const uint8_t* data() const { return buf_.get() + begin_; }
  // Room for `n` more bytes at the back; commit() what was written there.
  uint8_t* tail(size_t n);
  void commit(size_t n) { end_ += n; }
  void append(const void* src, size_t n);
  // Up to `n` bytes from the front into dst (which may be null: dropped); returns how many.
  size_t take(void* dst, size_t n);
  void clear() { begin_ = end_ = 0; }

 private:
  std::unique_ptr<uint8_t[]> buf_;
  size_t cap_ = 0, begin_ = 0, end_ = 0;
};

class TcpConnection;
class TcpMender;
// The connections to one peer, by channel, that stand in for each other.
struct TcpPeerGroup {
  ~TcpPeerGroup();
  std::mutex mutex;  // guards `members` against a connection's destruction (for the mender)
  std::vector<TcpConnection*> members;
  bool failed_over = false;  // a member is abandoned (carriers read ahead until none is)
  std::shared_ptr<TcpMender> mender;  // reconnects abandoned members; may be null
};

// Not thread-safe: post_*, progress() and the queries must come from one thread at a time
// (the progress engine's). Requests complete in posting order per direction.
class TcpConnection final : public Connection {
 public:
  // Takes a connected, authenticated, non-blocking socket. `peer_addr`, `peer_label` (host
  // and pid, may be empty) and the ranks name the peer in error messages; `bounce_bytes` sizes
  // the staging buffer of reducing receives (allocated on the first one).
  TcpConnection(UniqueFd fd, int my_rank, int peer, int channel, const net::SockAddr& peer_addr,
                size_t bounce_bytes, const std::string& peer_label = {});
  ~TcpConnection() override;

  void post_send(SendRequest* req) override;
  void post_recv(RecvRequest* req) override;
  bool progress() override;
  bool idle() const override { return sends_.empty() && recvs_.empty(); }
  // POLLIN while a receive is pending, POLLOUT while send bytes are pending, and POLLRDHUP
  // whenever anything is pending, so that a peer that goes away wakes the poller. -1 after an
  // error.
  int poll_fd(short* events) const override;
  bool peek(MsgTag* tag, uint64_t* bytes) override;
  const char* transport_name() const override { return "tcp"; }
  void farewell(const Status& why) override;
  // SIOCOUTQ and TCP_INFO's delivery rate.
  bool path_state(PathState* out) const override;
  // Unacknowledged data (TCP_INFO: packets out) and no acknowledgement for
  // CHORUS_PEER_TIMEOUT_MS. A receiver that does not read (a zero window) still acknowledges
  // the kernel's window probes, so a slow peer is not taken for a gone one. An idle connection
  // is covered by keepalive (net::set_keepalive) instead.
  bool check_alive() override;
  std::string path_name() const override { return path_name_; }
  // Joins the connections to the same peer on other rails (each channel once): from then on
  // this one keeps a copy of what it sent until the peer's kernel acknowledged it, so that a
  // failure of this path can be survived by resending over a sibling.
  void join_group(std::shared_ptr<TcpPeerGroup> group);
  // Reads this grouped connection's socket ahead, as a carrier does: its own messages are
  // queued for the reader in order, the failover frames about its siblings are acted on at once
  // (check_alive calls it on the carrier when a sibling stops being acknowledged).
  void read_ahead();
  // Abandoned after a failure: the traffic now goes (either way) through a sibling.
  bool abandoned() const { return tx_tunnel_ || rx_fed_; }
  bool failed_over() const override { return abandoned() && !broken_; }
  // For the mender (any thread): the path waits for a new socket; this rank opens it (the
  // lower rank, as at setup) at the peer's listening address for this channel; a new socket,
  // authenticated and identified, for it.
  bool wants_socket() const { return wants_socket_.load(std::memory_order_acquire); }
  bool connects() const { return my_rank_ < peer(); }
  const net::SockAddr& peer_sockaddr() const { return peer_sockaddr_; }
  void offer_socket(UniqueFd fd);

 private:
  static constexpr size_t kMaxBatch = 16;  // send requests gathered into one sendmsg()
  static constexpr size_t kRxBufferBytes = 8192;  // read-ahead of headers and short payloads

  bool progress_sends();
  bool progress_recvs();
  // Up to `want` incoming bytes into dst: what the read-ahead buffer holds first, else one
  // recv() (into the buffer when `want` is short). As recv_nb: bytes (> 0), 0 when nothing has
  // arrived, -1 with *err (0: an orderly EOF, once everything before it was taken).
  ssize_t take(void* dst, size_t want, int* err);
  // Reads the header of the next message (for `req`, which may be null: named in errors).
  // False when it is not complete yet, or when the connection failed (a farewell, corruption).
  bool fill_header(const RecvRequest* req, bool* moved);
  // fill_header, then the header is checked against the front receive (once per message).
  bool read_header(RecvRequest* req, bool* moved);
  bool read_plain(RecvRequest* req, bool* moved);
  bool read_reduce(RecvRequest* req, bool* moved);
  // The peer's farewell (rx_header_ has its header): fails everything with its reason.
  void read_farewell(const RecvRequest* req);
  // True while the peer has not closed; used when sends are stuck on a full socket.
  bool peer_alive();
  // Records why the connection broke (logged once) and fails every pending request.
  void fail_all(Status status);
  // The error for errno `err` (0: orderly EOF) while `req` was in flight.
  Status io_error(int err, const Request* req, const char* doing) const;
  // A failure of the path itself (not of the peer's process or of the caller's use): abandons
  // the path when a sibling can carry its traffic, else fail_all().
  void path_failed(Status status);

  // ---- Failover (tcp_failover.cc) ----
  // The socket's stream: bytes read from it, all time; writes (a copy kept while grouped).
  ssize_t raw_take(void* dst, size_t want, int* err);
  ssize_t write_out(const iovec* iov, size_t n_iov, size_t total, int* err);
  // Drops the kept copy of what the peer's kernel acknowledged (SIOCOUTQ).
  void release_acked();
  bool can_fail_over() const;
  // The lowest channel of the group still working on its own socket (not this one), or null:
  // where a path that fails now sends its traffic.
  TcpConnection* carrier() const;
  // An abandoned path's carrier, chosen when it failed (via_), even if that one failed since:
  // its stream, with this path's frames in it, continues through its own carrier.
  TcpConnection* via() const;
  // The connection at the end of the chain of carriers that works on its own socket (this one
  // when it is not abandoned), or null.
  TcpConnection* live_via() const;
  // Reads ahead every member that reads its own socket through the pump; frames for fed
  // members are passed on at once (nested). Then a member whose socket failed under its pump
  // is failed over (or fails the group).
  bool pump_group();
  // This path failed: reads what its socket still holds, tells the peer (over the carrier) how
  // far it read, and from then on sends and receives through the carrier.
  void abandon(Status why);
  // The peer read `consumed` bytes of this path's outgoing stream: the rest goes again,
  // through the carrier, then everything after it.
  void on_peer_abandon(uint64_t consumed);
  // Appends a control frame about `channel` to this connection's outgoing control queue
  // (sent ahead of the next message) and tries to send it.
  void push_control(uint32_t magic, int channel, const void* payload, size_t bytes);
  bool flush_control();
  // Abandoned: the outgoing stream continues as tunnel frames on the carrier. Bytes accepted.
  size_t tunnel_out(const iovec* iov, size_t n_iov, size_t total);
  // Finds the interface this connection's socket leaves by (local_ifname_).
  void note_interface();
  // Takes the socket the mender offered; once the peer knows where to resume, the outgoing
  // stream moves onto it (a Switch frame on the carrier says from which byte).
  void adopt_socket();
  void switch_tx();
  // Both directions back on a socket of their own: the group may fail over again.
  void maybe_recovered();
  // Carrier: reads its socket ahead of its own receives, so that control frames behind
  // messages nobody has asked for yet are seen; its own messages wait in own_q_.
  void start_demux();
  // Back to reading the socket directly once the group has no abandoned path left and the
  // pump stands between two frames with nothing of ours read ahead.
  void leave_demux();
  bool pump();
  // When the first member of a group closes without an error (the communicator goes away):
  // the control queues still hold tunnelled messages whose sends completed, so they go out
  // first, for up to CHORUS_PEER_TIMEOUT_MS (5 s at most) while the peer reads.
  void flush_group();
  // The pump's source: the socket, or once abandoned what its carriers passed on (feed_),
  // until the stream moves back onto a new socket. As raw_take.
  ssize_t stream_take(void* dst, size_t want, int* err);
  void fail_group(const Status& status);

  UniqueFd fd_;
  int my_rank_;
  net::SockAddr peer_sockaddr_;  // where the peer listens for this channel (when connects())
  std::string peer_addr_;
  std::string path_name_;  // "local address -> peer address"
  std::string local_ifname_;  // a grouped connection's local interface (note_interface)
  size_t bounce_bytes_;
  bool broken_ = false;
  bool farewell_sent_ = false;
  bool closing_on_error_ = false;  // farewell() was called: no flush_group() when closing

  RequestQueue<SendRequest> sends_;
  size_t send_off_ = 0;  // bytes of the front send (header included) already sent

  RequestQueue<RecvRequest> recvs_;
  WireHeader rx_header_{};
  size_t rx_header_got_ = 0;
  bool rx_accepted_ = false;  // the front receive accepted rx_header_
  bool peeking_ = false;      // peek() waits for a header: poll for input
  size_t rx_payload_got_ = 0;  // payload bytes read (or reduced) for the front receive
  std::unique_ptr<uint8_t[]> bounce_;
  size_t bounce_fill_ = 0;  // bytes in bounce_ (a partial element carried over)
  // Bytes read from the socket and not yet taken: rx_buf_[rx_buf_pos_, rx_buf_len_).
  std::unique_ptr<uint8_t[]> rx_buf_;
  size_t rx_buf_pos_ = 0, rx_buf_len_ = 0;
  bool rx_drained_ = false;  // the last recv() found nothing: poll() before the next

  // Failover.
  std::shared_ptr<TcpPeerGroup> group_;
  uint64_t tx_written_ = 0;  // bytes of the outgoing stream written (or tunnelled), all time
  ByteQueue tx_keep_;        // grouped: the written bytes from tx_keep_from_ on
  uint64_t tx_keep_from_ = 0;
  ByteQueue ctl_q_;          // whole control frames to send before the next message
  uint64_t rx_total_ = 0;    // bytes read from the socket, all time
  bool demux_ = false;       // carrier: the socket is read through pump()
  ByteQueue own_q_;          // demux: this connection's own stream, read ahead
  WireHeader pump_hdr_{};
  size_t pump_hdr_got_ = 0;
  bool pump_in_frame_ = false;  // pump_hdr_ is read; pump_left_ payload bytes follow
  uint64_t pump_left_ = 0;
  uint8_t pump_ctl_[8] = {};
  size_t pump_ctl_got_ = 0;
  int pump_err_ = -1;        // the socket failed (errno, 0: EOF) once own_q_ is empty
  bool tx_tunnel_ = false;   // outgoing bytes go as tunnel frames on the carrier
  bool rx_fed_ = false;      // incoming bytes come from feed_ (drained, then tunnelled)
  int via_ = -1;             // abandoned: the channel its outgoing stream is tunnelled on
  bool pumping_ = false;     // inside pump(): a nested pass leaves it alone
  bool resending_ = false;   // abandoned, and the peer said where to resume
  ByteQueue feed_;           // rx_fed_: the rest of the incoming stream
  bool rx_switch_ = false;   // rx_fed_: the peer moved its stream onto the new socket ...
  uint64_t rx_switch_at_ = 0;  // ... from this byte on
  std::atomic<bool> wants_socket_{false};
  std::atomic<bool> handoff_ready_{false};
  std::mutex handoff_mutex_;
  UniqueFd handoff_fd_;
};

}  // namespace chorus::tcp
