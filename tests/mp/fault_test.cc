// SPDX-License-Identifier: Apache-2.0
// File: tests/mp/fault_test.cc
// Failures between processes: a rank killed (SIGKILL) in the middle of AllReduce over shared
// memory, TCP, UCX and verbs (on one host or, under tests/rdma/two_hosts.sh, two), a frozen
// rank (SIGSTOP) until the timeout names it, ncclCommAbort from
// another thread while a collective is blocked, shrinking to the survivors and going on,
// ranks that call mismatched collectives, and a rank killed during MoE dispatch/combine. The
// ranks are forked children of the test; each one writes a one-line report ("key=value ...")
// to a pipe, which the test parses.
#include <catch2/catch.hpp>
#include <chorus/chorus.h>
#include <chorus/ep.h>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "transports/registry.h"

namespace {

int64_t mono_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Thread names and fd targets, to say what leaked when a count grew.
std::string describe_resources() {
  std::string out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char name[64] = {};
      if (FILE* f = fopen(fmt::format("/proc/self/task/{}/comm", e->d_name).c_str(), "r")) {
        if (fgets(name, sizeof(name), f) == nullptr) name[0] = 0;
        fclose(f);
      }
      name[strcspn(name, "\n")] = 0;
      out += fmt::format("thread:{} ", name);
    }
    closedir(d);
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      ssize_t n = readlink(fmt::format("/proc/self/fd/{}", e->d_name).c_str(), target, sizeof(target) - 1);
      if (n > 0) out += fmt::format("fd{}:{} ", e->d_name, target);
    }
    closedir(d);
  }
  return out;
}

int count_entries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
    closedir(d);
  }
  return n;
}

// ---- Ranks as forked children ---------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int report_fd = -1;  // the child's report (read end)
  int ready_fd = -1;   // one byte when the child is ready to be hit (read end)
  std::string report;
  int status = 0;
  bool reaped = false;
};

// The children of one scenario. Whatever happens to the test (a failed REQUIRE included), the
// destructor kills and reaps any child still there: a stuck rank fails its test at once instead
// of holding ctest's output pipe open until the ctest timeout.
struct Children {
  std::vector<Child> list;

  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    for (Child& c : list) {
      if (c.reaped || c.pid <= 0) continue;
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      if (c.report_fd >= 0) close(c.report_fd);
      if (c.ready_fd >= 0) close(c.ready_fd);
    }
  }
  Child& operator[](size_t i) { return list[i]; }
  auto begin() const { return list.begin(); }
  auto end() const { return list.end(); }
};

// What a child sees: its rank, the communicator's id, and where to say it is ready.
struct ChildEnv {
  int rank = 0;
  int ready_fd = -1;
  ncclUniqueId id{};
  void ready() const {
    char c = 1;
    [[maybe_unused]] ssize_t n = write(ready_fd, &c, 1);
  }
};

using Body = std::function<std::string(const ChildEnv&)>;

// Forks `nranks` children running body(rank) with `env` set; the report is what body returns.
// The caller owns the result; Children's destructor cleans up after a failed test.
//
// The children are forked first and the unique id (whose bootstrap root is a thread of this
// process) is created afterwards and handed to them over a pipe: a fork while that thread
// authenticates a rank is safe for Chorus itself (common/fork_safe_mutex.h), but not under
// GCC 12's ASan, whose allocator has no fork handlers (a child forked while the root thread
// allocates can hang).
void spawn(Children* children, int nranks, const std::vector<std::string>& env, const Body& body) {
  children->list.resize(nranks);
  std::vector<int> id_fds(nranks, -1);
  for (int r = 0; r < nranks; ++r) {
    int report[2], ready[2], id_pipe[2];
    REQUIRE(pipe2(report, O_CLOEXEC) == 0);
    REQUIRE(pipe2(ready, O_CLOEXEC) == 0);
    REQUIRE(pipe2(id_pipe, O_CLOEXEC) == 0);
    fflush(nullptr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(report[0]);
      close(ready[0]);
      close(id_pipe[1]);
      ChildEnv child{r, ready[1], {}};
      size_t got = 0;
      while (got < sizeof(child.id)) {
        pollfd p{id_pipe[0], POLLIN, 0};
        if (poll(&p, 1, 60000) != 1) _exit(3);
        ssize_t n = read(id_pipe[0], reinterpret_cast<char*>(&child.id) + got,
                         sizeof(child.id) - got);
        if (n <= 0) _exit(3);  // the test failed before handing out the id
        got += static_cast<size_t>(n);
      }
      close(id_pipe[0]);
      for (const std::string& kv : env) putenv(strdup(kv.c_str()));
      ncclResetDebugInit();  // parameters are read again, with this environment
      std::string out = body(child) + "\n";
      [[maybe_unused]] ssize_t n = write(report[1], out.data(), out.size());
      _exit(0);
    }
    close(report[1]);
    close(ready[1]);
    close(id_pipe[0]);
    id_fds[r] = id_pipe[1];
    children->list[r].pid = pid;
    children->list[r].report_fd = report[0];
    children->list[r].ready_fd = ready[0];
  }
  ncclUniqueId id;
  ncclResult_t created = ncclGetUniqueId(&id);
  for (int fd : id_fds) {
    if (created == ncclSuccess) {
      [[maybe_unused]] ssize_t n = write(fd, &id, sizeof(id));
    }
    close(fd);
  }
  REQUIRE(created == ncclSuccess);
}

bool wait_ready(const Child& c, int timeout_ms) {
  pollfd p{c.ready_fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return false;
  char b;
  return read(c.ready_fd, &b, 1) == 1;
}

// Reads every report (bounded by timeout_ms overall), then reaps the children (killing any
// that is still there, so a hang fails the test instead of hanging it).
// `which`: the ranks to collect (all when empty).
void collect(Children* children, int timeout_ms, const std::vector<int>& which = {}) {
  int64_t end = mono_ms() + timeout_ms;
  for (size_t i = 0; i < children->list.size(); ++i) {
    Child& c = children->list[i];
    if (c.reaped) continue;
    if (!which.empty() && std::find(which.begin(), which.end(), static_cast<int>(i)) == which.end())
      continue;
    char buf[4096];
    for (;;) {
      pollfd p{c.report_fd, POLLIN, 0};
      int left = static_cast<int>(std::max<int64_t>(0, end - mono_ms()));
      if (poll(&p, 1, left) != 1) break;
      ssize_t n = read(c.report_fd, buf, sizeof(buf));
      if (n <= 0) break;
      c.report.append(buf, static_cast<size_t>(n));
    }
    close(c.report_fd);
    close(c.ready_fd);
    c.report_fd = c.ready_fd = -1;
    // The pipe closes while the child exits: give it a moment to become reapable.
    int64_t reap_end = std::max(end, mono_ms() + 5000);
    while (waitpid(c.pid, &c.status, WNOHANG) == 0 && mono_ms() < reap_end)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (kill(c.pid, 0) == 0 && waitpid(c.pid, &c.status, WNOHANG) == 0) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      c.report += " (killed by the test: it did not finish in time)";
    }
    c.reaped = true;
  }
}

// "key=value key=value msg=rest of line" -> map (msg takes the rest of the line).
std::map<std::string, std::string> parse(const std::string& report) {
  std::map<std::string, std::string> out;
  std::string line = report.substr(0, report.find('\n'));
  size_t msg = line.find(" msg=");
  if (msg != std::string::npos) {
    out["msg"] = line.substr(msg + 5);
    line.resize(msg);
  }
  std::istringstream in(line);
  std::string token;
  while (in >> token) {
    size_t eq = token.find('=');
    if (eq != std::string::npos) out[token.substr(0, eq)] = token.substr(eq + 1);
  }
  return out;
}

std::string last_error() {
  std::string e = ncclGetLastError(nullptr);
  for (char& c : e)
    if (c == '\n') c = ' ';
  return e;
}

// ---- Shared scenario pieces ------------------------------------------------------------------

constexpr size_t kCount = 1 << 20;  // 4 MiB of floats: a collective takes a few milliseconds

// Fills `buf` with rank+1 and checks that an AllReduce over `members` (their values) summed.
bool check_sum(const std::vector<float>& buf, float expected) {
  for (float v : buf)
    if (v != expected) return false;
  return true;
}

// Runs AllReduce bursts (4 on a host stream, then synchronize) until one fails; tells the test
// it is ready after a few. Returns the failing result and when it was seen.
struct Outcome {
  ncclResult_t result = ncclSuccess;
  int64_t at_ms = 0;
  int iterations = 0;
  std::string error;
};

// `blocking`: the calls block (no stream); small ones then take the express path on one host
// (src/core/express.cc), which bounds its own waits.
Outcome allreduce_until_failure(ncclComm_t comm, const ChildEnv& env, int max_iters,
                                size_t count = kCount, bool blocking = false) {
  Outcome o;
  cudaStream_t stream = nullptr;
  if (!blocking && chorusStreamCreate(&stream) != ncclSuccess)
    return Outcome{ncclInternalError, 0, 0, "stream"};
  std::vector<float> buf(count, 1.0f);
  for (o.iterations = 0; o.iterations < max_iters; o.iterations += 4) {
    if (o.iterations == 8) env.ready();
    ncclResult_t r = ncclSuccess;
    for (int k = 0; k < 4 && r == ncclSuccess; ++k)
      r = ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclMax, comm, stream);
    if (r == ncclSuccess && !blocking) r = chorusStreamSynchronize(stream);
    if (r != ncclSuccess) {
      o.result = r;
      o.at_ms = mono_ms();
      o.error = last_error();
      break;
    }
  }
  if (!blocking) chorusStreamDestroy(stream);
  return o;
}

// Small blocking sends and receives until one fails, the express path of point-to-point calls
// (src/core/express_p2p.cc): a ring exchange as one group (send to the next rank, receive from
// the previous one), then a ping-pong of lone calls between pairs of ranks (0-1, 2-3, ...; an
// odd number of ranks leaves the last one out of it). Each message is checked.
Outcome sendrecv_until_failure(ncclComm_t comm, const ChildEnv& env, int nranks, int max_iters) {
  Outcome o;
  const int r = env.rank, next = (r + 1) % nranks, prev = (r + nranks - 1) % nranks;
  const int pair = r ^ 1;
  std::vector<float> out(16), in(16);
  // False (and the outcome set) when a step failed or brought the wrong value.
  auto step_ok = [&](ncclResult_t result, float got, float want, const char* step) {
    if (result == ncclSuccess && got == want) return true;
    o.result = result != ncclSuccess ? result : ncclInternalError;
    o.at_ms = mono_ms();
    o.error = result != ncclSuccess ? last_error() : std::string("wrong data in the ") + step;
    return false;
  };
  for (o.iterations = 0; o.iterations < max_iters; ++o.iterations) {
    if (o.iterations == 8) env.ready();
    const float base = static_cast<float>(o.iterations) * 0.5f;
    std::fill(out.begin(), out.end(), base + static_cast<float>(r) + 0.25f);
    ncclResult_t res = ncclGroupStart();
    if (res == ncclSuccess) res = ncclSend(out.data(), out.size(), ncclFloat, next, comm, nullptr);
    if (res == ncclSuccess) res = ncclRecv(in.data(), in.size(), ncclFloat, prev, comm, nullptr);
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess) res = end;
    if (!step_ok(res, in.front(), base + static_cast<float>(prev) + 0.25f, "ring exchange")) break;
    if (pair >= nranks) continue;
    if (r % 2 == 0) {
      res = ncclSend(out.data(), out.size(), ncclFloat, pair, comm, nullptr);
      if (res == ncclSuccess) res = ncclRecv(in.data(), in.size(), ncclFloat, pair, comm, nullptr);
    } else {
      res = ncclRecv(in.data(), in.size(), ncclFloat, pair, comm, nullptr);
      if (res == ncclSuccess) res = ncclSend(out.data(), out.size(), ncclFloat, pair, comm, nullptr);
    }
    if (!step_ok(res, in.back(), base + static_cast<float>(pair) + 0.25f, "ping-pong")) break;
  }
  return o;
}

// After a failure: shrink away `dead` and run checked AllReduces on the survivors.
std::string shrink_and_go_on(ncclComm_t comm, int rank, int nranks, int dead,
                             size_t elems = kCount) {
  ncclComm_t small = nullptr;
  int excluded[1] = {dead};
  ncclResult_t r = ncclCommShrink(comm, excluded, 1, &small, nullptr, NCCL_SHRINK_ABORT);
  if (r != ncclSuccess) return fmt::format("shrink=failed({}) shrinkmsg={}", static_cast<int>(r),
                                           last_error());
  int count = 0, me = -1;
  ncclCommCount(small, &count);
  ncclCommUserRank(small, &me);
  float expected = 0;
  for (int p = 0; p < nranks; ++p) expected += p == dead ? 0.0f : static_cast<float>(p + 1);
  bool good = count == nranks - 1 && me == (rank < dead ? rank : rank - 1);
  for (int it = 0; it < 20 && good; ++it) {
    std::vector<float> buf(elems / 4 + it, static_cast<float>(rank + 1));
    r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, small, nullptr);
    good = r == ncclSuccess && check_sum(buf, expected);
  }
  ncclCommDestroy(small);
  return fmt::format("shrink=ok newsize={} newrank={} check={}", count, me, good ? "ok" : "bad");
}

ncclComm_t init(const ncclUniqueId& id, int nranks, int rank) {
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) return nullptr;
  return comm;
}

// ---- Scenarios -------------------------------------------------------------------------------

// Under tests/rdma/two_hosts.sh (CHORUS_RDMA_NETNS="nsA,nsB", CHORUS_RDMA_DEVICES="devA,devB";
// the test itself runs in nsA): rank r moves to host r % 2's network namespace and uses that
// host's RDMA device. Each rank also gets a host identity of its own (CHORUS_HOST_ID), so that
// core's same-host liveness watch (pidfd) sees no peer at all, not even the one sharing its
// namespace: only the transport can tell that a peer died. An error string, empty on success.
std::string place_on_rdma_host(int rank) {
  const char* netns = std::getenv("CHORUS_RDMA_NETNS");
  const char* devices = std::getenv("CHORUS_RDMA_DEVICES");
  if (netns == nullptr || devices == nullptr) return "";
  auto pick = [&](const std::string& list) {
    std::vector<std::string> items;
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) items.push_back(item);
    return items.empty() ? std::string() : items[static_cast<size_t>(rank) % items.size()];
  };
  const std::string ns = pick(netns), dev = pick(devices);
  int fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    return fmt::format("cannot enter network namespace {}: {}", ns, std::strerror(errno));
  }
  close(fd);
  setenv("CHORUS_IB_HCA", ("=" + dev).c_str(), 1);
  setenv("CHORUS_HOST_ID", fmt::format("{}-rank-{}", ns, rank).c_str(), 1);
  ncclResetDebugInit();  // parameters are read again
  return "";
}

// `nranks` ranks AllReduce `count` floats in a loop (or, `p2p`, send and receive small
// messages: sendrecv_until_failure); `victim` is killed in the middle; the others must fail
// fast with ncclRemoteError, then shrink and go on.
void kill_during_allreduce(const char* transport, std::vector<std::string> env_extra = {},
                           int nranks = 4, size_t count = kCount, bool blocking = false,
                           bool p2p = false) {
  const int victim = 2 % nranks;
  Children children;
  env_extra.push_back(fmt::format("CHORUS_TRANSPORT={}", transport));
  env_extra.push_back("CHORUS_TIMEOUT_MS=60000");
  spawn(&children, nranks, env_extra,
      [&](const ChildEnv& env) -> std::string {
        if (std::string e = place_on_rdma_host(env.rank); !e.empty()) return "init=failed msg=" + e;
        ncclComm_t comm = init(env.id, nranks, env.rank);
        if (comm == nullptr) return "init=failed msg=" + last_error();
        Outcome o = p2p ? sendrecv_until_failure(comm, env, nranks, 1 << 30)
                        : allreduce_until_failure(comm, env, 1 << 30, count, blocking);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm, &async);
        std::string report = fmt::format("result={} async={} at_ms={} iters={}",
                                         static_cast<int>(o.result), static_cast<int>(async),
                                         o.at_ms, o.iterations);
        report += " " + shrink_and_go_on(comm, env.rank, nranks, victim, count);
        ncclCommDestroy(comm);
        return report + " msg=" + o.error;
      });
  REQUIRE(wait_ready(children[victim], 60000));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  int64_t killed_ms = mono_ms();
  kill(children[victim].pid, SIGKILL);
  collect(&children, 120000);
  int64_t worst = 0;
  for (int r = 0; r < nranks; ++r) {
    if (r == victim) continue;
    INFO("rank " << r << ": " << children[r].report);
    auto kv = parse(children[r].report);
    REQUIRE(kv.count("result"));
    CHECK(kv["result"] == std::to_string(ncclRemoteError));
    CHECK(kv["async"] == std::to_string(ncclRemoteError));
    CHECK(kv["shrink"] == "ok");
    CHECK(kv["newsize"] == std::to_string(nranks - 1));
    CHECK(kv["check"] == "ok");
    CHECK(kv["msg"].find("rank ") != std::string::npos);
    int64_t delay = std::stoll(kv["at_ms"]) - killed_ms;
    worst = std::max(worst, delay);
    CHECK(delay < 5000);  // noticed well before CHORUS_TIMEOUT_MS (60 s)
    CHECK(WIFEXITED(children[r].status));
  }
  // The neighbours of the dead rank name it.
  bool named = false;
  for (int r = 0; r < nranks; ++r)
    if (r != victim)
      named |= parse(children[r].report)["msg"].find(fmt::format("pid {}", children[victim].pid)) !=
               std::string::npos;
  CHECK(named);
  // On two hosts nothing but the transport can tell (see place_on_rdma_host): over verbs, the
  // side channel. Its words reach every survivor, first hand or in a neighbour's farewell.
  if (std::getenv("CHORUS_RDMA_NETNS") != nullptr && std::string(transport) == "VERBS") {
    bool side_channel = false;
    for (int r = 0; r < nranks; ++r)
      if (r != victim)
        side_channel |= parse(children[r].report)["msg"].find("is gone: its side channel") !=
                        std::string::npos;
    CHECK(side_channel);
  }
  fmt::print("fault: SIGKILL of rank {} of {} during {} over {}{}: every survivor failed "
             "within {} ms, then shrank to {} ranks and went on\n",
             victim, nranks, p2p ? "sends and receives" : "AllReduce", transport,
             std::getenv("CHORUS_RDMA_NETNS") != nullptr ? " on two hosts" : "", worst,
             nranks - 1);
}

}  // namespace

TEST_CASE("SIGKILL during AllReduce over shared memory: survivors fail fast, shrink, go on",
          "[mp][fault][shm]") {
  kill_during_allreduce("SHM");
}

TEST_CASE("SIGKILL during small blocking AllReduces over shared memory (the express path): "
          "survivors fail fast, shrink, go on", "[mp][fault][shm]") {
  kill_during_allreduce("SHM", {}, 4, 16, /*blocking=*/true);
}

TEST_CASE("SIGKILL during small blocking sends and receives over shared memory (the express "
          "path): survivors fail fast, shrink, go on", "[mp][fault][shm]") {
  kill_during_allreduce("SHM", {}, 4, 16, /*blocking=*/true, /*p2p=*/true);
}

TEST_CASE("SIGKILL during small blocking sends and receives over TCP: survivors fail fast, "
          "shrink, go on", "[mp][fault][tcp]") {
  kill_during_allreduce("TCP", {}, 4, 16, /*blocking=*/true, /*p2p=*/true);
}

TEST_CASE("SIGKILL during AllReduce over TCP: survivors fail fast, shrink, go on",
          "[mp][fault][tcp]") {
  kill_during_allreduce("TCP");
}

// UCX detects the dead peer itself (UCP_ERR_HANDLING_MODE_PEER over its tcp transport); the
// shrunk communicator is connected over UCX again.
TEST_CASE("SIGKILL during AllReduce over UCX: survivors fail fast, shrink, go on",
          "[mp][fault][ucx]") {
  if (chorus::find_transport("ucx") == nullptr) {
    WARN("this build has no UCX transport");
    return;
  }
  kill_during_allreduce("UCX", {"UCX_TLS=tcp,self", "UCX_NET_DEVICES=lo"});
}

// Over UCX's shared-memory transports UCX 1.13 cannot detect a dead peer: the communicator's
// liveness watch (same host) must.
TEST_CASE("SIGKILL during AllReduce over UCX shared memory: survivors fail fast, shrink, go on",
          "[mp][fault][ucx]") {
  if (chorus::find_transport("ucx") == nullptr) {
    WARN("this build has no UCX transport");
    return;
  }
  kill_during_allreduce("UCX", {"UCX_TLS=sm,self"});
}

// Verbs: RDMA says nothing when a peer dies; its side channel (transports/verbs/verbs_side.h)
// does, on any host. Needs a device: ctest runs it under label rdma, on one host and (through
// tests/rdma/two_hosts.sh) on two, where only the side channel can tell. 4 ranks, 256 KiB
// AllReduces: the emulated guest is slow.
TEST_CASE("SIGKILL during AllReduce over verbs: survivors fail fast, shrink, go on",
          "[rdma][verbs][fault]") {
  kill_during_allreduce("VERBS", {"CHORUS_IB_SLOTS=8", "CHORUS_IB_SLOT_BYTES=16384"}, 4,
                        size_t{1} << 16);
}

TEST_CASE("a frozen peer (SIGSTOP) fails the others at the timeout, naming it", "[mp][fault]") {
  // Large AllReduces on a stream (operations), small blocking ones (the express path), and small
  // blocking sends and receives (their express path).
  enum class Traffic { kQueued, kExpress, kExpressP2p };
  auto freeze = [](Traffic traffic) {
    const bool express = traffic == Traffic::kExpress, p2p = traffic == Traffic::kExpressP2p;
    INFO((p2p ? "small blocking sends and receives"
              : express ? "small blocking AllReduces" : "large AllReduces on a stream"));
    const char* failed_entry = p2p ? "FAILED group of " : "FAILED AllReduce #";
    const char* what = p2p ? "group of " : "AllReduce #";
    const int nranks = 3, victim = 1;
    const int timeout_ms = 1500;
    Children children;
    spawn(&children, nranks, {"CHORUS_TRANSPORT=SHM", fmt::format("CHORUS_TIMEOUT_MS={}", timeout_ms)},
                          [&](const ChildEnv& env) -> std::string {
                            ncclComm_t comm = init(env.id, nranks, env.rank);
                            if (comm == nullptr) return "init=failed msg=" + last_error();
                            Outcome o = p2p ? sendrecv_until_failure(comm, env, nranks, 1 << 30)
                                        : express ? allreduce_until_failure(comm, env, 1 << 30, 16, true)
                                                  : allreduce_until_failure(comm, env, 1 << 30);
                            // Room for all 64 entries (CHORUS_FLIGHT_RECORDER_OPS) of
                            // send/receive groups, which name every call.
                            std::vector<char> recorder(1 << 16);
                            chorusCommDumpFlightRecorder(comm, recorder.data(), recorder.size(),
                                                         nullptr);
                            bool recorded = std::strstr(recorder.data(), failed_entry) != nullptr;
                            ncclCommAbort(comm);
                            return fmt::format("result={} at_ms={} recorder={} msg={}",
                                               static_cast<int>(o.result), o.at_ms,
                                               recorded ? "ok" : "missing", o.error);
                          });
    REQUIRE(wait_ready(children[victim], 60000));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    int64_t stopped_ms = mono_ms();
    kill(children[victim].pid, SIGSTOP);
    // Survivors report; then the frozen rank is killed (collect would kill it anyway).
    std::vector<int> others;
    for (int r = 0; r < nranks; ++r)
      if (r != victim) others.push_back(r);
    collect(&children, 60000, others);
    kill(children[victim].pid, SIGKILL);
    collect(&children, 10000, {victim});
    bool named = false;
    for (int r : others) {
      const Child& c = children[r];
      INFO(c.report);
      auto kv = parse(c.report);
      REQUIRE(kv.count("result"));
      CHECK(kv["result"] == std::to_string(ncclRemoteError));
      CHECK(kv["recorder"] == "ok");
      int64_t delay = std::stoll(kv["at_ms"]) - stopped_ms;
      CHECK(delay >= timeout_ms - 100);  // not before the timeout: the peer is alive, only frozen
      CHECK(delay < timeout_ms + 5000);
      const std::string& msg = kv["msg"];
      if (msg.find("no progress") != std::string::npos) {
        // "AllReduce #12 (...) on comm ... : rank 2: no progress for 1.5 s (...); waiting for
        //  rank 1 (host h, pid P) to send its data (X of Y bytes done)"
        CHECK(msg.find(what) != std::string::npos);
        CHECK(msg.find("bytes done") != std::string::npos);
        named |= msg.find(fmt::format("rank {} (host ", victim)) != std::string::npos &&
                 msg.find(fmt::format("pid {}", children[victim].pid)) != std::string::npos;
      }
    }
    CHECK(named);
  };
  freeze(Traffic::kQueued);
  freeze(Traffic::kExpress);
  freeze(Traffic::kExpressP2p);
}

TEST_CASE("ncclCommAbort from another thread ends a blocked collective and frees everything",
          "[mp][fault]") {
  const int nranks = 2;
  Children children;
  spawn(&children, nranks, {"CHORUS_TRANSPORT=SHM"}, [&](const ChildEnv& env) -> std::string {
    // Process-wide resources (progress thread, doorbell) come with the first comm; count ours
    // after a warm-up comm of one rank.
    ncclComm_t warm = nullptr;
    ncclCommInitAll(&warm, 1, nullptr);
    ncclCommDestroy(warm);
    // The warm-up's bootstrap root thread exits on its own once it has served.
    for (int i = 0; i < 400 && count_entries("/proc/self/task") > 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    int fds_before = count_entries("/proc/self/fd");
    int threads_before = count_entries("/proc/self/task");
    ncclComm_t comm = init(env.id, nranks, env.rank);
    if (comm == nullptr) return "init=failed msg=" + last_error();
    if (env.rank == 1) {  // never joins the collective; waits until its peer is done
      env.ready();
      std::this_thread::sleep_for(std::chrono::seconds(3));
      ncclCommAbort(comm);
      return "idle=ok";
    }
    std::vector<float> buf(1024, 1.0f);
    std::atomic<int64_t> returned_ms{0};
    ncclResult_t blocked_result = ncclSuccess;
    std::thread blocked([&] {
      blocked_result = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm,
                                     nullptr);
      returned_ms = mono_ms();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    int64_t start = mono_ms();
    ncclResult_t abort_result = ncclCommAbort(comm);
    int64_t abort_ms = mono_ms() - start;
    blocked.join();
    int fds_after = count_entries("/proc/self/fd");
    int threads_after = count_entries("/proc/self/task");
    return fmt::format("abort={} abort_ms={} blocked={} blocked_ms={} fds={}/{} threads={}/{} "
                       "msg={}", static_cast<int>(abort_result), abort_ms,
                       static_cast<int>(blocked_result), returned_ms.load() - start, fds_before,
                       fds_after, threads_before, threads_after,
                       fds_before == fds_after && threads_before == threads_after
                           ? std::string()
                           : "now: " + describe_resources());
  });
  collect(&children, 60000);
  INFO(children[0].report);
  auto kv = parse(children[0].report);
  REQUIRE(kv.count("abort"));
  CHECK(kv["abort"] == std::to_string(ncclSuccess));
  CHECK(kv["blocked"] != std::to_string(ncclSuccess));
  CHECK(std::stoll(kv["abort_ms"]) < 1000);
  CHECK(std::stoll(kv["blocked_ms"]) < 1000);
  auto same = [](const std::string& pair) {
    return pair.substr(0, pair.find('/')) == pair.substr(pair.find('/') + 1);
  };
  CHECK(same(kv["fds"]));
  CHECK(same(kv["threads"]));
  CHECK(parse(children[1].report)["idle"] == "ok");
  fmt::print("fault: ncclCommAbort returned in {} ms; the blocked AllReduce returned after {} ms\n",
             kv["abort_ms"], kv["blocked_ms"]);
}

TEST_CASE("mismatched collectives fail with ncclInvalidUsage naming both calls", "[mp][fault]") {
  // Two mistakes: different collectives, and one collective with different counts (large
  // enough that both ranks take the same algorithm: smaller ones may wait for the timeout).
  for (bool counts : {false, true}) {
    for (const char* transport : {"SHM", "TCP"}) {
      const int nranks = 2;
      Children children;
      // Each rank logs to its own file: the failure must be logged once, where it is detected
      // (or where the peer's farewell brings it), not again by the comm and the API; at the
      // default level that is all (the flight recorder is INFO).
      std::string log_pattern = fmt::format("/tmp/chorus_fault_log_{}_%p.log", getpid());
      spawn(&children, nranks,
            {fmt::format("CHORUS_TRANSPORT={}", transport), "CHORUS_DEBUG=WARN",
             "CHORUS_DEBUG_FILE=" + log_pattern},
            [&](const ChildEnv& env) -> std::string {
              ncclComm_t comm = init(env.id, nranks, env.rank);
              if (comm == nullptr) return "init=failed msg=" + last_error();
              std::vector<float> buf(1 << 18, 1.0f);
              ncclResult_t r;
              if (counts) {
                size_t count = env.rank == 0 ? 65536 : 131072;
                r = ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr);
              } else if (env.rank == 0) {
                r = ncclAllReduce(buf.data(), buf.data(), 1024, ncclFloat, ncclSum, comm, nullptr);
              } else {
                r = ncclAllGather(buf.data(), buf.data(), 1024, ncclFloat, comm, nullptr);
              }
              std::string msg = last_error();
              ncclCommAbort(comm);
              std::string path = log_pattern;
              path.replace(path.find("%p"), 2, std::to_string(getpid()));
              int mentions = 0, lines = 0, recorder = 0;
              if (FILE* f = fopen(path.c_str(), "r")) {
                char line[8192];
                while (fgets(line, sizeof(line), f) != nullptr) {
                  ++lines;
                  if (strstr(line, " but rank ") && strstr(line, "expects")) ++mentions;
                  if (strstr(line, "flight recorder")) ++recorder;
                }
                fclose(f);
              }
              unlink(path.c_str());
              return fmt::format("result={} logged={} lines={} recorder={} msg={}",
                                 static_cast<int>(r), mentions, lines, recorder, msg);
            });
      collect(&children, 60000);
      for (const Child& c : children) {
        INFO(transport << (counts ? ", counts" : ", collectives") << ": " << c.report);
        auto kv = parse(c.report);
        REQUIRE(kv.count("result"));
        CHECK(kv["result"] == std::to_string(ncclInvalidUsage));
        if (counts) {
          // "rank 1 sent AllReduce #0 (count 131072, float, sum) in a message of N bytes but
          // rank 0 expects AllReduce #0 (count 65536, float, sum) in a message of M bytes"
          CHECK(kv["msg"].find("(count 65536, float, sum) in a message of") != std::string::npos);
          CHECK(kv["msg"].find("(count 131072, float, sum) in a message of") !=
                std::string::npos);
        } else {
          // "rank 1 sent AllGather #0 (count 1024, float) ... but rank 0 expects AllReduce #0"
          CHECK(kv["msg"].find("AllReduce #0") != std::string::npos);
          CHECK(kv["msg"].find("AllGather #0") != std::string::npos);
        }
        CHECK(kv["msg"].find("rank 0") != std::string::npos);
        CHECK(kv["msg"].find("rank 1") != std::string::npos);
        CHECK(kv["logged"] == "1");
        CHECK(std::stoi(kv["lines"]) <= 2);
        CHECK(kv["recorder"] == "0");
      }
    }
  }
}

TEST_CASE("different counts or datatypes at the same sequence number are caught",
          "[mp][fault]") {
  const int nranks = 3;
  Children children;
  spawn(&children, nranks, {"CHORUS_TRANSPORT=SHM", "CHORUS_TIMEOUT_MS=30000"},
                        [&](const ChildEnv& env) -> std::string {
                          ncclComm_t comm = init(env.id, nranks, env.rank);
                          if (comm == nullptr) return "init=failed msg=" + last_error();
                          std::vector<int32_t> buf(4096, 1);
                          // Call 0 agrees; call 1: rank 2 passes int32 where the others say
                          // float; each is otherwise a valid call.
                          ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), 100, ncclInt32,
                                                         ncclSum, comm, nullptr);
                          if (r == ncclSuccess) {
                            r = ncclAllReduce(buf.data(), buf.data(), 1000,
                                              env.rank == 2 ? ncclInt32 : ncclFloat, ncclSum, comm,
                                              nullptr);
                          }
                          std::string msg = last_error();
                          ncclCommAbort(comm);
                          return fmt::format("result={} msg={}", static_cast<int>(r), msg);
                        });
  int64_t start = mono_ms();
  collect(&children, 60000);
  CHECK(mono_ms() - start < 20000);  // errors, not the 30 s timeout
  int invalid = 0;
  for (const Child& c : children) {
    INFO(c.report);
    auto kv = parse(c.report);
    REQUIRE(kv.count("result"));
    CHECK(kv["result"] != std::to_string(ncclSuccess));
    if (kv["result"] == std::to_string(ncclInvalidUsage)) {
      ++invalid;
      CHECK(kv["msg"].find("int32") != std::string::npos);
      CHECK(kv["msg"].find("float") != std::string::npos);
      CHECK(kv["msg"].find("rank 2") != std::string::npos);
    }
  }
  CHECK(invalid >= 1);  // the ranks that receive from rank 2 see the mismatch itself
}

// A rank that has done its part and exited is no failure for ranks that never wait for it
// (seen in the TSan run of the multi-process matrix: the last rank of a send/receive ring
// finished and exited while its neighbours still exchanged, and they failed, "rank 3 has
// exited").
TEST_CASE("a peer that exits after its part does not fail the others", "[mp][fault]") {
  const int nranks = 3;
  Children children;
  spawn(&children, nranks, {"CHORUS_TRANSPORT=SHM", "CHORUS_LIVENESS_MS=10"},
        [&](const ChildEnv& env) -> std::string {
          ncclComm_t comm = init(env.id, nranks, env.rank);
          if (comm == nullptr) return "init=failed msg=" + last_error();
          if (env.rank == 2) {  // nothing to do: leaves at once
            ncclCommDestroy(comm);
            return "result=0 check=ok msg=";
          }
          // Rank 1 receives long after rank 2 is gone; rank 0's send waits for it meanwhile
          // (1 MiB: read by reference, so the send is done only when rank 1 has read it).
          std::vector<float> buf(1 << 18, env.rank == 0 ? 3.0f : 0.0f);
          ncclResult_t r;
          if (env.rank == 0) {
            r = ncclSend(buf.data(), buf.size(), ncclFloat, 1, comm, nullptr);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            r = ncclRecv(buf.data(), buf.size(), ncclFloat, 0, comm, nullptr);
          }
          std::string msg = last_error();
          ncclCommDestroy(comm);
          return fmt::format("result={} check={} msg={}", static_cast<int>(r),
                             check_sum(buf, 3.0f) || env.rank == 0 ? "ok" : "bad", msg);
        });
  collect(&children, 60000);
  for (const Child& c : children) {
    INFO(c.report);
    auto kv = parse(c.report);
    CHECK(kv["result"] == std::to_string(ncclSuccess));
    CHECK(kv["check"] == "ok");
  }
}

TEST_CASE("ncclCommAbort stops a non-blocking initialisation waiting for a missing rank",
          "[mp][fault]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  // Rank 1 never comes: the bootstrap would wait CHORUS_BOOTSTRAP_TIMEOUT_MS (120 s).
  REQUIRE(ncclCommInitRankConfig(&comm, 2, id, 0, &config) == ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ncclResult_t async = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclInProgress);
  int64_t start = mono_ms();
  CHECK(ncclCommAbort(comm) == ncclSuccess);
  int64_t took = mono_ms() - start;
  CHECK(took < 1000);
  fmt::print("fault: ncclCommAbort of an initialising communicator returned in {} ms\n", took);
}

namespace {

// The end of the EP fault tests: kills `victim` once it has looped a while, then checks that
// every survivor's EP call failed with ncclRemoteError and that one of them named the victim's pid.
void kill_and_expect_ep_failures(Children* children, int nranks, int victim) {
  Children& c = *children;
  REQUIRE(wait_ready(c[victim], 60000));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  kill(c[victim].pid, SIGKILL);
  collect(children, 120000);
  bool named = false;
  for (int r = 0; r < nranks; ++r) {
    if (r == victim) continue;
    INFO("rank " << r << ": " << c[r].report);
    auto kv = parse(c[r].report);
    REQUIRE(kv.count("result"));
    CHECK(kv["result"] == std::to_string(ncclRemoteError));
    CHECK(kv["msg"].find("chorusEp") != std::string::npos);
    named |= kv["msg"].find(fmt::format("pid {}", c[victim].pid)) != std::string::npos;
    CHECK(WIFEXITED(c[r].status));
  }
  CHECK(named);
}

}  // namespace

// MoE dispatch and combine (include/chorus/ep.h) in a loop on 3 ranks; one is killed in the
// middle. Whichever step the survivors are in (the count exchange, the agreement, the token
// transfers), the call fails with ncclRemoteError, and a survivor names the dead rank's pid.
// Blocking, and queued on a host stream (the failure then comes from the call or the stream).
TEST_CASE("SIGKILL during EP dispatch and combine over shared memory: survivors fail naming it",
          "[mp][fault][shm][ep]") {
  const bool queued = GENERATE(false, true);
  CAPTURE(queued);
  const int nranks = 3, victim = 1;
  const size_t tokens = 64, hidden = 512;
  const int topk = 2, experts = 2 * nranks;
  Children children;
  spawn(&children, nranks, {"CHORUS_TRANSPORT=SHM", "CHORUS_TIMEOUT_MS=60000"},
        [&](const ChildEnv& env) -> std::string {
          ncclComm_t comm = init(env.id, nranks, env.rank);
          if (comm == nullptr) return "init=failed msg=" + last_error();
          size_t bytes = 0;
          chorusEpBuffer_t buf = nullptr;
          if (chorusEpBufferSizeHint(nranks, tokens, hidden, topk, &bytes) != ncclSuccess ||
              chorusEpBufferCreate(comm, bytes, &buf) != ncclSuccess)
            return "init=failed msg=" + last_error();
          std::vector<float> x(tokens * hidden, 0.25f), w(tokens * topk, 0.5f);
          std::vector<int64_t> idx(tokens * topk);
          for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>((i * 7 + i / 2) % experts);
          for (size_t t = 0; t < tokens; ++t) idx[t * 2 + 1] = (idx[t * 2] + 1) % experts;  // distinct
          const size_t cap = tokens * nranks;
          std::vector<float> rx(cap * hidden), rw(cap * topk), out(tokens * hidden), ow(tokens * topk);
          std::vector<int64_t> ridx(cap * topk);
          chorusEpDispatchArgs_t a{};
          a.x = x.data(), a.datatype = ncclFloat32, a.numTokens = tokens, a.hidden = hidden;
          a.topkIdx = idx.data(), a.topkWeights = w.data(), a.topk = topk, a.numExperts = experts;
          a.expertAlignment = 1;
          chorusStream_t stream = nullptr;
          if (queued && chorusStreamCreate(&stream) != ncclSuccess)
            return "init=failed msg=" + last_error();
          ncclResult_t r = ncclSuccess;
          int iterations = 0;
          for (; r == ncclSuccess && iterations < 1000000; ++iterations) {
            if (iterations == 8) env.ready();
            chorusEpDispatchOutput_t o{};
            o.recvX = rx.data(), o.recvTopkIdx = ridx.data(), o.recvTopkWeights = rw.data();
            o.recvCapacity = cap;
            chorusEpHandle_t h = nullptr;
            r = chorusEpDispatchAsync(buf, &a, &o, &h, stream);
            if (r == ncclSuccess && queued) r = chorusStreamSynchronize(stream);
            if (r == ncclSuccess)
              r = chorusEpCombineAsync(buf, h, rx.data(), ncclFloat32, rw.data(), out.data(),
                                       ow.data(), stream);
            if (r == ncclSuccess && queued) r = chorusStreamSynchronize(stream);
            if (h != nullptr) chorusEpHandleDestroy(h);
          }
          const std::string msg = last_error();
          chorusEpBufferDestroy(buf);
          if (stream != nullptr) chorusStreamDestroy(stream);
          ncclCommAbort(comm);
          return fmt::format("result={} iters={} msg={}", static_cast<int>(r), iterations, msg);
        });
  kill_and_expect_ep_failures(&children, nranks, victim);
}

// The same for the low-latency mode with hooks: dispatch and combine return once posted, and the
// hook that waits fails, or the next call's agreement, naming the dead rank.
TEST_CASE("SIGKILL during EP low-latency calls with hooks over shared memory: survivors fail "
          "naming it",
          "[mp][fault][shm][ep]") {
  const int nranks = 3, victim = 1;
  const size_t tokens = 32, hidden = 256;
  const int topk = 2, experts = 2 * nranks;
  Children children;
  spawn(&children, nranks, {"CHORUS_TRANSPORT=SHM", "CHORUS_TIMEOUT_MS=60000"},
        [&](const ChildEnv& env) -> std::string {
          ncclComm_t comm = init(env.id, nranks, env.rank);
          if (comm == nullptr) return "init=failed msg=" + last_error();
          size_t bytes = 0;
          chorusEpBuffer_t buf = nullptr;
          if (chorusEpLowLatencySizeHint(nranks, tokens, hidden, experts, topk, &bytes) != ncclSuccess ||
              chorusEpBufferCreate(comm, bytes, &buf) != ncclSuccess)
            return "init=failed msg=" + last_error();
          std::vector<float> x(tokens * hidden, 0.25f), w(tokens * topk, 0.5f);
          std::vector<int64_t> idx(tokens * topk);
          for (size_t t = 0; t < tokens; ++t) {
            idx[t * 2] = static_cast<int64_t>(t % experts);
            idx[t * 2 + 1] = static_cast<int64_t>((t + 1) % experts);
          }
          const size_t rows = 2 * nranks * tokens;  // L * R
          std::vector<float> rx(rows * hidden), y(rows * hidden, 1.0f), out(tokens * hidden);
          std::vector<int> count(2);
          chorusEpLowLatencyDispatchArgs_t a{};
          a.x = x.data(), a.datatype = ncclFloat32, a.numTokens = tokens, a.hidden = hidden;
          a.topkIdx = idx.data(), a.topk = topk, a.numExperts = experts, a.maxTokensPerRank = tokens;
          chorusEpLowLatencyDispatchOutput_t o{};
          o.recvX = rx.data(), o.recvCount = count.data();
          ncclResult_t r = ncclSuccess;
          int iterations = 0;
          for (; r == ncclSuccess && iterations < 1000000; ++iterations) {
            if (iterations == 8) env.ready();
            chorusEpHandle_t h = nullptr;
            chorusEpHook_t hook = nullptr;
            r = chorusEpLowLatencyDispatch(buf, &a, &o, 1, &h, &hook);
            if (r == ncclSuccess) r = chorusEpHookWait(hook);
            if (r == ncclSuccess)
              r = chorusEpLowLatencyCombine(buf, h, y.data(), ncclFloat32, w.data(), out.data(), 1,
                                            &hook);
            if (r == ncclSuccess) r = chorusEpHookWait(hook);
            if (h != nullptr) chorusEpHandleDestroy(h);
          }
          const std::string msg = last_error();
          chorusEpBufferDestroy(buf);
          ncclCommAbort(comm);
          return fmt::format("result={} iters={} msg={}", static_cast<int>(r), iterations, msg);
        });
  kill_and_expect_ep_failures(&children, nranks, victim);
}
