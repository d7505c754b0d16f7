// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_failover.cc
// Failover between the TCP connections to one peer over different rails (README.md,
// "Failover"). Each connection of a group keeps a copy of what it wrote until the peer's
// kernel acknowledged it. When one fails (an I/O error, or no acknowledgement for
// CHORUS_PEER_TIMEOUT_MS), the side that notices reads what the socket still holds, tells the
// peer over a surviving sibling (the carrier: the lowest channel still alive) how many bytes of
// the path's incoming stream it read (an Abandon frame), and from then on receives the path's
// stream from the carrier. The peer does the same on its side, and resends its own stream from
// where we stopped reading, in Tunnel frames on its carrier, followed by everything it sends
// on that path afterwards. The path's requests never see the failure: its reader carries on in
// the same message, at the same byte, whether that byte came over the socket or a tunnel.
// A carrier reads its socket ahead of its own receives (into own_q_) so that frames behind a
// message nobody has asked for yet still get through. A path keeps the carrier it failed over
// to (via_); when that carrier fails too, its own stream (the frames of the paths it carries
// in it) goes on through the next one, and the receiving side keeps demultiplexing it there.
// Only when no path of the group works on its own socket does the group fail, naming the peer.
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/scope_guard.h"
#include "common/params.h"
#include "net/socket.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_mender.h"
#include "transports/tcp/tcp_transport.h"

namespace chorus::tcp {

namespace {

constexpr size_t kHeaderBytes = sizeof(WireHeader);
constexpr size_t kKeepSlackBytes = 1 << 20;      // kept bytes before asking what was acked
constexpr size_t kTunnelFrameBytes = 256 << 10;  // payload of one tunnel frame at most
constexpr size_t kTunnelBacklogBytes = 4 << 20;  // control bytes queued on a carrier at most
constexpr size_t kMaxReadAheadBytes = size_t{1} << 30;  // a carrier's own_q_ at most
constexpr int64_t kCloseFlushMs = 5000;  // flush_group's wait at most


// Copies `n` bytes gathered from iov into dst.
void gather(const iovec* iov, size_t n_iov, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n_iov && n > 0; ++i) {
    const size_t k = std::min(n, iov[i].iov_len);
    std::memcpy(dst, iov[i].iov_base, k);
    dst += k;
    n -= k;
  }
}

}  // namespace

// ---- ByteQueue ------------------------------------------------------------------------------

uint8_t* ByteQueue::tail(size_t n) {
  if (cap_ - end_ >= n) return buf_.get() + end_;
  const size_t used = size();
  if (cap_ - used >= n && begin_ > 0) {
    std::memmove(buf_.get(), buf_.get() + begin_, used);
  } else {
    size_t cap = std::max<size_t>(cap_ * 2, 64 << 10);
    while (cap - used < n) cap *= 2;
    auto bigger = std::make_unique_for_overwrite<uint8_t[]>(cap);
    if (used > 0) std::memcpy(bigger.get(), buf_.get() + begin_, used);
    buf_ = std::move(bigger);
    cap_ = cap;
  }
  begin_ = 0;
  end_ = used;
  return buf_.get() + end_;
}

void ByteQueue::append(const void* src, size_t n) {
  if (n == 0) return;
  std::memcpy(tail(n), src, n);
  commit(n);
}

size_t ByteQueue::take(void* dst, size_t n) {
  n = std::min(n, size());
  if (dst != nullptr && n > 0) std::memcpy(dst, buf_.get() + begin_, n);
  begin_ += n;
  if (begin_ == end_) begin_ = end_ = 0;
  return n;
}

// ---- The socket's stream ----------------------------------------------------------------------

ssize_t TcpConnection::write_out(const iovec* iov, size_t n_iov, size_t total, int* err) {
  if (tx_tunnel_) return static_cast<ssize_t>(tunnel_out(iov, n_iov, total));
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = n_iov;
  for (;;) {
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      if (group_ != nullptr) {
        const auto k = static_cast<size_t>(n);
        gather(iov, n_iov, k, tx_keep_.tail(k));
        tx_keep_.commit(k);
        if (tx_keep_.size() > kKeepSlackBytes) release_acked();
      }
      tx_written_ += static_cast<uint64_t>(n);
      return n;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    *err = errno;
    return -1;
  }
}

void TcpConnection::release_acked() {
  int queued = 0;
  if (ioctl(fd_.get(), SIOCOUTQ, &queued) != 0) return;
  const uint64_t acked = tx_written_ - std::min<uint64_t>(static_cast<uint64_t>(std::max(queued, 0)), tx_written_);
  if (acked <= tx_keep_from_) return;
  tx_keep_from_ += tx_keep_.take(nullptr, acked - tx_keep_from_);
}

// ---- Failing over -----------------------------------------------------------------------------

void TcpConnection::join_group(std::shared_ptr<TcpPeerGroup> group) {
  group_ = std::move(group);
  note_interface();
}

void TcpConnection::note_interface() {
  const auto local = net::local_addr(fd_.get());
  local_ifname_ = local ? net::interface_holding(*local) : std::string();
}

TcpConnection* TcpConnection::carrier() const {
  if (group_ == nullptr) return nullptr;
  for (TcpConnection* m : group_->members) {
    if (m != this && m != nullptr && !m->abandoned() && !m->broken_) return m;
  }
  return nullptr;
}

TcpConnection* TcpConnection::via() const {
  if (group_ == nullptr || via_ < 0 || static_cast<size_t>(via_) >= group_->members.size())
    return nullptr;
  TcpConnection* c = group_->members[static_cast<size_t>(via_)];
  return c != nullptr && !c->broken_ ? c : nullptr;
}

TcpConnection* TcpConnection::live_via() const {
  const TcpConnection* c = this;
  // Each hop's carrier was working when the hop failed: the chain has no cycle, and at most
  // one hop per member.
  for (size_t hops = 0; c != nullptr && c->abandoned(); ++hops) {
    if (group_ == nullptr || hops > group_->members.size()) return nullptr;
    c = c->via();
  }
  return c != nullptr && !c->broken_ ? const_cast<TcpConnection*>(c) : nullptr;
}

bool TcpConnection::can_fail_over() const {
  if (group_ == nullptr || abandoned() || broken_) return false;
  // Paths that failed over to this one go on through its own carrier.
  return carrier() != nullptr;
}

void TcpConnection::path_failed(Status status) {
  if (can_fail_over()) {
    abandon(std::move(status));
  } else if (group_ != nullptr && group_->failed_over) {
    fail_group(status);  // a second failure: the carrier or a path that depends on it
  } else {
    fail_all(std::move(status));
  }
}

void TcpConnection::fail_group(const Status& status) {
  for (TcpConnection* m : group_->members) {
    if (m != nullptr && !m->broken_) m->fail_all(status);
  }
}

void TcpConnection::abandon(Status why) {
  TcpConnection* c = carrier();
  CHORUS_WARN(kNet, "{}; tcp channel {} to rank {} is given up, its traffic continues on tcp "
              "channel {} ({})", why.message(), channel(), peer(), c->channel(), c->path_name_);
  // A carrier (or a path reading ahead as one) goes on demultiplexing its stream where it
  // stopped, from what its own carrier passes on: the frames of the paths it carried are in it.
  pump_err_ = -1;
  via_ = c->channel();
  tx_tunnel_ = rx_fed_ = true;
  rx_switch_ = resending_ = false;
  group_->failed_over = true;
  // What the socket still holds was acknowledged to the peer: it is ours to read (the
  // read-ahead buffer's bytes first). Then the socket is closed, and the peer learns how far
  // its stream got here.
  for (;;) {
    const size_t room = 64 << 10;
    int err = 0;
    ssize_t n = raw_take(feed_.tail(room), room, &err);
    if (n <= 0) break;
    feed_.commit(static_cast<size_t>(n));
  }
  // Closed at once with a reset, so that its kernel acknowledges nothing more: what the peer
  // sends on it from now on is resent (the peer learns of the failure from the reset too).
  linger hard{1, 0};
  setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  fd_.reset();
  c->start_demux();
  const uint64_t consumed = rx_total_;
  c->push_control(kAbandonMagic, channel(), &consumed, sizeof(consumed));
  if (group_->mender != nullptr) {
    wants_socket_.store(true, std::memory_order_release);
    group_->mender->wake();
  }
}

// ---- Taking a path back -----------------------------------------------------------------------

TcpPeerGroup::~TcpPeerGroup() {
  if (mender != nullptr) mender->remove(this);
}

TcpConnection::~TcpConnection() {
  if (group_ != nullptr) {
    if (!closing_on_error_) flush_group();
    std::lock_guard<std::mutex> lock(group_->mutex);
    for (TcpConnection*& m : group_->members) {
      if (m == this) m = nullptr;
    }
  }
}

void TcpConnection::flush_group() {
  const auto budget = std::min<int64_t>(params::kPeerTimeoutMs.get(), kCloseFlushMs);
  Deadline deadline = Deadline::after_ms(budget);
  std::vector<pollfd> fds;
  for (;;) {
    bool pending = false;
    fds.clear();
    for (TcpConnection* m : group_->members) {
      if (m == nullptr || m->broken_) continue;
      m->flush_control();
      if (m->demux_ && !m->rx_fed_) m->pump();  // the peer's word that it resumes our paths
      if (m->broken_) continue;
      // A path the peer has not agreed to resume yet cannot send (it will not, if it is gone).
      const bool can_send = !m->tx_tunnel_ || m->resending_;
      if (!m->ctl_q_.empty() && can_send) pending = true;
      if (m->fd_.valid() && !m->abandoned())
        fds.push_back(pollfd{m->fd_.get(), static_cast<short>(POLLIN | POLLOUT), 0});
    }
    if (!pending || deadline.expired() || fds.empty()) return;
    ::poll(fds.data(), fds.size(), 10);
  }
}

void TcpConnection::offer_socket(UniqueFd fd) {
  std::lock_guard<std::mutex> lock(handoff_mutex_);
  handoff_fd_ = std::move(fd);
  wants_socket_.store(false, std::memory_order_release);
  handoff_ready_.store(true, std::memory_order_release);
}

void TcpConnection::adopt_socket() {
  UniqueFd fd;
  {
    std::lock_guard<std::mutex> lock(handoff_mutex_);
    fd = std::move(handoff_fd_);
    handoff_ready_.store(false, std::memory_order_relaxed);
  }
  if (broken_ || !abandoned() || !fd.valid()) return;
  net::set_nodelay(fd.get());
  net::set_buffer_sizes(fd.get(), kSocketBufferBytes);
  net::set_keepalive(fd.get(), params::kPeerTimeoutMs.get());
  fd_ = std::move(fd);
  if (const auto local = net::local_addr(fd_.get())) {
    path_name_ = fmt::format("{} -> {}", local->to_string(), net::peer_name(fd_.get()));
    local_ifname_ = net::interface_holding(*local);
  } else {
    local_ifname_.clear();
  }
  rx_buf_pos_ = rx_buf_len_ = 0;
  rx_drained_ = false;
  CHORUS_INFO(kNet, "tcp: rank {} has a new socket for channel {} to rank {}", my_rank_,
              channel(), peer());
}

void TcpConnection::switch_tx() {
  // Everything tunnelled so far is queued on the carrier ahead of this frame.
  TcpConnection* c = via();
  if (c == nullptr) return;
  const uint64_t at = tx_written_;
  c->push_control(kSwitchMagic, channel(), &at, sizeof(at));
  tx_tunnel_ = false;
  tx_keep_.clear();
  tx_keep_from_ = tx_written_;
  CHORUS_INFO(kNet, "tcp: rank {} sends channel {} to rank {} on its own socket again from byte "
              "{}", my_rank_, channel(), peer(), at);
  maybe_recovered();
}

void TcpConnection::maybe_recovered() {
  if (abandoned()) return;
  resending_ = false;
  for (TcpConnection* m : group_->members) {
    if (m != nullptr && m->abandoned()) return;
  }
  group_->failed_over = false;
  CHORUS_WARN(kNet, "tcp: channel {} to rank {} ({}) works again; rank {} routes over it again",
              channel(), peer(), peer_addr_, my_rank_);
}

void TcpConnection::on_peer_abandon(uint64_t consumed) {
  if (broken_ || resending_) return;
  if (!abandoned()) {
    if (!can_fail_over()) {
      fail_group(remote_error("rank {} ({}) gave up tcp channel {} while rank {} cannot move its "
                              "traffic to another channel", peer(), peer_addr_, channel(),
                              my_rank_));
      return;
    }
    abandon(remote_error("rank {} ({}) gave up tcp channel {}", peer(), peer_addr_, channel()));
  }
  if (consumed < tx_keep_from_ || consumed > tx_written_) {
    fail_group(remote_error(
        "rank {} ({}) read {} bytes of tcp channel {} from rank {}, which kept bytes {} to {}: "
        "the channel cannot be resumed on another one (it was acknowledged after rank {} gave "
        "it up)", peer(), peer_addr_, consumed, channel(), my_rank_, tx_keep_from_, tx_written_,
        peer()));
    return;
  }
  tx_keep_.take(nullptr, consumed - tx_keep_from_);
  tx_keep_from_ = consumed;
  TcpConnection* c = via();
  if (c == nullptr) {
    fail_group(remote_error("rank {} ({}) gave up tcp channel {}, and rank {} has no channel left "
                            "to resume it on", peer(), peer_addr_, channel(), my_rank_));
    return;
  }
  // The bytes the peer never read, again, then (tunnel_out) everything written afterwards.
  while (!tx_keep_.empty()) {
    const size_t n = std::min(tx_keep_.size(), kTunnelFrameBytes);
    c->push_control(kTunnelMagic, channel(), tx_keep_.data(), n);
    tx_keep_.take(nullptr, n);
  }
  tx_keep_.clear();
  tx_keep_from_ = tx_written_;
  resending_ = true;
  CHORUS_INFO(kNet, "tcp: rank {} resumes channel {} to rank {} on channel {} from byte {} of "
              "{}", my_rank_, channel(), peer(), c->channel(), consumed, tx_written_);
}

size_t TcpConnection::tunnel_out(const iovec* iov, size_t n_iov, size_t total) {
  TcpConnection* c = via();
  if (!resending_ || c == nullptr) return 0;
  if (c->ctl_q_.size() >= kTunnelBacklogBytes) {
    c->flush_control();
    if (c->broken_ || c->ctl_q_.size() >= kTunnelBacklogBytes) return 0;
  }
  const size_t n = std::min(total, kTunnelFrameBytes);
  WireHeader h{};
  h.magic = kTunnelMagic;
  h.reserved = static_cast<uint32_t>(channel());
  h.bytes = n;
  c->ctl_q_.append(&h, kHeaderBytes);
  gather(iov, n_iov, n, c->ctl_q_.tail(n));
  c->ctl_q_.commit(n);
  tx_written_ += n;
  c->flush_control();
  return n;
}

void TcpConnection::push_control(uint32_t magic, int about, const void* payload, size_t bytes) {
  WireHeader h{};
  h.magic = magic;
  h.reserved = static_cast<uint32_t>(about);
  h.bytes = bytes;
  ctl_q_.append(&h, kHeaderBytes);
  ctl_q_.append(payload, bytes);
  flush_control();
}

bool TcpConnection::flush_control() {
  bool moved = false;
  // Only between two of our own messages: a frame inside one would cut it.
  while (!ctl_q_.empty() && send_off_ == 0 && !broken_) {
    iovec v{const_cast<uint8_t*>(ctl_q_.data()), ctl_q_.size()};
    int err = 0;
    ssize_t n = write_out(&v, 1, v.iov_len, &err);
    if (n < 0) {
      path_failed(io_error(err, nullptr, "sending"));
      return true;
    }
    if (n == 0) break;
    ctl_q_.take(nullptr, static_cast<size_t>(n));
    moved = true;
  }
  return moved;
}

// ---- A carrier's reading ----------------------------------------------------------------------

void TcpConnection::read_ahead() {
  if (demux_ || group_ == nullptr || broken_) return;
  start_demux();
  pump();
}

void TcpConnection::start_demux() {
  if (demux_) return;
  demux_ = true;
  if (rx_header_got_ == kHeaderBytes && !is_failover_frame(rx_header_.magic)) {
    // The reader is inside one of our messages: the pump passes the rest of it on.
    pump_hdr_ = rx_header_;
    pump_in_frame_ = true;
    pump_left_ = rx_header_.bytes - rx_payload_got_;
  } else {
    // Between messages, or a header partly read (or a control frame's): the pump reads the
    // header again from what the reader has of it, and passes it on if it is ours.
    std::memcpy(&pump_hdr_, &rx_header_, rx_header_got_);
    pump_hdr_got_ = rx_header_got_;
    pump_in_frame_ = false;
    rx_header_got_ = 0;
    rx_accepted_ = false;
  }
}

void TcpConnection::leave_demux() {
  if (group_->failed_over || !own_q_.empty() || pump_in_frame_ || pump_hdr_got_ != 0 ||
      pump_err_ >= 0)
    return;
  demux_ = false;  // what the pump read past its last frame is in rx_buf_, read next
}

ssize_t TcpConnection::stream_take(void* dst, size_t want, int* err) {
  if (!rx_fed_) return raw_take(dst, want, err);
  if (!feed_.empty()) return static_cast<ssize_t>(feed_.take(dst, want));
  if (!rx_switch_ || !fd_.valid()) return 0;
  // The peer's stream moved back onto this path's new socket, from the byte reached here.
  if (rx_total_ != rx_switch_at_) {
    fail_group(remote_error("rank {} ({}) resumed tcp channel {} at byte {} but rank {} had "
                            "read {} of it", peer(), peer_addr_, channel(), rx_switch_at_,
                            my_rank_, rx_total_));
    *err = EPROTO;
    return -1;
  }
  rx_fed_ = rx_switch_ = false;
  maybe_recovered();
  return raw_take(dst, want, err);
}

bool TcpConnection::pump_group() {
  if (group_ == nullptr) return false;
  // Members whose pump reads their own socket (a fed one's pump runs nested, as data arrives).
  auto reads_socket = [](const TcpConnection* m) {
    return m != nullptr && m->demux_ && !m->rx_fed_ && !m->broken_;
  };
  bool moved = false;
  for (TcpConnection* m : group_->members) {
    if (reads_socket(m)) moved |= m->pump();
  }
  for (TcpConnection* m : group_->members) {
    if (reads_socket(m) && m->pump_err_ >= 0) {
      m->path_failed(m->io_error(m->pump_err_, nullptr, "receiving"));
      moved = true;
    }
  }
  return moved;
}

bool TcpConnection::pump() {
  if (pumping_) return false;
  pumping_ = true;
  ScopeGuard done([this] { pumping_ = false; });
  bool moved = false;
  while (demux_ && pump_err_ < 0 && !broken_ && own_q_.size() < kMaxReadAheadBytes) {
    int err = 0;
    if (!pump_in_frame_) {
      if (pump_hdr_got_ < kHeaderBytes) {
        ssize_t n = stream_take(reinterpret_cast<uint8_t*>(&pump_hdr_) + pump_hdr_got_,
                             kHeaderBytes - pump_hdr_got_, &err);
        if (n == 0) break;
        if (n < 0) {
          pump_err_ = err;
          break;
        }
        moved = true;
        pump_hdr_got_ += static_cast<size_t>(n);
        if (pump_hdr_got_ < kHeaderBytes) continue;
      }
      pump_hdr_got_ = 0;
      pump_in_frame_ = true;
      pump_left_ = pump_hdr_.bytes;
      pump_ctl_got_ = 0;
      if (is_failover_frame(pump_hdr_.magic)) {
        const size_t about = pump_hdr_.reserved;
        TcpConnection* m = about < group_->members.size() ? group_->members[about] : nullptr;
        const bool ok = m != nullptr && m != this &&
                        (pump_hdr_.magic == kTunnelMagic ? m->rx_fed_ && !m->rx_switch_
                         : pump_hdr_.magic == kSwitchMagic
                             ? m->rx_fed_ && !m->rx_switch_ && pump_left_ == sizeof(uint64_t)
                             : pump_left_ == sizeof(uint64_t));
        if (!ok) {
          fail_group(remote_error("rank {} ({}) sent a failover frame ({:#010x}) about tcp "
                                  "channel {} that rank {} cannot take ({} bytes)", peer(),
                                  peer_addr_, pump_hdr_.magic, about, my_rank_, pump_left_));
          return true;
        }
      } else {
        // Ours: a message or a farewell, passed on whole. Anything else is passed on too, for
        // the reader to report, and nothing after it is read.
        own_q_.append(&pump_hdr_, kHeaderBytes);
        if (pump_hdr_.magic != kWireMagic && pump_hdr_.magic != kFarewellMagic) {
          pump_in_frame_ = false;
          pump_err_ = EPROTO;
          break;
        }
      }
    }
    if (pump_left_ > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(pump_left_, 256 << 10));
      TcpConnection* m = is_failover_frame(pump_hdr_.magic) ? group_->members[pump_hdr_.reserved] : this;
      ssize_t n;
      if (pump_hdr_.magic != kTunnelMagic && m != this) {
        n = stream_take(pump_ctl_ + pump_ctl_got_, want, &err);
        if (n > 0) pump_ctl_got_ += static_cast<size_t>(n);
      } else {
        ByteQueue& q = m == this ? own_q_ : m->feed_;
        n = stream_take(q.tail(want), want, &err);
        if (n > 0) q.commit(static_cast<size_t>(n));
        if (n > 0 && m != this) {
          m->rx_total_ += static_cast<uint64_t>(n);  // its stream goes on
          // A carrier that failed over itself: the frames in its stream go on at once, ahead
          // of anything about them that comes later on this one.
          if (m->demux_) m->pump();
        }
      }
      if (n == 0) break;
      if (n < 0) {
        pump_err_ = err;
        break;
      }
      moved = true;
      pump_left_ -= static_cast<uint64_t>(n);
    }
    if (pump_left_ == 0) {
      pump_in_frame_ = false;
      if (pump_hdr_.magic == kAbandonMagic || pump_hdr_.magic == kSwitchMagic) {
        uint64_t at;
        std::memcpy(&at, pump_ctl_, sizeof(at));
        TcpConnection* m = group_->members[pump_hdr_.reserved];
        if (pump_hdr_.magic == kAbandonMagic) {
          m->on_peer_abandon(at);
        } else {
          m->rx_switch_ = true;  // what was tunnelled before is in its feed_ already
          m->rx_switch_at_ = at;
        }
      }
    }
  }
  return moved;
}

}  // namespace chorus::tcp
