// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_transport.cc
// connect_all(): every (peer, channel) socket set up in one non-blocking poll() loop, each one
// a small state machine: connect -> authenticate -> identify -> acknowledge.
#include "transports/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "common/bytes.h"
#include "common/log.h"
#include "transports/tcp/tcp_connection.h"

namespace chorus::tcp {

namespace {

constexpr uint32_t kIdentMagic = 0x43485449;  // "CHTI"
constexpr size_t kAckBytes = 8;               // magic, status (0 accepted)
constexpr int64_t kIncomingHandshakeMs = 5000;
constexpr size_t kMaxPendingIncoming = 256;
constexpr int kMaxChannels = 64;

using le::get_u32;
using le::get_u64;
using le::put_u32;
using le::put_u64;

// One connection being set up.
struct Link {
  enum class Phase : uint8_t {
    kWaitRetry,
    kConnecting,
    kAuth,
    kSendIdent,
    kRecvAck,  // outgoing
    kRecvIdent,
    kSendAck,  // incoming (after kAuth)
  };
  bool outgoing = false;
  Phase phase = Phase::kAuth;
  size_t peer_idx = 0;  // outgoing: known from the start; incoming: after its ident
  int channel = 0;
  UniqueFd fd;
  net::SockAddr addr;
  std::unique_ptr<net::Handshake> hs;
  short events = POLLIN;
  uint8_t buf[kIdentBytes] = {};
  size_t want = 0;
  size_t moved = 0;
  int64_t retry_at_ns = 0;
  int backoff_ms = 5;
  int64_t expires_ns = INT64_MAX;
  std::string last_error;
  bool claimed = false;  // incoming: holds its (peer, channel) slot in claimed_
  bool dead = false;
};

class Connector {
 public:
  explicit Connector(const TcpSetup& setup)
      : setup_(setup), context_(auth_context(setup.comm_uid)), start_ns_(now_ns()) {}
  Result<TcpConnections> run();

 private:
  Status validate();
  void poll_once();
  void accept_new();
  Status advance(Link& l, short revents);
  Status after_connect(Link& l, int err);
  void on_authenticated(Link& l);
  Status on_ident(Link& l);
  void handle(Link& l, short revents);
  void complete(Link& l);
  void retry_later(Link& l);
  // Moves l.buf[moved, want) one way; true once done.
  Result<bool> move_bytes(Link& l, bool write);
  std::string missing() const;

  const TcpSetup& setup_;
  const std::string context_;
  const int64_t start_ns_;
  std::unordered_map<int, size_t> lower_peers_;  // rank -> index, for peers that connect to us
  std::vector<std::unique_ptr<Link>> links_;
  TcpConnections result_;
  std::vector<std::vector<uint8_t>> claimed_;  // incoming (peer, channel) identified already
  size_t remaining_ = 0;
  size_t incoming_left_ = 0;
  int64_t accept_paused_until_ns_ = 0;
  Status fatal_;
};

Status Connector::validate() {
  if (setup_.rank < 0) return invalid_argument("tcp: invalid rank {}", setup_.rank);
  if (setup_.channels < 1 || setup_.channels > kMaxChannels) {
    return invalid_argument("tcp: {} channels (must be 1..{})", setup_.channels, kMaxChannels);
  }
  std::unordered_map<int, size_t> seen;
  for (size_t i = 0; i < setup_.peers.size(); ++i) {
    const TcpPeer& p = setup_.peers[i];
    if (p.rank < 0 || p.rank == setup_.rank || !seen.emplace(p.rank, i).second) {
      return invalid_argument("tcp: rank {} given peer rank {} (negative, itself or repeated)",
                              setup_.rank, p.rank);
    }
    if (p.rank < setup_.rank) {
      lower_peers_[p.rank] = i;
      if (setup_.listener == nullptr) {
        return invalid_argument("tcp: rank {} needs a listener to accept rank {}", setup_.rank,
                                p.rank);
      }
    } else if (p.addr.family() != AF_INET && p.addr.family() != AF_INET6) {
      return invalid_argument("tcp: rank {} has no address for rank {}", setup_.rank, p.rank);
    }
  }
  return ok_status();
}

Result<TcpConnections> Connector::run() {
  CHORUS_RETURN_IF_ERROR(validate());
  result_.resize(setup_.peers.size());
  claimed_.resize(setup_.peers.size());
  for (size_t i = 0; i < setup_.peers.size(); ++i) {
    result_[i].resize(setup_.channels);
    claimed_[i].assign(setup_.channels, 0);
    bool outgoing = setup_.peers[i].rank > setup_.rank;
    remaining_ += setup_.channels;
    if (!outgoing) incoming_left_ += setup_.channels;
    for (int c = 0; outgoing && c < setup_.channels; ++c) {
      auto link = std::make_unique<Link>();
      link->outgoing = true;
      link->phase = Link::Phase::kWaitRetry;
      link->peer_idx = i;
      link->channel = c;
      const TcpPeer& peer = setup_.peers[i];
      link->addr = peer.channel_addr.empty() ? peer.addr : peer.channel_addr[c];
      links_.push_back(std::move(link));
    }
  }
  while (remaining_ > 0 && fatal_.ok()) {
    if (setup_.deadline.expired()) {
      return remote_error(
          "tcp: rank {} could not set up its connections within {} ms "
          "(CHORUS_CONNECT_TIMEOUT_MS): {}",
          setup_.rank, (now_ns() - start_ns_) / 1000000, missing());
    }
    poll_once();
  }
  if (!fatal_.ok()) return fatal_;
  CHORUS_INFO(kNet, "tcp: rank {} connected to {} peer(s) x {} channel(s) in {} ms", setup_.rank,
              setup_.peers.size(), setup_.channels, (now_ns() - start_ns_) / 1000000);
  return std::move(result_);
}

void Connector::poll_once() {
  std::vector<pollfd> fds;
  std::vector<Link*> owners;
  int64_t now = now_ns();
  bool accepting = incoming_left_ > 0 && now >= accept_paused_until_ns_;
  if (accepting) fds.push_back({setup_.listener->fd(), POLLIN, 0});
  int64_t wake_ns = std::min<int64_t>(setup_.deadline.wake_ns(), now + 1000 * 1000000ll);
  if (incoming_left_ > 0 && !accepting) wake_ns = std::min(wake_ns, accept_paused_until_ns_);
  for (auto& l : links_) {
    if (l->phase == Link::Phase::kWaitRetry) {
      wake_ns = std::min(wake_ns, l->retry_at_ns);
      continue;
    }
    wake_ns = std::min(wake_ns, l->expires_ns);
    fds.push_back({l->fd.get(), l->events, 0});
    owners.push_back(l.get());
  }
  int timeout_ms = static_cast<int>(std::max<int64_t>(0, (wake_ns - now + 999999) / 1000000));
  int rc = ::poll(fds.data(), fds.size(), timeout_ms);
  if (rc < 0 && errno != EINTR) {
    fatal_ = system_error(errno, "tcp: poll() while connecting");
    return;
  }
  size_t first = accepting ? 1 : 0;
  if (rc > 0 && accepting && fds[0].revents != 0) accept_new();
  for (size_t i = 0; rc > 0 && i < owners.size() && fatal_.ok(); ++i) {
    if (fds[first + i].revents != 0) handle(*owners[i], fds[first + i].revents);
  }
  now = now_ns();
  for (size_t i = 0; i < links_.size() && fatal_.ok(); ++i) {
    Link& l = *links_[i];
    if (l.dead) continue;
    if (l.phase == Link::Phase::kWaitRetry && now >= l.retry_at_ns) handle(l, 0);
    if (!l.dead && !l.outgoing && now >= l.expires_ns) {
      CHORUS_WARN_RATELIMITED(kNet,
                              "tcp: rank {} dropped a connection from {}: no handshake within "
                              "{} ms",
                              setup_.rank, l.addr.to_string(), kIncomingHandshakeMs);
      l.dead = true;
    }
  }
  std::erase_if(links_, [](const std::unique_ptr<Link>& l) { return l->dead; });
}

void Connector::accept_new() {
  for (int i = 0; i < 64; ++i) {
    net::SockAddr addr;
    addr.len = sizeof(addr.storage);
    UniqueFd fd(
        accept4(setup_.listener->fd(), addr.mutable_sa(), &addr.len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors or memory: back off instead of spinning on a readable listener.
        CHORUS_WARN_RATELIMITED(kNet, "tcp: rank {}: accept() on {} failed: {}; pausing 100 ms",
                                setup_.rank, setup_.listener->address().to_string(),
                                std::strerror(errno));
        accept_paused_until_ns_ = now_ns() + 100 * 1000000;
      }
      return;
    }
    size_t pending = std::count_if(links_.begin(), links_.end(),
                                   [](const auto& l) { return !l->outgoing && !l->dead; });
    if (pending >= kMaxPendingIncoming) {
      CHORUS_WARN_RATELIMITED(kNet, "tcp: rank {}: {} incoming connections pending; refusing {}",
                              setup_.rank, pending, addr.to_string());
      continue;
    }
    auto link = std::make_unique<Link>();
    link->fd = std::move(fd);
    link->addr = addr;
    link->hs = std::make_unique<net::Handshake>(net::Handshake::Role::kResponder,
                                                      setup_.secret, context_, addr.to_string());
    link->expires_ns = std::min(setup_.deadline.at_ns(), now_ns() + kIncomingHandshakeMs * 1000000);
    links_.push_back(std::move(link));
  }
}

// An outgoing failure names the peer and ends the setup, unless the connection merely broke
// during the handshake (the acceptor may have timed it out under load): that one is retried.
// An incoming failure only drops the socket.
void Connector::handle(Link& l, short revents) {
  Status st = advance(l, revents);
  if (st.ok()) return;
  if (l.outgoing && l.phase == Link::Phase::kAuth && !l.hs->auth_failed()) {
    CHORUS_INFO(kNet, "tcp: rank {} retrying channel {} to {}: {}", setup_.rank, l.channel,
                l.addr.to_string(), st.message());
    l.last_error = st.message();
    l.hs.reset();
    retry_later(l);
    return;
  }
  if (l.outgoing) {
    const TcpPeer& p = setup_.peers[l.peer_idx];
    fatal_ = st.with_context(fmt::format("tcp: rank {} connecting to rank {} ({}) for channel {}",
                                         setup_.rank, p.rank, p.addr.to_string(), l.channel));
    CHORUS_WARN(kNet, "{}", fatal_.message());
    return;
  }
  // Anyone can connect: rate-limited, so that a flood cannot flood the log too.
  CHORUS_WARN_RATELIMITED(kNet, "tcp: rank {} dropped an incoming connection from {}: {}",
                          setup_.rank, l.addr.to_string(), st.message());
  if (l.phase == Link::Phase::kSendAck) {
    uint8_t nack[kAckBytes];
    put_u32(nack, kIdentMagic);
    put_u32(nack + 4, 1);
    [[maybe_unused]] auto ignored = net::send_some(l.fd.get(), nack, sizeof(nack));
  }
  if (l.claimed) claimed_[l.peer_idx][l.channel] = 0;  // the peer may try again
  l.dead = true;
}

void Connector::retry_later(Link& l) {
  l.fd.reset();
  l.phase = Link::Phase::kWaitRetry;
  l.retry_at_ns = now_ns() + int64_t{l.backoff_ms} * 1000000;
  l.backoff_ms = std::min(l.backoff_ms * 2, 200);
}

Result<bool> Connector::move_bytes(Link& l, bool write) {
  while (l.moved < l.want) {
    CHORUS_ASSIGN_OR_RETURN(size_t n,
                            write ? net::send_some(l.fd.get(), l.buf + l.moved, l.want - l.moved)
                                  : net::recv_some(l.fd.get(), l.buf + l.moved, l.want - l.moved));
    if (n == 0) {
      l.events = write ? POLLOUT : POLLIN;
      return false;
    }
    l.moved += n;
  }
  l.moved = 0;
  return true;
}

Status Connector::advance(Link& l, short revents) {
  for (;;) {
    switch (l.phase) {
      case Link::Phase::kWaitRetry: {
        if (now_ns() < l.retry_at_ns) return ok_status();
        int err = 0;
        CHORUS_ASSIGN_OR_RETURN(l.fd, net::connect_start(l.addr, &err));
        if (err == EINPROGRESS) err = -1;  // not finished: wait for POLLOUT
        CHORUS_RETURN_IF_ERROR(after_connect(l, err));
        if (l.phase != Link::Phase::kAuth) return ok_status();
        continue;
      }
      case Link::Phase::kConnecting:
        if (revents == 0) return ok_status();
        CHORUS_RETURN_IF_ERROR(after_connect(l, net::connect_error(l.fd.get())));
        if (l.phase != Link::Phase::kAuth) return ok_status();
        continue;
      case Link::Phase::kAuth: {
        CHORUS_ASSIGN_OR_RETURN(l.events, l.hs->advance(l.fd.get()));
        if (l.events != 0) return ok_status();
        on_authenticated(l);
        continue;
      }
      case Link::Phase::kSendIdent: {
        CHORUS_ASSIGN_OR_RETURN(bool done, move_bytes(l, true));
        if (!done) return ok_status();
        l.phase = Link::Phase::kRecvAck;
        l.want = kAckBytes;
        continue;
      }
      case Link::Phase::kRecvAck: {
        CHORUS_ASSIGN_OR_RETURN(bool done, move_bytes(l, false));
        if (!done) return ok_status();
        if (get_u32(l.buf) != kIdentMagic || get_u32(l.buf + 4) != 0) {
          return remote_error(
              "the peer refused the connection after authentication (it does "
              "not expect rank {} channel {} of communicator {:#x})",
              setup_.rank, l.channel, setup_.comm_uid);
        }
        complete(l);
        return ok_status();
      }
      case Link::Phase::kRecvIdent: {
        CHORUS_ASSIGN_OR_RETURN(bool done, move_bytes(l, false));
        if (!done) return ok_status();
        l.phase = Link::Phase::kSendAck;  // a rejection below is answered from this phase
        CHORUS_RETURN_IF_ERROR(on_ident(l));
        continue;
      }
      case Link::Phase::kSendAck: {
        CHORUS_ASSIGN_OR_RETURN(bool done, move_bytes(l, true));
        if (!done) return ok_status();
        complete(l);
        return ok_status();
      }
    }
  }
}

// The end of one connect attempt (err -1: still in progress): connected (-> kAuth), retry
// later, or give up.
Status Connector::after_connect(Link& l, int err) {
  if (err == -1) {
    l.phase = Link::Phase::kConnecting;
    l.events = POLLOUT;
    return ok_status();
  }
  if (err == 0) {
    l.hs = std::make_unique<net::Handshake>(net::Handshake::Role::kInitiator,
                                                  setup_.secret, context_, l.addr.to_string());
    l.phase = Link::Phase::kAuth;
    return ok_status();
  }
  if (!net::connect_retryable(err)) return system_error(err, "connect()");
  l.last_error = std::strerror(err);
  retry_later(l);
  return ok_status();
}

// Next: the connector identifies itself, the acceptor waits for that.
void Connector::on_authenticated(Link& l) {
  l.hs.reset();
  l.want = kIdentBytes;
  l.phase = l.outgoing ? Link::Phase::kSendIdent : Link::Phase::kRecvIdent;
  if (!l.outgoing) return;
  encode_ident(Ident{setup_.rank, static_cast<uint32_t>(l.channel), setup_.comm_uid}, l.buf);
}

Status Connector::on_ident(Link& l) {
  Ident ident;
  CHORUS_RETURN_IF_ERROR(decode_ident(l.buf, &ident));
  int rank = ident.rank;
  uint32_t channel = ident.channel;
  if (ident.comm_uid != setup_.comm_uid) {
    return remote_error("it belongs to communicator {:#x}, not {:#x}", ident.comm_uid,
                        setup_.comm_uid);
  }
  auto it = lower_peers_.find(rank);
  if (it == lower_peers_.end()) {
    return remote_error("it claims rank {}, which is not a peer that connects to rank {}", rank,
                        setup_.rank);
  }
  if (channel >= static_cast<uint32_t>(setup_.channels) || claimed_[it->second][channel]) {
    return remote_error("rank {} channel {} is out of range or already connected", rank, channel);
  }
  claimed_[it->second][channel] = 1;
  l.claimed = true;
  l.peer_idx = it->second;
  l.channel = static_cast<int>(channel);
  l.expires_ns = INT64_MAX;
  put_u32(l.buf, kIdentMagic);
  put_u32(l.buf + 4, 0);
  l.want = kAckBytes;
  return ok_status();
}

void Connector::complete(Link& l) {
  const TcpPeer& p = setup_.peers[l.peer_idx];
  result_[l.peer_idx][l.channel] = std::make_unique<TcpConnection>(
      std::move(l.fd), setup_.rank, p.rank, l.channel, l.addr, setup_.bounce_bytes, p.label);
  --remaining_;
  if (!l.outgoing) --incoming_left_;
  l.dead = true;
}

std::string Connector::missing() const {
  std::string text;
  int listed = 0;
  for (size_t i = 0; i < result_.size(); ++i) {
    for (int c = 0; c < setup_.channels; ++c) {
      if (result_[i][c] != nullptr) continue;
      if (++listed > 8) continue;
      const TcpPeer& p = setup_.peers[i];
      std::string state = "no authenticated connection from it yet";
      for (const auto& l : links_) {
        if (!l->outgoing || l->peer_idx != i || l->channel != c) continue;
        state = l->phase == Link::Phase::kWaitRetry || l->phase == Link::Phase::kConnecting
                    ? "connecting" +
                          (l->last_error.empty() ? "" : " (last error: " + l->last_error + ")")
                    : "connected, handshake unfinished";
      }
      if (!text.empty()) text += "; ";
      text += fmt::format("rank {} ({}) channel {}: {}", p.rank, p.addr.to_string(), c, state);
    }
  }
  if (listed > 8) text += fmt::format("; and {} more", listed - 8);
  return text;
}

}  // namespace

std::string auth_context(uint64_t comm_uid) { return fmt::format("chorus-tcp:{}", comm_uid); }

void encode_ident(const Ident& ident, uint8_t out[kIdentBytes]) {
  put_u32(out, kIdentMagic);
  put_u32(out + 4, static_cast<uint32_t>(ident.rank));
  put_u32(out + 8, ident.channel);
  put_u32(out + 12, 0);
  put_u64(out + 16, ident.comm_uid);
}

Status decode_ident(const uint8_t in[kIdentBytes], Ident* out) {
  uint32_t magic = get_u32(in);
  if (magic != kIdentMagic) return remote_error("bad identification magic {:#010x}", magic);
  out->rank = static_cast<int>(get_u32(in + 4));
  out->channel = get_u32(in + 8);
  out->comm_uid = get_u64(in + 16);
  return ok_status();
}

Result<std::unique_ptr<TcpListener>> TcpListener::create(const net::SockAddr& bind_addr) {
  net::SockAddr bound;
  CHORUS_ASSIGN_OR_RETURN(UniqueFd fd, net::listen_socket(bind_addr, &bound));
  // Accepted sockets inherit the buffer sizes, which must be set before the handshake to take
  // part in TCP window scaling.
  net::set_buffer_sizes(fd.get(), kSocketBufferBytes);
  return std::unique_ptr<TcpListener>(new TcpListener(std::move(fd), bound));
}

Result<TcpConnections> connect_all(const TcpSetup& setup) {
  Connector connector(setup);
  return connector.run();
}

}  // namespace chorus::tcp
