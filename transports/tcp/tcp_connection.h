// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_connection.h
// One TCP connection (peer, channel): ordered, tagged messages over a non-blocking socket.
// Each message is a 40-byte header (magic, tag, payload bytes) followed by the payload.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// Not thread-safe: post_*, progress() and the queries must come from one thread at a time
// (the progress engine's). Requests complete in posting order per direction.
class TcpConnection final : public Connection {
 public:
  // Takes a connected, authenticated, non-blocking socket. `peer_addr`, `peer_label` (host
  // and pid, may be empty) and the ranks name the peer in error messages; `bounce_bytes` sizes
  // the staging buffer of reducing receives (allocated on the first one).
  TcpConnection(UniqueFd fd, int my_rank, int peer, int channel, const net::SockAddr& peer_addr,
                size_t bounce_bytes, const std::string& peer_label = {});
  ~TcpConnection() override = default;

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

  UniqueFd fd_;
  int my_rank_;
  std::string peer_addr_;
  std::string path_name_;  // "local address -> peer address"
  size_t bounce_bytes_;
  bool broken_ = false;
  bool farewell_sent_ = false;

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
};

}  // namespace chorus::tcp
