// SPDX-License-Identifier: Apache-2.0
#include "core/engine.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <span>

#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "common/process.h"
#include "core/stream.h"

namespace chorus {

namespace {
constexpr int kMaxSleepMs = 100;  // a sleeper re-checks deadlines and abort at least this often

}  // namespace

bool Idler::spin() {
  if (idle_since_ns_ == 0) {
    idle_since_ns_ = now_ns();
    spins_ = 0;
  }
  // A clock read costs as much as a few polls: the spin phase looks at it every 8th time.
  ++spins_;
  if (spins_ % 8 != 0 || now_ns() - idle_since_ns_ < params::kSpinUs.get() * 1000) {
    // More ranks than cores: the peer we wait for may need this very core, so give it up on
    // every poll; otherwise spin, yielding now and then.
    if (ProcessContext::get().oversubscribed() || spins_ % 32 == 0) {
      sched_yield();
    } else {
      for (int i = 0; i < 8; ++i) cpu_relax();
    }
    return true;
  }
  return false;
}

void Idler::sleep(const std::function<bool()>& retry,
                  const std::function<bool(std::vector<pollfd>*)>& collect) {
  fds_.clear();
  bool doorbell_too = collect(&fds_);
  // Sockets alone: poll long (the eventfd covers wake-ups from this process). Sockets and shared
  // memory: peers ring only the futex, so poll in short slices.
  int slice_ms = !fds_.empty() && doorbell_too ? 1 : kMaxSleepMs;
  ProcessContext& process = ProcessContext::get();
  DoorbellWord* bell = process.doorbell();
  uint32_t seen = bell->seq.load(std::memory_order_seq_cst);
  if (fds_.empty()) {
    // Either the ringer sees us counted, or retry() sees what it published.
    CountedAsSleeper counted(/*poller=*/false);
    if (!retry()) futex_wait(&bell->seq, seen, slice_ms);
  } else {
    CountedAsSleeper counted(/*poller=*/true);  // as above, for ring_local()
    if (!retry()) {
      fds_.push_back(pollfd{process.wake_fd(), POLLIN, 0});
      int n = poll(fds_.data(), fds_.size(), slice_ms);
      if (n > 0 && (fds_.back().revents & POLLIN)) process.drain_wake_fd();
    }
  }
}

void drive_until(const std::function<bool()>& done, Comm* const* comm_list, size_t count) {
  Idler idler;
  std::span<Comm* const> comms(comm_list, count);
  auto pass = [&]() {
    bool progressed = false;
    for (Comm* c : comms) {
      std::unique_lock<std::mutex> lock(c->drive_mutex(), std::try_to_lock);
      if (lock.owns_lock()) progressed |= c->advance();
    }
    return progressed;
  };
  auto collect = [&](std::vector<pollfd>* fds) {
    bool doorbell = false;
    for (Comm* c : comms) {
      std::unique_lock<std::mutex> lock(c->drive_mutex(), std::try_to_lock);
      // Driven by another thread: it rings us when it finishes operations.
      doorbell |= !lock.owns_lock() || c->collect_poll_fds(fds);
    }
    return doorbell;
  };
  while (!done()) {
    if (pass()) {
      idler.reset();
      continue;
    }
    if (done()) break;
    idler.idle([&] { return pass() || done(); }, collect);
  }
}

Engine& Engine::get() {
  // One per process; deliberately never destroyed (the thread is stopped at exit).
  static std::atomic<Engine*> engine{nullptr};
  static std::mutex create_mutex;
  static int owner_pid = 0;
  Engine* e = engine.load(std::memory_order_acquire);
  if (e != nullptr && owner_pid == ProcessContext::get().pid()) return *e;
  std::lock_guard<std::mutex> lock(create_mutex);
  e = engine.load(std::memory_order_acquire);
  if (e == nullptr || owner_pid != ProcessContext::get().pid()) {
    // First use, or a child after fork(): the parent's thread is not ours.
    e = new Engine();
    owner_pid = ProcessContext::get().pid();
    engine.store(e, std::memory_order_release);
    static bool registered = false;
    if (!registered) {
      registered = true;
      std::atexit([] {
        Engine* current = engine.load(std::memory_order_acquire);
        if (current != nullptr && owner_pid == getpid()) current->stop();
      });
    }
  }
  return *e;
}

void Engine::watch(const std::shared_ptr<Comm>& comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(comms_.begin(), comms_.end(), comm) == comms_.end()) comms_.push_back(comm);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
  work_cv_.notify_one();
  ProcessContext::get().ring_local();
}

void Engine::submit(const std::shared_ptr<Op>& host_op) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_ops_.push_back(host_op);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
  work_cv_.notify_one();
  ProcessContext::get().ring_local();
}

void Engine::stop() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  work_cv_.notify_all();
  ProcessContext::get().ring_local();
  if (thread.joinable()) thread.join();
}

bool Engine::pass() {
  std::vector<std::shared_ptr<Comm>> comms;
  std::vector<std::shared_ptr<Op>> host_ops;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms = comms_;
    host_ops = host_ops_;
  }
  bool progressed = false;
  std::vector<Comm*> finished;
  for (const auto& c : comms) {
    std::unique_lock<std::mutex> lock(c->drive_mutex(), std::try_to_lock);
    if (!lock.owns_lock()) continue;
    progressed |= c->advance();
    if (!c->has_pending_ops()) finished.push_back(c.get());
  }
  std::vector<Op*> ran;
  for (const auto& op : host_ops) {
    if (!op->deps_done()) continue;
    if (op->is_gate()) {
      // A stream waiting for an event: what failed before the event fails the stream here too.
      Status status = op->deps_status();
      op->deps().clear();
      for (Stream* s : op->streams()) s->note_result(status);
      op->complete(std::move(status));
    } else {
      op->deps().clear();
      op->run_host_fn();
      op->complete(Status());
    }
    ran.push_back(op.get());
    progressed = true;
  }
  if (!finished.empty() || !ran.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.erase(std::remove_if(comms_.begin(), comms_.end(),
                                [&](const std::shared_ptr<Comm>& c) {
                                  return std::count(finished.begin(), finished.end(), c.get()) &&
                                         !c->has_pending_ops();
                                }),
                 comms_.end());
    host_ops_.erase(std::remove_if(host_ops_.begin(), host_ops_.end(),
                                   [&](const std::shared_ptr<Op>& o) {
                                     return std::count(ran.begin(), ran.end(), o.get()) > 0;
                                   }),
                    host_ops_.end());
    ProcessContext::get().ring_local();
  }
  return progressed;
}

bool Engine::collect(std::vector<pollfd>* fds) {
  std::vector<std::shared_ptr<Comm>> comms;
  bool doorbell = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms = comms_;
    doorbell = !host_ops_.empty();
  }
  for (const auto& c : comms) {
    std::unique_lock<std::mutex> lock(c->drive_mutex(), std::try_to_lock);
    doorbell |= !lock.owns_lock() || c->collect_poll_fds(fds);
  }
  return doorbell;
}

void Engine::run() {
  pthread_setname_np(pthread_self(), "chorus-prog");
  Idler idler;
  for (;;) {
    {
      // Nothing to drive: block until watch()/submit() hand over work (no periodic wake-ups).
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || has_work_locked(); });
      if (stopping_) return;
    }
    if (pass()) {
      idler.reset();
      continue;
    }
    idler.idle([&] { return pass(); }, [&](std::vector<pollfd>* fds) { return collect(fds); });
  }
}

}  // namespace chorus
