// SPDX-License-Identifier: Apache-2.0
// File: src/net/socket.h
// TCP socket helpers shared by the bootstrap and the TCP transport: addresses, interface
// selection (CHORUS_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), and deadline-bounded connect, accept
// and full-buffer IO on non-blocking sockets.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace chorus::net {

// An IPv4 or IPv6 socket address (with port).
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  // AF_INET, AF_INET6, or AF_UNSPEC when empty.
  int family() const;
  uint16_t port() const;  // host byte order
  void set_port(uint16_t port);
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* mutable_sa() { return reinterpret_cast<sockaddr*>(&storage); }
  bool empty() const { return len == 0; }
  // "192.0.2.2:41234", "[fd00::2]:41234", or "<none>".
  std::string to_string() const;
  // The address alone: "192.0.2.2", "fd00::2", "fe80::1%2", or "<none>" (an interface's
  // address has no port: to_string() would print ":0").
  std::string ip_string() const;
  // Address and port equal (scope id included for IPv6).
  bool operator==(const SockAddr& other) const;

  // Copies `len` bytes of an AF_INET / AF_INET6 sockaddr; kInvalidArgument otherwise.
  static Result<SockAddr> from_sockaddr(const sockaddr* sa, socklen_t len);
  // Parses a numeric IPv4 or IPv6 literal ("127.0.0.1", "::1"); no name resolution.
  static Result<SockAddr> parse(std::string_view ip, uint16_t port);
};

// A local interface address that is up.
struct Interface {
  std::string name;
  SockAddr addr;  // port 0
  bool loopback = false;
};

// The addresses of interfaces that are up, restricted to CHORUS_SOCKET_FAMILY (ANY, AF_INET,
// AF_INET6), in preference order: non-loopback IPv4, non-loopback IPv6 (link-local excluded),
// then loopback. Names starting with "docker" or "virbr" are skipped unless `include_bridges`.
Result<std::vector<Interface>> list_interfaces(bool include_bridges = false);

// The name of the interface that holds local address `addr` (the port is ignored), or "" when
// none does (it went away meanwhile).
std::string interface_holding(const SockAddr& addr);
// Whether interface `name` is down now (administratively, or without carrier: a pulled cable),
// asked through any socket `fd`. False when the kernel cannot say (the name is gone: unknown is
// not down).
bool interface_down(int fd, const std::string& name);

// NCCL_SOCKET_IFNAME syntax: comma-separated name prefixes ("eth,ib"); a leading '^' excludes
// the listed names instead; a leading '=' (after any '^') compares whole names. An empty spec
// matches every name.
bool ifname_matches(std::string_view spec, std::string_view name);

// The interface bootstrap and TCP use: the first of list_interfaces() matching
// CHORUS_SOCKET_IFNAME (alias NCCL_SOCKET_IFNAME). With an empty spec that is the first
// non-loopback interface, else loopback. kInvalidArgument naming the spec (and listing the
// interfaces that are up) when nothing matches; kSystemError when nothing is up at all.
Result<Interface> pick_interface();

// `host` (a name or a numeric address) and `port` as an address to connect to: IPv4 first,
// then IPv6. kInvalidArgument naming the host when it does not resolve.
Result<SockAddr> resolve(std::string_view host, uint16_t port);

// The rails: with CHORUS_SOCKET_IFNAME set, one address of every interface it matches (of
// pick_interface()'s family and loopback-ness), in name order, so that hosts cabled alike
// list their rails alike (rail0, rail1, ...); without it, pick_interface() alone.
Result<std::vector<Interface>> pick_rails();

// A listening TCP socket on `addr` (port 0: ephemeral): non-blocking, close-on-exec,
// SO_REUSEADDR (IPV6_V6ONLY for IPv6). `bound` receives the address actually bound.
Result<UniqueFd> listen_socket(const SockAddr& addr, SockAddr* bound, int backlog = 1024);

// Starts a non-blocking connect to `to` from a fresh non-blocking, close-on-exec socket.
// On return *errno_out is 0 (connected), EINPROGRESS (poll for POLLOUT, then call
// connect_error()), or a connect errno (the socket is still returned so the caller may retry).
// Fails only when the socket itself cannot be created.
Result<UniqueFd> connect_start(const SockAddr& to, int* errno_out);
// SO_ERROR of a socket whose non-blocking connect has finished (0: connected).
int connect_error(int fd);
// True for connect errnos worth retrying (the listener may not be up yet, transient routes).
bool connect_retryable(int err);

// Connects to `to`, retrying ECONNREFUSED, ETIMEDOUT, ENETUNREACH and similar with a short
// backoff until `deadline`. The socket is non-blocking, close-on-exec and TCP_NODELAY.
// kRemoteError naming the address and the last errno when the deadline passes.
Result<UniqueFd> connect_socket(const SockAddr& to, Deadline deadline);

// Accepts one connection on a non-blocking listening socket, waiting until `deadline`. The
// socket is non-blocking, close-on-exec and TCP_NODELAY; `peer` receives its address.
Result<UniqueFd> accept_socket(int listen_fd, Deadline deadline, SockAddr* peer = nullptr);

// Sends / receives exactly `bytes` on a non-blocking socket, polling until `deadline`.
// EOF or ECONNRESET: kRemoteError "connection closed by <addr>"; deadline: kRemoteError
// "timed out after N ms ..."; other failures: kSystemError with errno. Never raises SIGPIPE.
Status send_all(int fd, const void* data, size_t bytes, Deadline deadline);
Status recv_all(int fd, void* data, size_t bytes, Deadline deadline);

// One non-blocking attempt: the number of bytes moved, 0 when the socket would block.
// recv_some reports EOF and resets as kRemoteError; other errnos as kSystemError.
Result<size_t> send_some(int fd, const void* data, size_t bytes);
Result<size_t> recv_some(int fd, void* data, size_t bytes);

// Waits until `fd` reports one of `events` (or an error/hangup), at most `timeout_ms`
// (-1: forever). Returns revents, 0 on timeout. Retries EINTR.
Result<short> poll_one(int fd, short events, int timeout_ms);

// The peer address of a connected socket, "<unknown peer>" when not available.
std::string peer_name(int fd);
// The local address of a socket (getsockname), or nullopt when not available.
std::optional<SockAddr> local_addr(int fd);

// Best-effort socket options (failures are ignored: they only affect performance).
void set_nodelay(int fd);
void set_buffer_sizes(int fd, int bytes);
// TCP keepalive that breaks the connection (ETIMEDOUT on the next read or write) when the peer
// has answered nothing for about `timeout_ms` while the connection was idle: probes start
// after half of it, one per second. Whole seconds, at least 2 s.
void set_keepalive(int fd, int64_t timeout_ms);

}  // namespace chorus::net
