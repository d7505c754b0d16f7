// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_mender.h
// Reconnects failed TCP paths in the background (README.md, "Failover"). One per TCP instance
// (communicator rank) that has failover groups; its thread starts at the first failure. Every
// second it tries to connect again each abandoned path this rank opened (the lower rank of a
// pair connects, as at setup), and it accepts the peers' attempts on a copy of the rank's
// listening socket; each new socket is authenticated (net/auth.h) and identified (rank,
// channel, communicator) as at setup, then handed to its connection, which moves its stream
// back onto it (TcpConnection::adopt_socket).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "net/auth.h"

namespace chorus::tcp {

struct TcpPeerGroup;
class TcpConnection;

class TcpMender {
 public:
  // `listener_fd`: the rank's listening socket (duplicated: the mender keeps its own copy).
  TcpMender(int my_rank, uint64_t comm_uid, const net::Secret& secret, int listener_fd);
  ~TcpMender();  // stops the thread (within about a second)
  TcpMender(const TcpMender&) = delete;
  TcpMender& operator=(const TcpMender&) = delete;

  void add(TcpPeerGroup* group);
  void remove(TcpPeerGroup* group);
  // A path of a group failed: start the thread if it is not running.
  void wake();

 private:
  void run();
  // Connects the abandoned paths this rank opens (one attempt each).
  void connect_round();
  // Accepts and places incoming attempts for about `wait_ms`.
  void accept_round(int wait_ms);
  // Hands `fd` to the abandoned connection (peer, channel), if one still waits for it.
  bool place(int peer, int channel, UniqueFd* fd);
  bool wanted(int peer, int channel);
  // Calls fn(connection) for the abandoned connection (peer, channel) that waits for a socket,
  // with the locks held that keep it alive; false when there is none.
  template <typename Fn>
  bool with_waiting(int peer, int channel, Fn&& fn);

  const int my_rank_;
  const uint64_t comm_uid_;
  const net::Secret secret_;
  UniqueFd listener_;
  std::mutex mutex_;  // guards groups_ (and their members, against their destruction)
  std::vector<TcpPeerGroup*> groups_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace chorus::tcp
