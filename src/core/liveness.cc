// SPDX-License-Identifier: Apache-2.0
#include "core/liveness.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>

#include "common/clock.h"
#include "common/params.h"

namespace chorus {

namespace {
int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}
}  // namespace

void PeerWatch::add(int rank, int pid, std::string who) {
  for (Proc& p : procs_) {
    if (p.pid == pid) {
      p.ranks.push_back(rank);
      return;
    }
  }
  Proc p;
  p.pid = pid;
  p.pidfd.reset(open_pidfd(pid));  // -1: fall back to kill(pid, 0)
  p.ranks.push_back(rank);
  p.who = std::move(who);
  procs_.push_back(std::move(p));
}

Status PeerWatch::check_now(std::span<const int> waited_for) {
  if (procs_.empty()) return Status();
  auto relevant = [&](const Proc& p) {
    return std::any_of(p.ranks.begin(), p.ranks.end(), [&](int r) {
      return std::find(waited_for.begin(), waited_for.end(), r) != waited_for.end();
    });
  };
  fds_.clear();
  for (const Proc& p : procs_) fds_.push_back(pollfd{relevant(p) ? p.pidfd.get() : -1, POLLIN, 0});
  int ready = ::poll(fds_.data(), fds_.size(), 0);  // negative fds are skipped
  for (size_t i = 0; i < procs_.size(); ++i) {
    const Proc& p = procs_[i];
    if (!relevant(p)) continue;
    bool gone = p.pidfd.valid() ? ready > 0 && (fds_[i].revents & (POLLIN | POLLHUP)) != 0
                                : ::kill(p.pid, 0) != 0 && errno == ESRCH;
    if (!gone) continue;
    std::string ranks = fmt::format("{}", p.ranks.front());
    for (size_t k = 1; k < p.ranks.size(); ++k) ranks += fmt::format(",{}", p.ranks[k]);
    return remote_error("{} has exited (process {} is gone{}): the peer died", p.who, p.pid,
                        p.ranks.size() > 1 ? fmt::format(", with ranks {}", ranks) : "");
  }
  return Status();
}

}  // namespace chorus
