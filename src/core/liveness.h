// SPDX-License-Identifier: Apache-2.0
// File: src/core/liveness.h
// Notices that a peer process on this host has died. A process killed in the middle of a
// collective leaves its shared-memory FIFOs open and silent: nothing on the wire says it is
// gone. Each comm keeps a pidfd (pidfd_open, Linux 5.3) per peer process it reaches through
// shared memory; a pidfd becomes readable when its process exits, so one poll() with a zero
// timeout tells a waiting rank within CHORUS_LIVENESS_MS that its peer is gone, long before
// CHORUS_TIMEOUT_MS. (A dead process's TCP sockets are closed by its kernel; a host that vanishes
// is noticed by Connection::check_alive and keepalive, CHORUS_PEER_TIMEOUT_MS.)
#pragma once

#include <poll.h>

#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace chorus {

class PeerWatch {
 public:
  // Watches the process of `rank` (described as `who` in messages). Several ranks may share a
  // process; it is watched once. Without pidfd support the rank is checked with kill(pid, 0).
  void add(int rank, int pid, std::string who);
  bool empty() const { return procs_.empty(); }
  // kRemoteError naming the ranks, host and pid of a process that has exited and runs one of
  // `waited_for` (the peers an operation waits for); OK otherwise. A peer that finished its part
  // of the work and exited is no failure: its neighbours that still wait for it notice, and
  // their failure reaches the others by farewell frames.
  Status check_now(std::span<const int> waited_for);

 private:
  struct Proc {
    int pid = 0;
    UniqueFd pidfd;
    std::vector<int> ranks;
    std::string who;
  };
  std::vector<Proc> procs_;
  std::vector<pollfd> fds_;
};

}  // namespace chorus
