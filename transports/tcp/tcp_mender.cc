// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_mender.cc
// The background reconnection of failed TCP paths (tcp_mender.h).
#include "transports/tcp/tcp_mender.h"

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <string>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/socket.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_transport.h"

namespace chorus::tcp {

namespace {

constexpr uint32_t kMendAckMagic = 0x43484d41;  // "CHMA": the acceptor takes the socket
constexpr int kStepMs = 2000;                    // bound of each blocking step of an attempt
constexpr int64_t kRetryNs = 1'000'000'000;      // between two attempts of one path

struct Target {
  int peer;
  int channel;
  net::SockAddr addr;
};

}  // namespace

TcpMender::TcpMender(int my_rank, uint64_t comm_uid, const net::Secret& secret, int listener_fd)
    : my_rank_(my_rank), comm_uid_(comm_uid), secret_(secret),
      listener_(::fcntl(listener_fd, F_DUPFD_CLOEXEC, 0)) {}

TcpMender::~TcpMender() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void TcpMender::add(TcpPeerGroup* group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(group);
}

void TcpMender::remove(TcpPeerGroup* group) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(groups_, group);
}

void TcpMender::wake() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!thread_.joinable() && listener_.valid()) thread_ = std::thread([this] { run(); });
}

void TcpMender::run() {
  int64_t next_connect_ns = now_ns() + kRetryNs;
  while (!stop_.load()) {
    if (now_ns() >= next_connect_ns) {
      connect_round();
      next_connect_ns = now_ns() + kRetryNs;
    }
    accept_round(200);
  }
}

void TcpMender::connect_round() {
  std::vector<Target> targets;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (TcpPeerGroup* g : groups_) {
      std::lock_guard<std::mutex> members(g->mutex);
      for (TcpConnection* m : g->members) {
        if (m != nullptr && m->wants_socket() && m->connects())
          targets.push_back({m->peer(), m->channel(), m->peer_sockaddr()});
      }
    }
  }
  const std::string context = auth_context(comm_uid_);
  for (const Target& t : targets) {
    if (stop_.load()) return;
    Deadline step = Deadline::after_ms(kStepMs);
    Result<UniqueFd> fd = net::connect_socket(t.addr, Deadline::after_ms(kStepMs / 2));
    if (!fd.ok()) continue;  // still down: next round
    Status st = net::auth_initiator(fd->get(), secret_, context, step);
    uint8_t buf[kIdentBytes];
    encode_ident(Ident{my_rank_, static_cast<uint32_t>(t.channel), comm_uid_}, buf);
    if (st.ok()) st = net::send_all(fd->get(), buf, kIdentBytes, step);
    if (st.ok()) st = net::recv_all(fd->get(), buf, 8, step);
    if (!st.ok() || le::get_u32(buf) != kMendAckMagic) {
      CHORUS_INFO(kNet, "tcp: rank {} could not reconnect channel {} to rank {} ({}) yet: {}",
                  my_rank_, t.channel, t.peer, t.addr.to_string(),
                  st.ok() ? std::string("refused") : st.message());
      continue;
    }
    UniqueFd sock = std::move(fd).value();
    if (!place(t.peer, t.channel, &sock)) continue;
    CHORUS_INFO(kNet, "tcp: rank {} reconnected channel {} to rank {} ({})", my_rank_, t.channel,
                t.peer, t.addr.to_string());
  }
}

void TcpMender::accept_round(int wait_ms) {
  pollfd p{listener_.get(), POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return;
  net::SockAddr from;
  Result<UniqueFd> fd = net::accept_socket(listener_.get(), Deadline::after_ms(0), &from);
  if (!fd.ok()) return;
  Deadline step = Deadline::after_ms(kStepMs);
  uint8_t buf[kIdentBytes];
  Ident ident;
  Status st = net::auth_responder(fd->get(), secret_, auth_context(comm_uid_), step);
  if (st.ok()) st = net::recv_all(fd->get(), buf, kIdentBytes, step);
  if (st.ok()) st = decode_ident(buf, &ident);
  if (st.ok() && ident.comm_uid != comm_uid_) st = remote_error("another communicator");
  if (!st.ok()) {
    CHORUS_INFO(kNet, "tcp: rank {} dropped a reconnection from {}: {}", my_rank_,
                from.to_string(), st.message());
    return;
  }
  UniqueFd sock = std::move(fd).value();
  // A path that does not wait for a socket (not failed here yet, or taken back already)
  // refuses by closing. Else the answer goes first: the connector hands its end over only
  // after it.
  if (!wanted(ident.rank, static_cast<int>(ident.channel))) return;
  uint8_t ack[8] = {};
  le::put_u32(ack, kMendAckMagic);
  if (!net::send_all(sock.get(), ack, sizeof(ack), step).ok()) return;
  if (place(ident.rank, static_cast<int>(ident.channel), &sock)) {
    CHORUS_INFO(kNet, "tcp: rank {} took back channel {} from rank {} ({})", my_rank_,
                ident.channel, ident.rank, from.to_string());
  }
}

template <typename Fn>
bool TcpMender::with_waiting(int peer, int channel, Fn&& fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (TcpPeerGroup* g : groups_) {
    std::lock_guard<std::mutex> members(g->mutex);  // the connection stays while fn runs
    for (TcpConnection* m : g->members) {
      if (m != nullptr && m->peer() == peer && m->channel() == channel && m->wants_socket()) {
        fn(m);
        return true;
      }
    }
  }
  return false;
}

bool TcpMender::wanted(int peer, int channel) {
  return with_waiting(peer, channel, [](TcpConnection*) {});
}

bool TcpMender::place(int peer, int channel, UniqueFd* fd) {
  return with_waiting(peer, channel, [&](TcpConnection* m) { m->offer_socket(std::move(*fd)); });
}

}  // namespace chorus::tcp
