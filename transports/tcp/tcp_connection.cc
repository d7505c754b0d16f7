// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_connection.cc
// Non-blocking tagged message IO on one TCP socket: batched sendmsg() for sends, header-checked
// receives straight into the destination, or through a bounce buffer for reducing receives;
// headers and short payloads through a small read-ahead buffer (one recv() per small message).
#include "transports/tcp/tcp_connection.h"

#include <linux/sockios.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // tcp_info with tcpi_delivery_rate (glibc's is older)
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "transports/tcp/tcp_transport.h"

namespace chorus::tcp {

namespace {

constexpr size_t kHeaderBytes = sizeof(WireHeader);
constexpr size_t kMinBounceBytes = 64;
// A receive waiting this long with nothing arriving makes the carrier read ahead (check_alive).
constexpr int64_t kQuietReceiveMs = 1000;

// One non-blocking recv(): bytes read (> 0), 0 when it would block, or -1 with *err set
// (0 for an orderly EOF).
ssize_t recv_nb(int fd, void* buf, size_t bytes, int* err) {
  for (;;) {
    ssize_t n = ::recv(fd, buf, bytes, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      *err = 0;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    *err = errno;
    return -1;
  }
}

WireHeader make_header(const SendRequest& req) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.tag = req.tag;
  h.bytes = req.bytes;
  return h;
}

}  // namespace

TcpConnection::TcpConnection(UniqueFd fd, int my_rank, int peer, int channel,
                             const net::SockAddr& peer_addr, size_t bounce_bytes,
                             const std::string& peer_label)
    : Connection(peer, channel),
      fd_(std::move(fd)),
      my_rank_(my_rank),
      peer_sockaddr_(peer_addr),
      peer_addr_(peer_label.empty() ? peer_addr.to_string()
                                    : fmt::format("{}, {}", peer_label, peer_addr.to_string())),
      bounce_bytes_(std::max(bounce_bytes, kMinBounceBytes)),
      rx_buf_(std::make_unique<uint8_t[]>(kRxBufferBytes)) {
  net::set_nodelay(fd_.get());
  net::set_buffer_sizes(fd_.get(), kSocketBufferBytes);
  net::set_keepalive(fd_.get(), params::kPeerTimeoutMs.get());
  const auto local = net::local_addr(fd_.get());
  path_name_ = local ? fmt::format("{} -> {}", local->to_string(), peer_addr.to_string())
                     : fmt::format("-> {}", peer_addr.to_string());
}

void TcpConnection::post_send(SendRequest* req) {
  if (broken_) {
    req->fail();
    return;
  }
  sends_.push(req);
  if (!peer_closed().ok()) fail_all(peer_closed());
}

void TcpConnection::post_recv(RecvRequest* req) {
  if (broken_) {
    req->fail();
    return;
  }
  recvs_.push(req);
  peeking_ = false;
  if (!peer_closed().ok()) {
    fail_all(peer_closed());
    return;
  }
  Status st = check_reducing_receive(*req, peer());
  if (!st.ok()) fail_all(std::move(st));
}

int TcpConnection::poll_fd(short* events) const {
  if (broken_) return -1;
  if (abandoned()) {
    // Everything of this path travels on the carrier now.
    const TcpConnection* c = live_via();
    if (c == nullptr) return -1;
    *events = static_cast<short>(POLLIN | POLLRDHUP | (c->ctl_q_.empty() ? 0 : POLLOUT));
    return c->fd_.get();
  }
  short ev = 0;
  if (!recvs_.empty() || peeking_ || demux_) ev |= POLLIN;
  if (!sends_.empty() || !ctl_q_.empty()) ev |= POLLOUT;
  if (!idle() || peeking_ || demux_) ev |= POLLRDHUP;
  *events = ev;
  return fd_.get();
}

bool TcpConnection::progress() {
  if (handoff_ready_.load(std::memory_order_acquire)) adopt_socket();
  if (broken_ || (idle() && !demux_ && ctl_q_.empty() && !abandoned())) return false;
  bool moved = false;
  if (tx_tunnel_ && resending_ && fd_.valid()) switch_tx();
  if (abandoned()) {
    moved |= pump_group();
    // Down the chain of carriers: each one's control queue into the next one's.
    for (TcpConnection* c = via(); c != nullptr && c != this; c = c->abandoned() ? c->via() : nullptr)
      moved |= c->flush_control();
    if (demux_) moved |= pump();
  } else if (demux_) {
    moved |= pump();
  }
  if (!broken_) moved |= progress_recvs();
  if (!broken_) moved |= progress_sends();
  return moved;
}

// ---- Sends ----------------------------------------------------------------------------------

bool TcpConnection::progress_sends() {
  bool moved = false;
  if (!ctl_q_.empty()) {
    moved |= flush_control();
    if (!ctl_q_.empty() && send_off_ == 0) return moved;  // our messages go after the frames
  }
  while (!sends_.empty()) {
    WireHeader headers[kMaxBatch];
    iovec iov[2 * kMaxBatch];
    size_t n_iov = 0;
    size_t total = 0;
    size_t batch = std::min(sends_.size(), kMaxBatch);
    for (size_t i = 0; i < batch; ++i) {
      const SendRequest* req = sends_.at(i);
      headers[i] = make_header(*req);
      size_t skip = i == 0 ? send_off_ : 0;  // only the front request can be partly sent
      if (skip < kHeaderBytes) {
        iov[n_iov++] = {reinterpret_cast<char*>(&headers[i]) + skip, kHeaderBytes - skip};
        total += kHeaderBytes - skip;
      }
      size_t payload_skip = skip > kHeaderBytes ? skip - kHeaderBytes : 0;
      if (req->bytes > payload_skip) {
        iov[n_iov++] = {const_cast<char*>(static_cast<const char*>(req->buf)) + payload_skip,
                        req->bytes - payload_skip};
        total += req->bytes - payload_skip;
      }
    }
    int err = 0;
    ssize_t n = write_out(iov, n_iov, total, &err);
    if (n < 0) {
      path_failed(io_error(err, sends_.front(), "sending"));
      return true;
    }
    if (n == 0) {
      // Stuck on a full socket: make sure the peer is still there to drain it.
      if (!tx_tunnel_ && recvs_.empty() && !peer_alive()) return true;
      return moved;
    }
    moved = true;
    size_t left = static_cast<size_t>(n);
    while (left > 0 && !sends_.empty()) {
      SendRequest* req = sends_.front();
      size_t need = kHeaderBytes + req->bytes - send_off_;
      size_t step = std::min(left, need);
      send_off_ += step;
      left -= step;
      req->bytes_done.store(send_off_ > kHeaderBytes ? send_off_ - kHeaderBytes : 0,
                            std::memory_order_relaxed);
      if (step < need) break;
      send_off_ = 0;
      sends_.pop();
      req->complete();  // the caller may free it now
    }
    // Anything left unsent means the socket is full.
    if (static_cast<size_t>(n) < total) return moved;
    if (!ctl_q_.empty()) {  // frames queued meanwhile go first
      moved |= flush_control();
      return moved;
    }
  }
  return moved;
}

bool TcpConnection::peer_alive() {
  char byte;
  int err = 0;
  ssize_t n = ::recv(fd_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
    err = errno;
  }
  path_failed(io_error(err, sends_.front(), "sending"));
  return !broken_;
}

// ---- Receives -------------------------------------------------------------------------------

ssize_t TcpConnection::take(void* dst, size_t want, int* err) {
  if (demux_ && own_q_.empty()) leave_demux();
  if (demux_) {
    // A carrier's own stream, read ahead by its pump (from its socket, or once it failed over
    // itself, from what its own carrier passes on).
    if (own_q_.empty()) pump();
    if (own_q_.empty() && rx_fed_) pump_group();
    if (!own_q_.empty()) return static_cast<ssize_t>(own_q_.take(dst, want));
    if (pump_err_ < 0) return 0;
    *err = pump_err_;
    return -1;
  }
  // The rest of an abandoned path's stream arrives over the carriers.
  if (rx_fed_ && feed_.empty() && !(rx_switch_ && fd_.valid())) pump_group();
  return stream_take(dst, want, err);
}

ssize_t TcpConnection::raw_take(void* dst, size_t want, int* err) {
  if (rx_buf_pos_ == rx_buf_len_) {
    // Once a recv() found nothing, poll() says when to try again: a waiting rank asks many
    // times per message, and a recv() takes the socket's lock each time, which the sender's
    // delivery of the next packet then waits for (on one host, the sender's time).
    if (rx_drained_) {
      pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, 0) == 0) return 0;
      rx_drained_ = false;
    }
    // A short read goes through the buffer, which takes what else has arrived (the payload
    // after a header, the messages after it) in the same recv(); a long one goes straight to
    // its destination.
    ssize_t n = want >= kRxBufferBytes / 2 ? recv_nb(fd_.get(), dst, want, err)
                                           : recv_nb(fd_.get(), rx_buf_.get(), kRxBufferBytes, err);
    rx_drained_ = n == 0;
    if (n > 0) rx_total_ += static_cast<uint64_t>(n);
    if (n <= 0 || want >= kRxBufferBytes / 2) return n;
    rx_buf_pos_ = 0;
    rx_buf_len_ = static_cast<size_t>(n);
  }
  const size_t n = std::min(want, rx_buf_len_ - rx_buf_pos_);
  std::memcpy(dst, rx_buf_.get() + rx_buf_pos_, n);
  rx_buf_pos_ += n;
  return static_cast<ssize_t>(n);
}

bool TcpConnection::progress_recvs() {
  bool moved = false;
  while (!recvs_.empty() && !broken_) {
    RecvRequest* req = recvs_.front();
    if (!read_header(req, &moved)) return moved;
    bool complete = req->reduce != nullptr ? read_reduce(req, &moved) : read_plain(req, &moved);
    if (!complete) return moved;
    req->bytes_done.store(req->bytes, std::memory_order_relaxed);
    recvs_.pop();
    rx_header_got_ = 0;
    rx_accepted_ = false;
    rx_payload_got_ = 0;
    bounce_fill_ = 0;
    moved = true;
    req->complete();  // the caller may free it now
  }
  return moved;
}

bool TcpConnection::fill_header(const RecvRequest* req, bool* moved) {
  if (rx_header_got_ == kHeaderBytes) return true;
  auto* dst = reinterpret_cast<uint8_t*>(&rx_header_);
  while (rx_header_got_ < kHeaderBytes) {
    int err = 0;
    ssize_t n = take(dst + rx_header_got_, kHeaderBytes - rx_header_got_, &err);
    if (n == 0) return false;
    if (n < 0 && err == 0 && req == nullptr && rx_header_got_ == 0 && sends_.empty()) {
      // The peer closed between messages while nothing of ours is posted here: not a failure
      // of this path by itself (transport.h, peer_closed()).
      set_peer_closed(remote_error("rank {} ({}) closed tcp channel {} (its communicator went "
                                   "away or its process exited) while rank {} waits for its "
                                   "next message", peer(), peer_addr_, channel(), my_rank_));
      peeking_ = false;
      return false;
    }
    if (n < 0) {
      path_failed(io_error(err, req, "receiving"));
      *moved = true;
      return false;
    }
    rx_header_got_ += static_cast<size_t>(n);
    *moved = true;
  }
  if (rx_header_.magic == kFarewellMagic) {
    read_farewell(req);
    return false;
  }
  if (is_failover_frame(rx_header_.magic) && group_ != nullptr && !demux_) {
    // The peer moved a failed sibling's traffic here: from now on the pump reads the socket.
    start_demux();
    return fill_header(req, moved);
  }
  if (rx_header_.magic != kWireMagic) {
    fail_all(remote_error(
        "rank {} ({}) sent a corrupt message header (magic {:#010x}) on tcp "
        "channel {} while rank {} was receiving {}",
        peer(), peer_addr_, rx_header_.magic, channel(), my_rank_, describe_request(req)));
    return false;
  }
  return true;
}

bool TcpConnection::read_header(RecvRequest* req, bool* moved) {
  if (rx_accepted_) return true;
  if (!fill_header(req, moved)) return false;
  if (Status st = accept_incoming(req, rx_header_.tag, rx_header_.bytes, peer(), my_rank_);
      !st.ok()) {
    fail_all(std::move(st));
    return false;
  }
  rx_accepted_ = true;
  if (req->reduce != nullptr && !bounce_) bounce_ = std::make_unique<uint8_t[]>(bounce_bytes_);
  return true;
}

bool TcpConnection::peek(MsgTag* tag, uint64_t* bytes) {
  if (broken_ || !recvs_.empty() || !peer_closed().ok()) return false;
  peeking_ = true;
  bool moved = false;
  if (!fill_header(nullptr, &moved)) return false;
  *tag = rx_header_.tag;
  *bytes = rx_header_.bytes;
  return true;
}

bool TcpConnection::read_plain(RecvRequest* req, bool* moved) {
  auto* dst = static_cast<uint8_t*>(req->dst);
  while (rx_payload_got_ < req->bytes) {
    int err = 0;
    ssize_t n = take(dst + rx_payload_got_, req->bytes - rx_payload_got_, &err);
    if (n == 0) return false;
    if (n < 0) {
      path_failed(io_error(err, req, "receiving"));
      *moved = true;
      return false;
    }
    rx_payload_got_ += static_cast<size_t>(n);
    req->bytes_done.store(rx_payload_got_, std::memory_order_relaxed);
    *moved = true;
  }
  return true;
}

// Incoming bytes land in the bounce buffer; whole elements are combined into dst at once, a
// partial trailing element waits at the start of the buffer for the rest of its bytes.
bool TcpConnection::read_reduce(RecvRequest* req, bool* moved) {
  auto* dst = static_cast<uint8_t*>(req->dst);
  const auto* src = static_cast<const uint8_t*>(req->src != nullptr ? req->src : req->dst);
  size_t elem = req->elem_size;
  while (rx_payload_got_ < req->bytes) {
    size_t want = std::min(bounce_bytes_ - bounce_fill_, req->bytes - rx_payload_got_);
    int err = 0;
    ssize_t n = take(bounce_.get() + bounce_fill_, want, &err);
    if (n == 0) return false;
    if (n < 0) {
      path_failed(io_error(err, req, "receiving"));
      *moved = true;
      return false;
    }
    *moved = true;
    bounce_fill_ += static_cast<size_t>(n);
    rx_payload_got_ += static_cast<size_t>(n);
    size_t whole = bounce_fill_ / elem * elem;
    if (whole == 0) continue;
    size_t off = rx_payload_got_ - bounce_fill_;  // message offset of bounce_[0]
    req->reduce(dst + off, src + off, bounce_.get(), whole / elem);
    bounce_fill_ -= whole;
    if (bounce_fill_ > 0) std::memmove(bounce_.get(), bounce_.get() + whole, bounce_fill_);
    req->bytes_done.store(off + whole, std::memory_order_relaxed);
  }
  return true;
}

// ---- Errors ---------------------------------------------------------------------------------

Status TcpConnection::io_error(int err, const Request* req, const char* doing) const {
  std::string how =
      err == 0 ? std::string("closed the connection")
               : fmt::format("broke the connection ({}, errno {})", std::strerror(err), err);
  if (err == ECONNRESET || err == EPIPE)
    how = fmt::format("closed the connection ({})", std::strerror(err));
  if (err == ETIMEDOUT) {
    how = fmt::format("stopped answering (no reply to TCP keepalive probes or retransmissions "
                      "for about CHORUS_PEER_TIMEOUT_MS={} ms: its host is unreachable or gone)",
                      params::kPeerTimeoutMs.get());
  }
  return remote_error("rank {} ({}) {} while rank {} was {} {} on tcp channel {}", peer(),
                      peer_addr_, how, my_rank_, doing, describe_request(req), channel());
}

void TcpConnection::farewell(const Status& why) {
  if (!why.ok()) closing_on_error_ = true;
  // Only between messages (a partly sent one would swallow it), and only once.
  if (broken_ || farewell_sent_ || send_off_ != 0 || !ctl_q_.empty() || abandoned() || why.ok())
    return;
  farewell_sent_ = true;
  std::string text = why.message().substr(0, kMaxFarewellBytes);
  WireHeader h{};
  h.magic = kFarewellMagic;
  h.reserved = static_cast<uint32_t>(why.code());
  h.bytes = text.size();
  iovec iov[2] = {{&h, kHeaderBytes}, {text.data(), text.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  [[maybe_unused]] ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void TcpConnection::read_farewell(const RecvRequest* req) {
  // The text follows its header at once; wait for it briefly (the peer is closing anyway).
  const size_t want = std::min<uint64_t>(rx_header_.bytes, kMaxFarewellBytes);
  std::string text(want, '\0');
  size_t got = 0;
  Deadline deadline = Deadline::after_ms(200);
  while (got < want && !deadline.expired()) {
    int err = 0;
    ssize_t n = take(text.data() + got, want - got, &err);
    if (n < 0) break;
    if (n == 0) {
      pollfd p{fd_.get(), POLLIN, 0};
      ::poll(&p, 1, deadline.remaining_ms(200));
      continue;
    }
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  fail_all(Status(farewell_code(rx_header_.reserved), fmt::format("rank {} ({}) gave up while rank {} was receiving {} on tcp "
                                    "channel {}: {}", peer(), peer_addr_, my_rank_,
                                    describe_request(req), channel(), text)));
}

void TcpConnection::fail_all(Status status) {
  farewell(status);
  if (!broken_) CHORUS_WARN(kNet, "{}", status.message());
  status.mark_logged();
  broken_ = true;
  set_error(std::move(status));
  sends_.fail_all();
  recvs_.fail_all();
}

bool TcpConnection::path_state(PathState* out) const {
  if (tx_tunnel_) {
    // Its traffic shares the carrier's: a path to avoid, except for a probe now and then.
    const TcpConnection* c = via();
    out->unacked_bytes = c != nullptr ? c->ctl_q_.size() : 0;
    out->delivery_rate = 1e-6;
    out->rtt_ns = 0;
    return true;
  }
  int queued = 0;
  if (ioctl(fd_.get(), SIOCOUTQ, &queued) != 0) return false;
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  out->unacked_bytes = static_cast<uint64_t>(std::max(queued, 0));
  // tcpi_delivery_rate (Linux 4.9): bytes per second over the last round trip's deliveries.
  out->delivery_rate = len >= offsetof(tcp_info, tcpi_delivery_rate) + sizeof(info.tcpi_delivery_rate)
                           ? static_cast<double>(info.tcpi_delivery_rate) / 1e9
                           : 0;
  out->rtt_ns = static_cast<double>(info.tcpi_rtt) * 1e3;
  return true;
}

bool TcpConnection::check_alive() {
  if (broken_) return false;
  if (abandoned()) {
    TcpConnection* c = live_via();
    return c != nullptr && c->check_alive() && !broken_;
  }
  // A path whose interface went down (a pulled cable, a dead switch port, an interface taken
  // down) fails over now, not after CHORUS_PEER_TIMEOUT_MS without acknowledgements. The peer
  // hears of it at once (the Abandon frame on the carrier). Without a path to fail over to, the
  // timeout below still decides: the link may come back before it.
  if (can_fail_over() && net::interface_down(fd_.get(), local_ifname_)) {
    path_failed(remote_error("tcp channel {} from rank {} to rank {} ({}) lost its interface {} "
                             "(down, or no carrier)",
                             channel(), my_rank_, peer(), peer_addr_, local_ifname_));
    return !broken_;
  }
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return true;
  // Nothing acknowledged for two liveness periods, or nothing received for a second while a
  // receive waits here: perhaps the peer gave this path up (its interface went down). Its
  // word, the Abandon frame, is on the carrier, maybe behind messages nobody has posted a
  // receive for yet, so the carrier reads ahead (passing our own messages on in order) and
  // takes the word as soon as it comes.
  const int64_t quiet_out_ms = 2 * params::kLivenessMs.get();
  const int64_t quiet_in_ms = std::max<int64_t>(quiet_out_ms, kQuietReceiveMs);
  const bool stalled = (info.tcpi_unacked > 0 && info.tcpi_last_ack_recv >= quiet_out_ms) ||
                       ((!recvs_.empty() || peeking_) && info.tcpi_last_data_recv >= quiet_in_ms);
  if (stalled && can_fail_over()) {
    carrier()->read_ahead();
    if (broken_ || abandoned()) return !broken_;
  }
  const int64_t limit_ms = params::kPeerTimeoutMs.get();
  if (info.tcpi_unacked == 0 || info.tcpi_last_ack_recv < limit_ms) return true;
  path_failed(remote_error(
      "rank {} ({}) has acknowledged none of the data rank {} sent on tcp channel {} for {:.1f} s "
      "({} segments unacknowledged, {} retransmissions; CHORUS_PEER_TIMEOUT_MS={}): its host is "
      "unreachable or gone",
      peer(), peer_addr_, my_rank_, channel(), info.tcpi_last_ack_recv / 1e3, info.tcpi_unacked,
      info.tcpi_total_retrans, limit_ms));
  return !broken_;
}

}  // namespace chorus::tcp
