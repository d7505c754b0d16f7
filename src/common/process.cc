// SPDX-License-Identifier: Apache-2.0
#include "common/process.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <pthread.h>

#include "common/bytes.h"
#include "common/log.h"
#include "common/params.h"

namespace chorus {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000};
  // Not FUTEX_PRIVATE: the word may live in memory shared with other processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

namespace {
// What CountedAsSleeper registered the calling thread as in its own process's doorbell.
thread_local uint32_t t_self_sleeper = 0;
thread_local uint32_t t_self_poller = 0;

// ring_doorbell, not counting `self` sleepers (the calling thread, awake).
void ring_doorbell_except(DoorbellWord* word, uint32_t self) {
  // Dekker with the sleeper (Idler::idle): it increments `sleepers`, then looks for work; we
  // published the work, then look for sleepers. The fence orders our publication before this
  // load, so either it sees the work or we see it. Nobody asleep: no write to the shared line.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (word->sleepers.load(std::memory_order_relaxed) <= self) return;
  word->seq.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&word->seq);
}
}  // namespace

void ring_doorbell(DoorbellWord* word) { ring_doorbell_except(word, 0); }

CountedAsSleeper::CountedAsSleeper(bool poller)
    : poller_(poller), outer_(poller ? t_self_poller : t_self_sleeper) {
  DoorbellWord* bell = ProcessContext::get().doorbell();
  (poller_ ? bell->pollers : bell->sleepers).fetch_add(1, std::memory_order_seq_cst);
  ++(poller_ ? t_self_poller : t_self_sleeper);
  // Pairs with the fence in ring_doorbell: either the ringer sees us registered, or what we
  // look at next sees what it published.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

CountedAsSleeper::~CountedAsSleeper() {
  DoorbellWord* bell = ProcessContext::get().doorbell();
  (poller_ ? t_self_poller : t_self_sleeper) = outer_;
  (poller_ ? bell->pollers : bell->sleepers).fetch_sub(1, std::memory_order_seq_cst);
}

bool random_bytes(void* out, size_t bytes) {
  auto* p = static_cast<unsigned char*>(out);
  while (bytes > 0) {
    ssize_t n = getrandom(p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

uint64_t random_u64() {
  uint64_t v = 0;
  if (!random_bytes(&v, sizeof(v))) v = static_cast<uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull ^ __builtin_ia32_rdtsc();
  return v;
}

namespace {

// Processes that share a boot and a network namespace are on one host; network namespaces
// stand for hosts in the multi-host tests.
uint64_t compute_host_hash(const std::string& hostname) {
  const std::string& forced = params::kHostId.get();
  if (!forced.empty()) return fnv1a(forced);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st {};
  uint64_t netns = 0;
  if (stat("/proc/self/ns/net", &st) == 0) netns = st.st_ino;
  return fnv1a(boot_id + ":" + std::to_string(netns) + ":" + (boot_id.empty() ? hostname : ""));
}

std::mutex g_context_mutex;
std::atomic<ProcessContext*> g_context{nullptr};

// In a child after fork() the parent's context (its doorbell, its threads) is not ours: forget
// it (deliberately leaked) so the child builds its own on first use.
void forget_context_in_child() { g_context.store(nullptr, std::memory_order_relaxed); }

}  // namespace

ProcessContext::ProcessContext() : pid_(getpid()), token_(random_u64()) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;
  host_hash_ = compute_host_hash(hostname_);
  int fd = static_cast<int>(syscall(SYS_memfd_create, "chorus-doorbell", MFD_CLOEXEC));
  if (fd >= 0) {
    doorbell_fd_.reset(fd);
    fchmod(fd, 0600);
    if (ftruncate(fd, 4096) == 0) {
      void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) doorbell_map_ = Mapping(p, 4096);
    }
  }
  if (doorbell_map_.get() == nullptr) {
    // Without a shareable segment same-host peers cannot wake us; they fall back to TCP.
    CHORUS_WARN(kInit, "cannot create the process doorbell segment: {}", std::strerror(errno));
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    doorbell_map_ = Mapping(p, 4096);
    doorbell_fd_.reset();
  }
  doorbell_ = new (doorbell_map_.get()) DoorbellWord{};
  wake_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  cpu_set_t set;
  CPU_ZERO(&set);
  cpus_ = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                       : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (cpus_ < 1) cpus_ = 1;
}

ProcessContext& ProcessContext::get() {
  if (ProcessContext* c = g_context.load(std::memory_order_acquire)) return *c;
  std::lock_guard<std::mutex> lock(g_context_mutex);
  if (ProcessContext* c = g_context.load(std::memory_order_acquire)) return *c;
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, forget_context_in_child); });
  auto* c = new ProcessContext();  // lives as long as the process
  g_context.store(c, std::memory_order_release);
  return *c;
}

void ProcessContext::ring_local() {
  ring_doorbell_except(doorbell_, t_self_sleeper);  // its fence also orders the load below
  if (doorbell_->pollers.load(std::memory_order_relaxed) > t_self_poller && wake_fd_.valid()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  }
}

void ProcessContext::drain_wake_fd() {
  uint64_t value;
  [[maybe_unused]] ssize_t n = read(wake_fd_.get(), &value, sizeof(value));
}

}  // namespace chorus
