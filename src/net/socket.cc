// SPDX-License-Identifier: Apache-2.0
// File: src/net/socket.cc
// Socket addresses, deadline-bounded connect/accept and full-buffer IO. Interface selection
// lives in interfaces.cc.
#include "net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace chorus::net {

// ---- SockAddr -------------------------------------------------------------------------------

int SockAddr::family() const { return len == 0 ? AF_UNSPEC : storage.ss_family; }

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

void SockAddr::set_port(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

std::string SockAddr::to_string() const {
  if (family() == AF_INET) return fmt::format("{}:{}", ip_string(), port());
  if (family() == AF_INET6) return fmt::format("[{}]:{}", ip_string(), port());
  return "<none>";
}

std::string SockAddr::ip_string() const {
  char ip[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, ip, sizeof(ip));
    return ip;
  }
  if (family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    if (in6->sin6_scope_id != 0) return fmt::format("{}%{}", ip, in6->sin6_scope_id);
    return ip;
  }
  return "<none>";
}

bool SockAddr::operator==(const SockAddr& other) const {
  if (family() != other.family() || port() != other.port()) return false;
  if (family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&other.storage)->sin_addr.s_addr;
  }
  if (family() == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    const auto* b = reinterpret_cast<const sockaddr_in6*>(&other.storage);
    return std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(a->sin6_addr)) == 0 &&
           a->sin6_scope_id == b->sin6_scope_id;
  }
  return true;
}

Result<SockAddr> SockAddr::from_sockaddr(const sockaddr* sa, socklen_t len) {
  SockAddr out;
  if (sa == nullptr) return invalid_argument("no socket address");
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    out.len = sizeof(sockaddr_in);
  } else if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    out.len = sizeof(sockaddr_in6);
  } else {
    return invalid_argument("unsupported socket address family {} (length {})", sa->sa_family, len);
  }
  std::memcpy(&out.storage, sa, out.len);
  return out;
}

Result<SockAddr> SockAddr::parse(std::string_view ip, uint16_t port) {
  std::string text(ip);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  SockAddr out;
  auto* in4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  if (inet_pton(AF_INET, text.c_str(), &in4->sin_addr) == 1) {
    in4->sin_family = AF_INET;
    out.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, text.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    out.len = sizeof(sockaddr_in6);
  } else {
    return invalid_argument("'{}' is not a numeric IPv4 or IPv6 address", ip);
  }
  out.set_port(port);
  return out;
}

// ---- Options --------------------------------------------------------------------------------

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_buffer_sizes(int fd, int bytes) {
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void set_keepalive(int fd, int64_t timeout_ms) {
  const int total_s = static_cast<int>(std::clamp<int64_t>(timeout_ms / 1000, 2, 3600));
  int on = 1, idle = total_s / 2, interval = 1, count = total_s - total_s / 2;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

std::string peer_name(int fd) {
  SockAddr addr;
  addr.len = sizeof(addr.storage);
  if (getpeername(fd, addr.mutable_sa(), &addr.len) != 0) return "<unknown peer>";
  if (addr.family() != AF_INET && addr.family() != AF_INET6) return "<unknown peer>";
  return addr.to_string();
}

std::optional<SockAddr> local_addr(int fd) {
  SockAddr addr;
  addr.len = sizeof(addr.storage);
  if (getsockname(fd, addr.mutable_sa(), &addr.len) != 0) return std::nullopt;
  return addr;
}

Result<short> poll_one(int fd, short events, int timeout_ms) {
  pollfd pfd{fd, events, 0};
  int64_t until_ns = timeout_ms < 0 ? INT64_MAX : now_ns() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    int rc = ::poll(&pfd, 1, timeout_ms);
    if (rc >= 0) return rc == 0 ? short{0} : pfd.revents;
    if (errno != EINTR) return system_error(errno, "poll() on a socket");
    if (timeout_ms >= 0) {
      timeout_ms = static_cast<int>(std::max<int64_t>(0, (until_ns - now_ns()) / 1000000));
    }
  }
}

// ---- Listen, connect, accept ----------------------------------------------------------------

Result<UniqueFd> listen_socket(const SockAddr& addr, SockAddr* bound, int backlog) {
  if (addr.family() != AF_INET && addr.family() != AF_INET6) {
    return invalid_argument("cannot listen on {}: not an IPv4 or IPv6 address", addr.to_string());
  }
  UniqueFd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return system_error(errno, "socket() for a listener");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr.family() == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (::bind(fd.get(), addr.sa(), addr.len) != 0) {
    return system_error(errno, fmt::format("bind() to {}", addr.to_string()));
  }
  if (::listen(fd.get(), backlog) != 0) {
    return system_error(errno, fmt::format("listen() on {}", addr.to_string()));
  }
  if (bound != nullptr) {
    SockAddr local;
    local.len = sizeof(local.storage);
    if (getsockname(fd.get(), local.mutable_sa(), &local.len) != 0) {
      return system_error(errno,
                          fmt::format("getsockname() of the listener on {}", addr.to_string()));
    }
    *bound = local;
  }
  return fd;
}

Result<UniqueFd> connect_start(const SockAddr& to, int* errno_out) {
  if (to.family() != AF_INET && to.family() != AF_INET6) {
    return invalid_argument("cannot connect to {}: not an IPv4 or IPv6 address", to.to_string());
  }
  UniqueFd fd(::socket(to.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid())
    return system_error(errno, fmt::format("socket() to connect to {}", to.to_string()));
  int rc;
  do {
    rc = ::connect(fd.get(), to.sa(), to.len);
  } while (rc != 0 && errno == EINTR);
  *errno_out = rc == 0 ? 0 : errno;
  return fd;
}

int connect_error(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

bool connect_retryable(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ETIMEDOUT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ECONNRESET:
    case ECONNABORTED:
    case EAGAIN:
    case EADDRNOTAVAIL:
    case ENETDOWN:
    case EHOSTDOWN:
      return true;
    default:
      return false;
  }
}

namespace {

// One connect attempt bounded by `deadline`: a connected socket, or the errno that stopped it
// (ETIMEDOUT when the deadline passed while the handshake was in flight).
Result<UniqueFd> connect_once(const SockAddr& to, Deadline deadline, int* err) {
  CHORUS_ASSIGN_OR_RETURN(UniqueFd fd, connect_start(to, err));
  if (*err == EINPROGRESS) {
    CHORUS_ASSIGN_OR_RETURN(short revents,
                            poll_one(fd.get(), POLLOUT, deadline.remaining_ms(INT32_MAX)));
    *err = revents == 0 ? ETIMEDOUT : connect_error(fd.get());
  }
  return fd;
}

}  // namespace

Result<UniqueFd> connect_socket(const SockAddr& to, Deadline deadline) {
  int64_t start_ns = now_ns();
  int backoff_ms = 5;
  for (;;) {
    int err = 0;
    CHORUS_ASSIGN_OR_RETURN(UniqueFd fd, connect_once(to, deadline, &err));
    if (err == 0) {
      set_nodelay(fd.get());
      return fd;
    }
    if (!connect_retryable(err)) {
      return system_error(err, fmt::format("connect() to {}", to.to_string()));
    }
    if (deadline.expired()) {
      return remote_error("could not connect to {} within {} ms (last error: {})", to.to_string(),
                          (now_ns() - start_ns) / 1000000, std::strerror(err));
    }
    // Plain sleep: there is no fd to wait on between attempts.
    poll(nullptr, 0, std::min(backoff_ms, deadline.remaining_ms(backoff_ms)));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

Result<UniqueFd> accept_socket(int listen_fd, Deadline deadline, SockAddr* peer) {
  int64_t start_ns = now_ns();
  for (;;) {
    SockAddr addr;
    addr.len = sizeof(addr.storage);
    UniqueFd fd(accept4(listen_fd, addr.mutable_sa(), &addr.len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) {
      set_nodelay(fd.get());
      if (peer != nullptr) *peer = addr;
      return fd;
    }
    int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) return system_error(err, "accept()");
    if (deadline.expired()) {
      return remote_error("timed out after {} ms waiting for a connection",
                          (now_ns() - start_ns) / 1000000);
    }
    CHORUS_ASSIGN_OR_RETURN(short revents,
                            poll_one(listen_fd, POLLIN, deadline.remaining_ms(1000)));
    (void)revents;
  }
}

// ---- IO -------------------------------------------------------------------------------------

Result<size_t> send_some(int fd, const void* data, size_t bytes) {
  for (;;) {
    ssize_t n = ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    if (errno == EPIPE || errno == ECONNRESET) {
      return remote_error("connection closed by {} ({})", peer_name(fd), std::strerror(errno));
    }
    return system_error(errno, fmt::format("send() to {}", peer_name(fd)));
  }
}

Result<size_t> recv_some(int fd, void* data, size_t bytes) {
  if (bytes == 0) return size_t{0};
  for (;;) {
    ssize_t n = ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return remote_error("connection closed by {}", peer_name(fd));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    if (errno == ECONNRESET) return remote_error("connection closed by {} (reset)", peer_name(fd));
    return system_error(errno, fmt::format("recv() from {}", peer_name(fd)));
  }
}

namespace {

// Moves `bytes` with `io` (send_some or recv_some), polling for `events` until the deadline.
template <typename Io, typename Buf>
Status transfer_all(int fd, Buf* data, size_t bytes, Deadline deadline, short events, Io io,
                    const char* verb) {
  int64_t start_ns = now_ns();
  size_t done = 0;
  while (done < bytes) {
    CHORUS_ASSIGN_OR_RETURN(size_t n, io(fd, data + done, bytes - done));
    done += n;
    if (done == bytes) break;
    if (n > 0) continue;
    if (deadline.expired()) {
      return remote_error("timed out after {} ms {} {} ({} of {} bytes done)",
                          (now_ns() - start_ns) / 1000000, verb, peer_name(fd), done, bytes);
    }
    CHORUS_ASSIGN_OR_RETURN(short revents, poll_one(fd, events, deadline.remaining_ms(1000)));
    (void)revents;
  }
  return ok_status();
}

}  // namespace

Status send_all(int fd, const void* data, size_t bytes, Deadline deadline) {
  return transfer_all(fd, static_cast<const char*>(data), bytes, deadline, POLLOUT, send_some,
                      "sending to");
}

Status recv_all(int fd, void* data, size_t bytes, Deadline deadline) {
  return transfer_all(fd, static_cast<char*>(data), bytes, deadline, POLLIN, recv_some,
                      "receiving from");
}

Result<SockAddr> resolve(std::string_view host, uint16_t port) {
  std::string name(host);
  if (auto numeric = SockAddr::parse(name, port); numeric.ok()) return numeric;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (rc != 0) return invalid_argument("host '{}' does not resolve: {}", name, gai_strerror(rc));
  Result<SockAddr> best = invalid_argument("host '{}' has no IPv4 or IPv6 address", name);
  for (int family : {AF_INET, AF_INET6}) {
    for (addrinfo* a = found; a != nullptr && !best.ok(); a = a->ai_next) {
      if (a->ai_family != family) continue;
      best = SockAddr::from_sockaddr(a->ai_addr, a->ai_addrlen);
    }
  }
  freeaddrinfo(found);
  if (best.ok()) best->set_port(port);
  return best;
}

}  // namespace chorus::net
