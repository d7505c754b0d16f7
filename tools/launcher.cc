// SPDX-License-Identifier: Apache-2.0
#include "tools/launcher.h"

#include <chorus/launch.h>
#include <fmt/format.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/unique_fd.h"

extern char** environ;

namespace chorus::launch {

bool RankExit::ok() const { return !killed_by_us && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int RankExit::exit_code() const {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string RankExit::describe() const {
  if (killed_by_us) {
    // Say why: a timeout that fires must name itself, or it reads like a crash.
    std::string why;
    if (stop == Stop::kTimeout) {
      why = timeout_ms % 1000 == 0 ? fmt::format(" after --timeout {} s", timeout_ms / 1000)
                                   : fmt::format(" after its timeout of {} ms", timeout_ms);
    } else if (stop == Stop::kOtherRankFailed && failed_rank >= 0) {
      why = fmt::format(" after rank {} failed", failed_rank);
    }
    return fmt::format("rank {} (pid {}) was stopped by the launcher{}", rank, pid, why);
  }
  if (WIFEXITED(status)) return fmt::format("rank {} (pid {}) exited with {}", rank, pid, WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("rank {} (pid {}) was killed by signal {} ({})", rank, pid, WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return fmt::format("rank {} (pid {}) ended with status {:#x}", rank, pid, status);
}

namespace {

std::vector<std::string> rank_environment(const Options& o, const std::string& id_hex, int rank) {
  std::vector<std::string> env;
  // Variables the launcher sets itself, or that the caller gives with -x (which override the
  // inherited ones: getenv returns the first of two entries with one name).
  auto ours = [&o](const char* e) {
    for (const char* p : {"CHORUS_UNIQUE_ID=", "CHORUS_RANK=", "CHORUS_NRANKS=", "CHORUS_LOCAL_RANK=",
                          "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE="})
      if (std::strncmp(e, p, std::strlen(p)) == 0) return true;
    for (const std::string& x : o.env) {
      size_t eq = x.find('=');
      size_t name = eq == std::string::npos ? x.size() : eq;
      if (std::strncmp(e, x.c_str(), name) == 0 && e[name] == '=') return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e)
    if (!ours(*e)) env.emplace_back(*e);
  for (const auto& e : o.env) env.push_back(e);
  env.push_back("CHORUS_UNIQUE_ID=" + id_hex);
  for (const char* name : {"CHORUS_RANK=", "RANK=", "CHORUS_LOCAL_RANK=", "LOCAL_RANK="})
    env.push_back(name + std::to_string(rank));
  for (const char* name : {"CHORUS_NRANKS=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE="})
    env.push_back(name + std::to_string(o.nranks));
  return env;
}

// fork + setns + exec: posix_spawn cannot enter a network namespace. Everything the child
// touches is prepared before fork(); the child only makes async-signal-safe calls.
Result<pid_t> spawn_in_netns(const std::string& program, char* const* argv, char* const* envp,
                             const std::string& netns) {
  std::string path = "/var/run/netns/" + netns;
  int ns_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0) return system_error(errno, fmt::format("open {}", path));
  pid_t pid = fork();
  if (pid < 0) {
    close(ns_fd);
    return system_error(errno, "fork");
  }
  if (pid == 0) {
    static const char kSetns[] = "chorus-run: setns failed\n";
    static const char kExec[] = "chorus-run: exec failed\n";
    if (setns(ns_fd, CLONE_NEWNET) != 0) {
      [[maybe_unused]] ssize_t n = write(2, kSetns, sizeof(kSetns) - 1);
      _exit(127);
    }
    execve(program.c_str(), argv, envp);
    [[maybe_unused]] ssize_t n = write(2, kExec, sizeof(kExec) - 1);
    _exit(127);
  }
  close(ns_fd);
  return pid;
}

// The program's path, as execvp would find it, checked before any rank starts: a name that
// cannot be run is one clear error, not N failed ranks.
Result<std::string> resolve_program(const std::string& name) {
  auto runnable = [](const std::string& path) -> Status {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return system_error(errno, fmt::format("cannot start {}", path));
    if (S_ISDIR(st.st_mode)) return invalid_argument("cannot start {}: it is a directory", path);
    if (access(path.c_str(), X_OK) != 0)
      return system_error(errno, fmt::format("cannot start {} (no execute permission?)", path));
    return Status();
  };
  if (name.empty()) return invalid_argument("no program to start");
  if (name.find('/') != std::string::npos) {
    CHORUS_RETURN_IF_ERROR(runnable(name));
    return name;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t colon = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, colon - pos);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (runnable(candidate).ok()) return candidate;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return invalid_argument("cannot start {}: no executable of that name on PATH ({})", name, dirs);
}

// Signals only ranks that were started (pid > 0): kill(0, ...) would hit the launcher's own
// process group, and with it the shell or CI job that called it.
void stop_all(std::vector<RankExit>& ranks, const std::vector<bool>& done,
              RankExit::Stop why = RankExit::Stop::kNone, int failed_rank = -1,
              int timeout_ms = 0) {
  for (size_t r = 0; r < ranks.size(); ++r)
    if (!done[r] && ranks[r].pid > 0) {
      kill(ranks[r].pid, SIGTERM);
      ranks[r].killed_by_us = true;
      ranks[r].stop = why;
      ranks[r].failed_rank = failed_rank;
      ranks[r].timeout_ms = timeout_ms;
    }
}

// A descriptor that becomes readable when child `pid` exits (pidfd_open, Linux 5.3), or an
// invalid one where the kernel has none.
UniqueFd open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
#else
  (void)pid;
  return UniqueFd();
#endif
}

// Sleeps until a rank that is not done exits, or at most `cap_ms`. The ranks' pidfds wake it
// at once. Without them, it sleeps 5 ms: the launcher then wakes 200 times a second, and each
// wake takes a core from a rank (in the 2-vCPU soft-RoCE guest that doubled the 8-byte
// ping-pong's samples over 100 us).
void wait_for_exit(const std::vector<UniqueFd>& pidfds, const std::vector<bool>& done,
                   int cap_ms) {
  std::vector<pollfd> fds;
  for (size_t r = 0; r < pidfds.size(); ++r) {
    if (done[r]) continue;
    if (!pidfds[r].valid()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(cap_ms, 5)));
      return;
    }
    fds.push_back(pollfd{pidfds[r].get(), POLLIN, 0});
  }
  if (!fds.empty()) poll(fds.data(), fds.size(), cap_ms);
}

}  // namespace

Result<std::vector<RankExit>> run(const Options& o) {
  if (o.nranks < 1 || o.argv.empty()) return invalid_argument("need at least one rank and a program");
  CHORUS_ASSIGN_OR_RETURN(std::string program, resolve_program(o.argv[0]));
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess)
    return Status(Code::kSystemError, fmt::format("ncclGetUniqueId: {}", ncclGetLastError(nullptr)));
  char hex[CHORUS_UNIQUE_ID_HEX_BYTES];
  chorusUniqueIdToHex(&id, hex);
  std::vector<RankExit> ranks(o.nranks);
  std::vector<bool> done(o.nranks, false);
  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < o.nranks; ++r) {
    std::vector<std::string> env = rank_environment(o, hex, r);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    ranks[r].rank = r;
    Status started;
    if (o.netns.empty()) {
      int err = posix_spawn(&ranks[r].pid, program.c_str(), nullptr, nullptr, argv.data(),
                            envp.data());
      if (err != 0) started = system_error(err, fmt::format("cannot start {}", o.argv[0]));
    } else {
      auto pid = spawn_in_netns(program, argv.data(), envp.data(),
                                o.netns[r % o.netns.size()]);
      if (pid.ok()) ranks[r].pid = *pid;
      else started = pid.take_status();
    }
    if (!started.ok()) {
      stop_all(ranks, done);
      for (int k = 0; k < r; ++k) waitpid(ranks[k].pid, &ranks[k].status, 0);
      return started;
    }
  }
  std::vector<UniqueFd> pidfds;
  for (const RankExit& r : ranks) pidfds.push_back(open_pidfd(r.pid));
  Deadline deadline = o.timeout_ms > 0 ? Deadline::after_ms(o.timeout_ms) : Deadline::never();
  int remaining = o.nranks;
  bool stopping = false;
  int64_t stop_ns = 0;
  while (remaining > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < o.nranks; ++r) {
        if (ranks[r].pid != pid || done[r]) continue;
        done[r] = true;
        ranks[r].status = status;
        --remaining;
        if (!stopping && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          stopping = true;  // one rank failed: the others would wait for it in vain
          stop_ns = now_ns();
          stop_all(ranks, done, RankExit::Stop::kOtherRankFailed, r);
        }
      }
      continue;
    }
    if (!stopping && deadline.expired()) {
      stopping = true;
      stop_ns = now_ns();
      stop_all(ranks, done, RankExit::Stop::kTimeout, -1, o.timeout_ms);
    }
    if (stopping && now_ns() - stop_ns > 2000000000) {
      for (int r = 0; r < o.nranks; ++r)
        if (!done[r] && ranks[r].pid > 0) kill(ranks[r].pid, SIGKILL);
    }
    // Stopping: look again within 100 ms (the SIGKILL above comes 2 s after the stop).
    wait_for_exit(pidfds, done, stopping ? 100 : deadline.remaining_ms(1000));
  }
  return ranks;
}

}  // namespace chorus::launch
