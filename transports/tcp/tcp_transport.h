// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_transport.h
// TCP transport setup: a rank's data listener, and connect_all(), which opens one
// authenticated socket per (peer, channel). README.md describes the wire format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "net/auth.h"
#include "net/socket.h"
#include "common/clock.h"
#include "common/params.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "transports/transport.h"

namespace chorus::tcp {

// Socket buffer size requested for data sockets (the kernel may cap it at net.core.*mem_max).
inline constexpr int kSocketBufferBytes = 4 << 20;

// A rank's data listener. Created before the bootstrap so that its address can be published.
class TcpListener {
 public:
  // Listens on `bind_addr` (port 0: ephemeral), non-blocking, close-on-exec.
  static Result<std::unique_ptr<TcpListener>> create(const net::SockAddr& bind_addr);

  // The bound address (with its port): what peers connect to.
  const net::SockAddr& address() const { return address_; }
  int fd() const { return fd_.get(); }

 private:
  TcpListener(UniqueFd fd, const net::SockAddr& address) : fd_(std::move(fd)), address_(address) {}
  UniqueFd fd_;
  net::SockAddr address_;
};

struct TcpPeer {
  int rank = -1;
  net::SockAddr addr;  // its TcpListener::address()
  std::string label;   // e.g. "host node7, pid 1234": names the peer in errors with its address
  // Where channel c connects when it differs from `addr` (the peer's other rails): empty, or
  // one address per channel.
  std::vector<net::SockAddr> channel_addr;
};

struct TcpSetup {
  int rank = -1;
  uint64_t comm_uid = 0;
  net::Secret secret;         // the communicator's: every connection proves it
  int channels = 1;                 // connections per peer, equal on every rank (1..64)
  size_t bounce_bytes = 1 << 20;    // per-connection staging buffer of reducing receives
  TcpListener* listener = nullptr;  // ours; required when a peer has a lower rank
  std::vector<TcpPeer> peers;       // any subset of the other ranks, any order
  Deadline deadline = Deadline::after_ms(params::kConnectTimeoutMs.get());
};

using TcpConnections = std::vector<std::vector<std::unique_ptr<Connection>>>;

// Opens one TCP connection per peer and channel, all in parallel without blocking on any one
// peer: for each pair the lower rank connects (retrying refusals) and the higher rank accepts.
// Each connection runs the mutual handshake (net/auth.h, context "chorus-tcp:<uid>",
// setup.secret); then the connector identifies itself (rank, channel, comm_uid) and the
// acceptor acknowledges. Incoming connections that fail authentication, come from a rank that
// is not an expected lower-ranked peer, name another communicator, or duplicate a channel are
// dropped and logged without failing the setup. Returns connections indexed [i][channel] where
// i indexes setup.peers. Several ranks of one process may run it concurrently, each with its
// own listener; one connect_all at a time per listener.
//
// Errors: kInvalidArgument for a malformed setup; kRemoteError when a peer rejects us (wrong
// secret ...) or setup.deadline passes, naming every (peer, channel) still missing and why;
// kSystemError when a socket cannot be created.
Result<TcpConnections> connect_all(const TcpSetup& setup);

// The handshake context of a communicator's TCP connections.
std::string auth_context(uint64_t comm_uid);

// The identification a connector sends once authenticated (README.md), 24 bytes little-endian:
//   u32 magic 'CHTI' | u32 rank | u32 channel | u32 0 | u64 comm_uid
struct Ident {
  int rank = -1;
  uint32_t channel = 0;
  uint64_t comm_uid = 0;
};
inline constexpr size_t kIdentBytes = 24;
void encode_ident(const Ident& ident, uint8_t out[kIdentBytes]);
// kRemoteError for a bad magic; the caller judges rank, channel and comm_uid.
Status decode_ident(const uint8_t in[kIdentBytes], Ident* out);

}  // namespace chorus::tcp
