// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_side.h
// The side channel: one authenticated TCP connection per verbs peer, beside its queue pairs.
//
// RDMA says nothing when a peer process dies: a rank that only waits for it hears nothing, and
// one that writes to it learns it after NCCL_IB_TIMEOUT x (NCCL_IB_RETRY_CNT + 1) (34 s at
// NCCL's defaults). A TCP socket is closed by the dead process's kernel, on any host, at once:
// its EOF fails the connection's requests within milliseconds (WatchedConnection). At setup the
// same socket carries the "ready" round: each rank says so once all its QPs to the peer are in
// RTR, and posts nothing before the peer has said the same, so no first packet is dropped and
// no retransmit timeout is waited for.
//
// Wire: the listener's address travels as a trailer of the verbs blob (append_side_address).
// The lower rank of a pair connects, sends an ident (24 bytes, little-endian: u32 magic 'CHVS',
// u32 its rank, u32 the rank it wants, u32 0, u64 communicator uid), then runs the mutual
// handshake of net/auth.h (context "chorus-verbs:<uid>") as initiator. Afterwards each end
// sends one byte, kReadyByte, when its QPs to the other are in RTR; nothing else follows.
#pragma once

#include <poll.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "net/auth.h"
#include "net/socket.h"
#include "transports/transport.h"

namespace chorus::verbs {

class VerbsConnection;

// ---- The address in the blob ----------------------------------------------------------------

// `blob` followed by the side channel's address: sockaddr bytes, u32 their length, u32 magic
// 'CHSA' (little-endian), so that the verbs blob before it keeps its own format.
std::string append_side_address(std::string blob, const net::SockAddr& addr);
// Splits what a peer published into its verbs blob and its side channel address.
// kRemoteError naming `who` for a missing or malformed trailer.
Status split_side_address(std::string_view published, std::string_view* verbs_blob,
                          net::SockAddr* addr, const std::string& who);

// ---- One peer's side channel ----------------------------------------------------------------

// The socket to one peer, shared by the connections of all its channels. Not thread-safe (the
// connections of one communicator are driven by one thread at a time).
class SideChannel {
 public:
  SideChannel(UniqueFd fd, std::string peer_label, std::string address)
      : fd_(std::move(fd)), peer_label_(std::move(peer_label)), address_(std::move(address)) {}
  int fd() const { return fd_.get(); }
  const std::string& peer_label() const { return peer_label_; }
  // Looks at the socket (at most every kCheckIntervalMs unless `now`): true once the peer has
  // closed it or it broke. Bytes after the ready byte are ignored.
  bool gone(bool now = false);
  // When gone() first saw it (now_ns()), and why ("closed without a goodbye", an errno).
  int64_t gone_ns() const { return gone_ns_; }
  const std::string& why() const { return why_; }
  const std::string& address() const { return address_; }

  static constexpr int kCheckIntervalMs = 5;

 private:
  UniqueFd fd_;
  std::string peer_label_;
  std::string address_;
  int64_t next_check_ns_ = 0;
  int64_t gone_ns_ = 0;
  std::string why_;
};

struct SidePeer {
  int rank = -1;
  net::SockAddr addr;  // its listener
  std::string label;   // "rank 1 (host h, pid p)"
};

struct SideSetup {
  int rank = -1;
  uint64_t comm_uid = 0;
  net::Secret secret;
  int listen_fd = -1;          // ours (non-blocking)
  std::vector<SidePeer> peers;  // any order; each once
  Deadline deadline = Deadline::never();
};

// One authenticated side channel per peer, [i] for setup.peers[i]. Connects to every higher
// rank first (in rank order), then accepts the lower ones: each rank waits only on higher ones,
// so the whole communicator completes. An incoming connection that fails the ident or the
// handshake is dropped (anyone can connect), and named in the error should the deadline pass.
// Errors (kRemoteError) name the peer: a refused handshake, the deadline.
Result<std::vector<std::shared_ptr<SideChannel>>> connect_side_channels(const SideSetup& setup);

// Sends the ready byte to every peer, then waits until every peer has sent its own (bounded by
// `deadline`). Call once this rank's QPs to all of them are in RTR. kRemoteError naming a peer
// that closed its channel instead (its connect failed) or did not answer in time.
Status exchange_ready(int rank, const std::vector<std::shared_ptr<SideChannel>>& sides,
                      Deadline deadline);

// ---- Watching ---------------------------------------------------------------------------------

// A verbs connection watched through its peer's side channel: once the channel closes without
// the peer's goodbye having ended things first, and something still waits here after a short
// grace (in-flight completions and the goodbye itself may trail the FIN), every pending request
// fails with kRemoteError naming the peer's rank, host and pid. An idle connection is not
// failed: a peer that did its part and left is no failure. poll_fd() is an epoll set of the
// connection's completion channel (`cq_fd`) and the side socket, so a sleeping rank wakes when
// the peer dies; whenever the connection offers another fd (completions wait: an always
// readable one), that one is returned as it is.
class WatchedConnection final : public Connection {
 public:
  WatchedConnection(std::unique_ptr<VerbsConnection> inner, std::shared_ptr<SideChannel> side,
                    int cq_fd);
  ~WatchedConnection() override;

  void post_send(SendRequest* req) override;
  void post_recv(RecvRequest* req) override;
  bool progress() override;
  bool idle() const override;
  int poll_fd(short* events) const override;
  bool peek(MsgTag* tag, uint64_t* bytes) override;
  const char* transport_name() const override { return "verbs"; }
  void farewell(const Status& why) override;
  // The watched connection (tests look at its QPs).
  const VerbsConnection& inner() const { return *inner_; }

  static constexpr int kGraceMs = 200;

 private:
  // Fails the inner connection if its peer is gone and something waits for it (`waiting`: a
  // peek for the next message, else a pending request); true if it did.
  bool check_side(bool waiting);
  void sync_error();
  void unwatch_side() const;

  std::unique_ptr<VerbsConnection> inner_;
  std::shared_ptr<SideChannel> side_;
  int cq_fd_;
  UniqueFd epoll_;
  bool epoll_ready_ = false;  // both fds are in the set
  mutable bool side_watched_ = false;
};

}  // namespace chorus::verbs
