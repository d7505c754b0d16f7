// SPDX-License-Identifier: Apache-2.0
// The process doorbell's wake-ups (src/common/process.h): ring_local() writes the eventfd only
// for pollers other than the ringing thread. A thread that registered as a poller and then, in
// its last look for work, finishes something and rings, is awake: waking itself would cost a
// write now and a spurious return from poll() and a read later.
#include <poll.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>

#include "common/process.h"

namespace chorus {
namespace {

bool wake_fd_readable() {
  pollfd p{ProcessContext::get().wake_fd(), POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// Another thread registered in this process's doorbell (as Idler::idle registers before it
// sleeps) for as long as this object lives.
class OtherThreadRegistered {
 public:
  explicit OtherThreadRegistered(bool poller)
      : thread_([this, poller] {
          CountedAsSleeper counted(poller);
          stage_.store(1);
          while (stage_.load() != 2) std::this_thread::yield();
        }) {
    while (stage_.load() != 1) std::this_thread::yield();
  }
  ~OtherThreadRegistered() {
    stage_.store(2);
    thread_.join();
  }

 private:
  std::atomic<int> stage_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("doorbell: ring_local wakes other pollers, not the ringing one", "[unit][doorbell]") {
  ProcessContext& process = ProcessContext::get();
  if (wake_fd_readable()) process.drain_wake_fd();
  REQUIRE_FALSE(wake_fd_readable());

  {  // Only this thread polls: no write.
    CountedAsSleeper counted(/*poller=*/true);
    process.ring_local();
    CHECK_FALSE(wake_fd_readable());
  }
  process.ring_local();  // nobody polls
  CHECK_FALSE(wake_fd_readable());

  // Another thread polls (registered, as Idler::idle does before poll()): it is woken, whether
  // or not this thread is registered too.
  auto other = std::make_unique<OtherThreadRegistered>(/*poller=*/true);
  {
    CountedAsSleeper counted(/*poller=*/true);
    process.ring_local();
    CHECK(wake_fd_readable());
    process.drain_wake_fd();
    // Nested registrations (a drive inside a drive) count the thread once each.
    CountedAsSleeper inner(/*poller=*/true);
    process.ring_local();
    CHECK(wake_fd_readable());
    process.drain_wake_fd();
  }
  process.ring_local();
  CHECK(wake_fd_readable());
  process.drain_wake_fd();
  other.reset();
  CHECK(process.doorbell()->pollers.load() == 0);
  CHECK(process.doorbell()->sleepers.load() == 0);
}

TEST_CASE("doorbell: ring_local bumps the futex word only for other sleepers", "[unit][doorbell]") {
  DoorbellWord* bell = ProcessContext::get().doorbell();
  const uint32_t before = bell->seq.load();
  {
    CountedAsSleeper counted(/*poller=*/false);
    ProcessContext::get().ring_local();
    CHECK(bell->seq.load() == before);
  }
  {
    OtherThreadRegistered other(/*poller=*/false);
    ProcessContext::get().ring_local();
    CHECK(bell->seq.load() != before);
  }
  CHECK(bell->sleepers.load() == 0);
}

}  // namespace chorus
