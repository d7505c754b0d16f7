// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_side.cc
// Side channels: set up with blocking, deadline-bounded socket helpers (connect to the higher
// ranks, then accept the lower ones), then watched without blocking by WatchedConnection.
#include "transports/verbs/verbs_side.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "common/bytes.h"
#include "common/log.h"
#include "common/params.h"
#include "net/socket.h"
#include "transports/verbs/verbs_connection.h"

namespace chorus::verbs {

namespace {

constexpr uint32_t kAddressMagic = 0x43485341;  // "CHSA"
constexpr uint32_t kIdentMagic = 0x43485653;    // "CHVS"
constexpr size_t kIdentBytes = 24;
constexpr uint8_t kReadyByte = 'R';
// An incoming connection gets this long for its ident and handshake: a stray or stalled
// client cannot hold the accepting rank until the communicator's deadline.
constexpr int kIncomingMs = 5000;

std::string side_context(uint64_t comm_uid) { return fmt::format("chorus-verbs:{}", comm_uid); }

// (Deadline::remaining_ms is capped at a cancel slice for the communicator's deadline: the
// time left comes from at_ns().)
Deadline incoming_deadline(const Deadline& overall) {
  const int64_t left_ms = std::max<int64_t>(0, (overall.at_ns() - now_ns()) / 1000000);
  return Deadline::after_ms(std::min<int64_t>(kIncomingMs, left_ms));
}

// The lower rank's side: connect, identify, authenticate. `*retry`: the failure was the
// connection's (reset, closed: the acceptor may have dropped us under load), not a refused
// proof, so trying again may help.
Result<UniqueFd> connect_one(const SideSetup& s, const SidePeer& p, const std::string& context,
                             bool* retry) {
  *retry = false;
  CHORUS_ASSIGN_OR_RETURN(UniqueFd fd, net::connect_socket(p.addr, s.deadline));
  *retry = true;
  uint8_t ident[kIdentBytes] = {};
  le::put_u32(ident, kIdentMagic);
  le::put_u32(ident + 4, static_cast<uint32_t>(s.rank));
  le::put_u32(ident + 8, static_cast<uint32_t>(p.rank));
  le::put_u64(ident + 16, s.comm_uid);
  CHORUS_RETURN_IF_ERROR(net::send_all(fd.get(), ident, sizeof(ident), s.deadline));
  net::Handshake hs(net::Handshake::Role::kInitiator, s.secret, context, p.addr.to_string());
  for (;;) {
    Result<short> events = hs.advance(fd.get());
    if (!events.ok()) {
      *retry = !hs.auth_failed();
      return events.take_status();
    }
    if (*events == 0) break;
    if (s.deadline.expired()) {
      return remote_error("authentication with {} timed out", p.addr.to_string());
    }
    Result<short> ready = net::poll_one(fd.get(), *events, s.deadline.remaining_ms(1000));
    if (!ready.ok()) return ready.take_status();
  }
  *retry = false;
  return fd;
}

// The higher rank's side: which expected peer this is (its index), once it has proved the
// secret. `connected[i]`: peer i has its channel already.
Result<size_t> accept_one(const SideSetup& s, int fd, const std::string& context,
                          const std::vector<bool>& connected) {
  Deadline deadline = incoming_deadline(s.deadline);
  uint8_t ident[kIdentBytes] = {};
  CHORUS_RETURN_IF_ERROR(net::recv_all(fd, ident, sizeof(ident), deadline));
  const uint32_t magic = le::get_u32(ident);
  const auto from = static_cast<int>(le::get_u32(ident + 4));
  const auto to = static_cast<int>(le::get_u32(ident + 8));
  const uint64_t uid = le::get_u64(ident + 16);
  if (magic != kIdentMagic) return remote_error("not a verbs side channel (magic {:#x})", magic);
  if (uid != s.comm_uid || to != s.rank) {
    return remote_error("it wants rank {} of communicator {:#x}, not rank {} of {:#x}", to, uid,
                        s.rank, s.comm_uid);
  }
  size_t index = s.peers.size();
  for (size_t i = 0; i < s.peers.size(); ++i)
    if (s.peers[i].rank == from && from < s.rank && !connected[i]) index = i;
  if (index == s.peers.size()) {
    return remote_error("it claims to be rank {}, which is no lower-ranked verbs peer still "
                        "expected",
                        from);
  }
  Status auth = net::auth_responder(fd, s.secret, context, deadline);
  if (!auth.ok()) return auth.with_context(fmt::format("claiming to be {}", s.peers[index].label));
  return index;
}

}  // namespace

// ---- Blob trailer ---------------------------------------------------------------------------

std::string append_side_address(std::string blob, const net::SockAddr& addr) {
  uint8_t tail[8];
  le::put_u32(tail, static_cast<uint32_t>(addr.len));
  le::put_u32(tail + 4, kAddressMagic);
  blob.append(reinterpret_cast<const char*>(&addr.storage), addr.len);
  blob.append(reinterpret_cast<const char*>(tail), sizeof(tail));
  return blob;
}

Status split_side_address(std::string_view published, std::string_view* verbs_blob,
                          net::SockAddr* addr, const std::string& who) {
  const size_t n = published.size();
  const auto* p = reinterpret_cast<const uint8_t*>(published.data());
  if (n < 8 || le::get_u32(p + n - 4) != kAddressMagic) {
    return remote_error("verbs: {} published no side channel address (a blob of {} bytes without "
                        "its trailer: an older Chorus?)",
                        who, n);
  }
  const uint32_t len = le::get_u32(p + n - 8);
  if (len > sizeof(addr->storage) || len > n - 8) {
    return remote_error("verbs: {} published a side channel address of {} bytes", who, len);
  }
  sockaddr_storage storage{};
  std::memcpy(&storage, p + n - 8 - len, len);
  auto parsed = net::SockAddr::from_sockaddr(reinterpret_cast<const sockaddr*>(&storage),
                                             static_cast<socklen_t>(len));
  if (!parsed.ok()) {
    return remote_error("verbs: {} published a bad side channel address: {}", who,
                        parsed.status().message());
  }
  *addr = *parsed;
  *verbs_blob = published.substr(0, n - 8 - len);
  return ok_status();
}

// ---- Setup ----------------------------------------------------------------------------------

Result<std::vector<std::shared_ptr<SideChannel>>> connect_side_channels(const SideSetup& s) {
  const int64_t start = now_ns();
  const std::string context = side_context(s.comm_uid);
  std::vector<std::shared_ptr<SideChannel>> out(s.peers.size());
  std::vector<bool> connected(s.peers.size(), false);
  std::vector<size_t> order(s.peers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return s.peers[a].rank < s.peers[b].rank; });
  size_t lower = 0;
  for (size_t i : order) {
    const SidePeer& p = s.peers[i];
    if (p.rank < s.rank) {
      ++lower;
      continue;
    }
    Result<UniqueFd> fd = internal_error("verbs: no attempt");
    for (int backoff_ms = 5;; backoff_ms = std::min(backoff_ms * 2, 200)) {
      bool retry = false;
      fd = connect_one(s, p, context, &retry);
      if (fd.ok() || !retry || s.deadline.expired()) break;
      CHORUS_INFO(kNet, "verbs: rank {} retrying its side channel to {}: {}", s.rank, p.label,
                  fd.status().message());
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    }
    if (!fd.ok()) {
      return fd.take_status().with_context(fmt::format("verbs: rank {} opening its side channel to "
                                                  "{} at {}",
                                                  s.rank, p.label, p.addr.to_string()));
    }
    net::set_keepalive(fd->get(), params::kPeerTimeoutMs.get());
    out[i] = std::make_shared<SideChannel>(std::move(fd).value(), p.label, p.addr.to_string());
    connected[i] = true;
  }
  std::string refused;  // the last incoming connection dropped, for the timeout's message
  while (lower > 0) {
    if (s.deadline.expired()) {
      std::string missing;
      for (size_t i = 0; i < s.peers.size(); ++i) {
        if (connected[i] || s.peers[i].rank > s.rank) continue;
        missing += (missing.empty() ? "" : ", ") + s.peers[i].label;
      }
      return remote_error("verbs: rank {} got no side channel from {} within {} ms "
                          "(CHORUS_CONNECT_TIMEOUT_MS){}",
                          s.rank, missing, (now_ns() - start) / 1000000,
                          refused.empty() ? "" : "; it refused " + refused);
    }
    net::SockAddr from;
    Result<UniqueFd> fd = net::accept_socket(s.listen_fd, s.deadline, &from);
    if (!fd.ok()) {
      if (s.deadline.expired()) continue;  // reported above, naming who is missing
      return fd.take_status().with_context(
          fmt::format("verbs: rank {} accepting side channels", s.rank));
    }
    Result<size_t> index = accept_one(s, fd->get(), context, connected);
    if (!index.ok()) {
      // Anyone can connect: drop it and wait for the real peer until the deadline.
      refused = fmt::format("a connection from {}: {}", from.to_string(), index.status().message());
      CHORUS_WARN_RATELIMITED(kNet, "verbs: rank {} dropped {}", s.rank, refused);
      continue;
    }
    net::set_keepalive(fd->get(), params::kPeerTimeoutMs.get());
    out[*index] = std::make_shared<SideChannel>(std::move(fd).value(), s.peers[*index].label,
                                                from.to_string());
    connected[*index] = true;
    --lower;
  }
  return out;
}

Status exchange_ready(int rank, const std::vector<std::shared_ptr<SideChannel>>& sides,
                      Deadline deadline) {
  for (const auto& side : sides) {
    const uint8_t ready = kReadyByte;
    Status st = net::send_all(side->fd(), &ready, 1, deadline);
    if (!st.ok()) {
      return st.with_context(fmt::format("verbs: rank {} telling {} that its queue pairs are in "
                                         "RTR",
                                         rank, side->peer_label()));
    }
  }
  for (const auto& side : sides) {
    uint8_t got = 0;
    Status st = net::recv_all(side->fd(), &got, 1, deadline);
    if (!st.ok()) {
      return remote_error("verbs: rank {} waited in vain for {} to bring its queue pairs to RTR "
                          "(its connect failed, or it is gone; see its log): {}",
                          rank, side->peer_label(), st.message());
    }
    if (got != kReadyByte) {
      return remote_error("verbs: {} sent {:#x} on its side channel where the ready byte was due",
                          side->peer_label(), got);
    }
  }
  return ok_status();
}

// ---- SideChannel ----------------------------------------------------------------------------

bool SideChannel::gone(bool now) {
  if (gone_ns_ != 0) return true;
  const int64_t t = now_coarse_ns();
  if (!now && t < next_check_ns_) return false;
  next_check_ns_ = t + int64_t{kCheckIntervalMs} * 1000000;
  uint8_t buf[64];
  for (int reads = 0; reads < 16; ++reads) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) continue;  // nothing is due after the ready byte: ignored
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    why_ = n == 0 ? fmt::format("is gone: its side channel ({}) closed without a goodbye (the "
                                "process died, or its host went away)",
                                address_)
                  : fmt::format("is gone: its side channel ({}) broke: {} (the process died, or "
                                "its host went away)",
                                address_, std::strerror(errno));
    gone_ns_ = now_ns();
    return true;
  }
  return false;
}

// ---- WatchedConnection ----------------------------------------------------------------------

WatchedConnection::WatchedConnection(std::unique_ptr<VerbsConnection> inner,
                                     std::shared_ptr<SideChannel> side, int cq_fd)
    : Connection(inner->peer(), inner->channel()),
      inner_(std::move(inner)),
      side_(std::move(side)),
      cq_fd_(cq_fd),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
  // Without the set the side socket is still read by progress(); a sleeper then learns of a
  // dead peer when its sleep slice ends.
  if (epoll_.valid()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = side_->fd();
    side_watched_ = ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, side_->fd(), &ev) == 0;
    ev.data.fd = cq_fd_;
    epoll_ready_ = side_watched_ && ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, cq_fd_, &ev) == 0;
  }
  sync_error();
}

WatchedConnection::~WatchedConnection() {
  inner_.reset();  // its goodbye goes out while the side channel is still open
}

void WatchedConnection::sync_error() {
  if (!inner_->error().ok() && error().ok()) set_error(inner_->error());
  if (!inner_->peer_closed().ok()) set_peer_closed(inner_->peer_closed());
}

void WatchedConnection::post_send(SendRequest* req) {
  inner_->post_send(req);
  sync_error();
}

void WatchedConnection::post_recv(RecvRequest* req) {
  inner_->post_recv(req);
  sync_error();
}

bool WatchedConnection::idle() const { return inner_->idle(); }

void WatchedConnection::farewell(const Status& why) {
  inner_->farewell(why);
  sync_error();
}

bool WatchedConnection::progress() {
  bool moved = inner_->progress();
  moved |= check_side(false);
  sync_error();
  return moved;
}

bool WatchedConnection::peek(MsgTag* tag, uint64_t* bytes) {
  if (inner_->peek(tag, bytes)) return true;
  // The chunk layer waits for a message that a dead peer will never send; one that closed in
  // order said so itself (peer_closed()).
  if (inner_->peer_closed().ok()) check_side(true);
  sync_error();
  return false;
}

bool WatchedConnection::check_side(bool waiting) {
  if (!inner_->error().ok() || !side_->gone()) return false;
  unwatch_side();
  if (!waiting && inner_->idle()) return false;  // a peer that did its part and left
  // Completions that trail the FIN (and the goodbye of a peer that closed normally) get a
  // moment: they say more than "gone".
  if (now_ns() - side_->gone_ns() < int64_t{kGraceMs} * 1000000) return false;
  inner_->fail_peer_gone(side_->why());
  return true;
}

void WatchedConnection::unwatch_side() const {
  if (!side_watched_) return;
  side_watched_ = false;  // a closed socket stays readable: the set would never sleep again
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, side_->fd(), nullptr);
}

int WatchedConnection::poll_fd(short* events) const {
  const int fd = inner_->poll_fd(events);
  if (fd != cq_fd_ || !epoll_ready_ || *events != POLLIN) return fd;
  if (side_watched_ && side_->gone_ns() != 0) unwatch_side();
  return side_watched_ ? epoll_.get() : fd;
}

}  // namespace chorus::verbs
