// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/root_registry.cc
// The process-global list of root server threads: started by create_unique_id(), stopped and
// joined at exit, forgotten (not joined) in a forked child.
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/root_server.h"
#include "common/log.h"

namespace chorus::bootstrap {

namespace {

struct RootEntry {
  UniqueFd wake_fd;  // eventfd: written to stop the server
  std::unique_ptr<detail::RootServer> server;
  pthread_t thread{};
  std::atomic<bool> finished{false};
};

void* root_thread_main(void* arg) {
  auto* entry = static_cast<RootEntry*>(arg);
  entry->server->run();
  entry->finished.store(true, std::memory_order_release);
  return nullptr;
}

class Registry {
 public:
  // Leaked on purpose: it must outlive every static destructor that could still run roots.
  static Registry& get() {
    static Registry* registry = new Registry();
    return *registry;
  }

  Status start(UniqueFd listen_fd, const UniqueId& id, int64_t timeout_ms) {
    static std::once_flag hooks_once;
    std::call_once(hooks_once, [] {
      std::atexit([] { get().stop_all(); });
      pthread_atfork([] { get().mu_.lock(); }, [] { get().mu_.unlock(); },
                     [] { get().forget_in_child(); });
    });
    std::lock_guard<std::mutex> lock(mu_);
    if (exiting_) return invalid_usage("cannot start a bootstrap root: the process is exiting");
    reap_locked();
    auto entry = std::make_unique<RootEntry>();
    entry->wake_fd.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!entry->wake_fd.valid()) return system_error(errno, "eventfd() for a bootstrap root");
    entry->server = std::make_unique<detail::RootServer>(std::move(listen_fd), entry->wake_fd.get(),
                                                         id, timeout_ms);
    // The root thread must not take the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&entry->thread, nullptr, root_thread_main, entry.get());
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (err != 0) return system_error(err, "pthread_create() for a bootstrap root");
    entries_.push_back(std::move(entry));
    return ok_status();
  }

  int active() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& e : entries_) n += e->finished.load(std::memory_order_acquire) ? 0 : 1;
    return n;
  }

 private:
  void reap_locked() {
    std::erase_if(entries_, [](const std::unique_ptr<RootEntry>& e) {
      if (!e->finished.load(std::memory_order_acquire)) return false;
      pthread_join(e->thread, nullptr);
      return true;
    });
  }

  void stop_all() {
    std::vector<std::unique_ptr<RootEntry>> entries;
    {
      std::lock_guard<std::mutex> lock(mu_);
      exiting_ = true;
      entries.swap(entries_);
    }
    for (auto& e : entries) {
      uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(e->wake_fd.get(), &one, sizeof(one));
    }
    for (auto& e : entries) pthread_join(e->thread, nullptr);
  }

  // The parent's root threads do not exist in the child: leak their state (touching it could
  // race with what those threads were doing at fork time; their sockets are close-on-exec) but
  // close the wake descriptors, which the registry owns.
  void forget_in_child() {
    for (auto& e : entries_) {
      e->wake_fd.reset();
      (void)e.release();
    }
    entries_.clear();
    mu_.unlock();
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<RootEntry>> entries_;
  bool exiting_ = false;
};

}  // namespace

Status start_root_server(UniqueFd listen_fd, const UniqueId& id, int64_t timeout_ms) {
  return Registry::get().start(std::move(listen_fd), id, timeout_ms);
}

int active_root_servers() { return Registry::get().active(); }

}  // namespace chorus::bootstrap
