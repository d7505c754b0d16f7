// SPDX-License-Identifier: Apache-2.0
// File: src/core/engine.h
// Who runs operations. A thread blocked in a call drives the comms it waits for itself
// (drive_until). Work on host streams, and on non-blocking comms, is driven by the process's
// progress thread ("chorus-prog"), started on first use. Idle threads spin briefly
// (CHORUS_SPIN_US), then sleep on the process doorbell or in poll(); they never busy-wait.
#pragma once

#include <poll.h>

#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm.h"
#include "core/op.h"

namespace chorus {

// One pause of a spin-wait loop.
inline void cpu_relax() { __builtin_ia32_pause(); }

// Spin, then sleep: what a driving thread does after a pass that moved nothing.
class Idler {
 public:
  void reset() { idle_since_ns_ = 0; }
  // `retry` runs one more pass after this thread has registered as a sleeper (so a wake-up
  // between the last pass and the sleep is not lost); it returns true if it made progress.
  // `collect` is called only before sleeping: it adds the sockets to watch and returns true if
  // something that only rings the doorbell (shared memory, another thread) matters too.
  // Callables, not std::function: the spin phase runs once per empty pass, and a
  // std::function of a lambda with more than two captures allocates each time it is built.
  template <typename Retry, typename Collect>
  void idle(const Retry& retry, const Collect& collect) {
    if (spin()) return;
    sleep(std::cref(retry), std::cref(collect));  // reference_wrappers: no allocation
  }

 private:
  // The spin phase: true while it lasts (CHORUS_SPIN_US), after a pause or a yield.
  bool spin();
  void sleep(const std::function<bool()>& retry,
             const std::function<bool(std::vector<pollfd>*)>& collect);

  int64_t idle_since_ns_ = 0;
  uint32_t spins_ = 0;
  std::vector<pollfd> fds_;
};

// Drives `comms` from the calling thread until done() holds. Operations bound their own
// waits (CHORUS_TIMEOUT_MS), so this returns once they complete or fail.
void drive_until(const std::function<bool()>& done, Comm* const* comms, size_t count);
inline void drive_until(const std::function<bool()>& done, std::initializer_list<Comm*> comms) {
  drive_until(done, comms.begin(), comms.size());
}
inline void drive_until(const std::function<bool()>& done, const std::vector<Comm*>& comms) {
  drive_until(done, comms.data(), comms.size());
}

class Engine {
 public:
  static Engine& get();
  // The progress thread drives comm until its queue is empty.
  void watch(const std::shared_ptr<Comm>& comm);
  // Runs a host function op once its dependencies are done.
  void submit(const std::shared_ptr<Op>& host_op);
  // Stops the progress thread (process exit).
  void stop();

 private:
  Engine() = default;
  void run();
  // One pass over the watched work; true if anything progressed.
  bool pass();
  // Sockets of the watched comms (for sleeping); true if the doorbell matters too.
  bool collect(std::vector<pollfd>* fds);
  bool has_work_locked() const { return !comms_.empty() || !host_ops_.empty(); }

  std::mutex mutex_;  // guards comms_, host_ops_, thread_, stopping_
  std::vector<std::shared_ptr<Comm>> comms_;
  std::vector<std::shared_ptr<Op>> host_ops_;
  std::condition_variable work_cv_;  // signalled when work arrives or on stop
  std::thread thread_;
  bool stopping_ = false;
};

}  // namespace chorus
