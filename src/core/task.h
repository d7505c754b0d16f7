// SPDX-License-Identifier: Apache-2.0
// File: src/core/task.h
// Non-blocking algorithms written as straight-line code: C++20 coroutines.
//
// An algorithm is a `Task` (a coroutine returning Status). It posts sends and receives and
// `co_await`s them; it never blocks a thread. A `Fiber` runs one root Task; the fibers of one
// operation form a `FiberSet`, which the progress engine steps: each fiber whose wait condition
// holds runs until its next wait. Tasks nest (`co_await sub_task(...)`), and a Task can run
// children side by side (FiberGroup, e.g. one per channel) and join them.
//
// All fibers of an operation are stepped by the one thread driving that operation, so they
// need no locks; the only cross-thread state is the atomic word a fiber waits on.
#pragma once

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"

namespace chorus {

struct Request;
class FiberSet;

// Coroutine frames come from small per-thread free lists (operations start and finish
// thousands of times a second; frames of one algorithm always have the same size).
void* frame_allocate(std::size_t bytes);
void frame_free(void* frame, std::size_t bytes) noexcept;

// Ready when *word has reached target (acquire): in serial-number arithmetic, so that a
// counter may wrap (ready while *word - target, as a signed 32-bit difference, is >= 0). A null
// word is always ready.
struct WaitCond {
  const std::atomic<uint32_t>* word = nullptr;
  uint32_t target = 0;
  bool ready() const {
    return word == nullptr ||
           static_cast<int32_t>(word->load(std::memory_order_acquire) - target) >= 0;
  }
};

class [[nodiscard]] Task {
 public:
  struct promise_type {
    Status status;
    std::coroutine_handle<> continuation;

    static void* operator new(std::size_t bytes) { return frame_allocate(bytes); }
    static void operator delete(void* frame, std::size_t bytes) noexcept { frame_free(frame, bytes); }

    Task get_return_object() {
      return Task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        auto next = h.promise().continuation;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_value(Status s) { status = std::move(s); }
    void unhandled_exception() noexcept;
  };
  using Handle = std::coroutine_handle<promise_type>;

  Task() = default;
  explicit Task(Handle h) : handle_(h) {}
  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (handle_) handle_.destroy();
  }

  bool done() const { return !handle_ || handle_.done(); }
  Handle handle() const { return handle_; }
  Status take_status() { return std::move(handle_.promise().status); }

  // Awaiting a Task runs it to completion as a nested call and yields its Status.
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) noexcept {
    handle_.promise().continuation = caller;
    return handle_;
  }
  Status await_resume() { return std::move(handle_.promise().status); }

 private:
  Handle handle_;
};

// Completion state shared by a FiberGroup and its children (children may outlive the group
// object if the parent returns early on an error; the FiberSet then destroys them).
struct GroupState {
  std::atomic<uint32_t> done{0};
  uint32_t spawned = 0;
  Status first_error;
};

class Fiber {
 public:
  Fiber(Task root, FiberSet* set, std::shared_ptr<GroupState> group)
      : root_(std::move(root)), leaf_(root_.handle()), set_(set), group_(std::move(group)) {}
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Runs the fiber until its next wait, if what it waits on is ready. True if it ran.
  bool step();
  bool done() const { return root_.done(); }
  Status take_status() { return root_.take_status(); }
  FiberSet* set() const { return set_; }
  // The request the fiber is blocked on, if any (diagnostics of stuck operations).
  const Request* waiting_on() const { return done() ? nullptr : waiting_req_; }

  // The fiber being stepped on this thread.
  static Fiber* current();
  // From await_suspend: park `leaf` until `cond` holds.
  void park(std::coroutine_handle<> leaf, WaitCond cond, const Request* req) {
    leaf_ = leaf;
    cond_ = cond;
    waiting_req_ = req;
  }

 private:
  Task root_;
  std::coroutine_handle<> leaf_;
  WaitCond cond_;
  const Request* waiting_req_ = nullptr;
  FiberSet* set_;
  std::shared_ptr<GroupState> group_;  // null for an operation's root fiber
};

// The fibers of one operation: the root, and children spawned by FiberGroups.
class FiberSet {
 public:
  explicit FiberSet(Task root);
  FiberSet(const FiberSet&) = delete;
  FiberSet& operator=(const FiberSet&) = delete;

  // Steps every runnable fiber once; true if any ran.
  bool step_all();
  bool done() const { return root_.done(); }
  Status take_status() { return root_.take_status(); }
  void add(Task task, std::shared_ptr<GroupState> group);
  // Requests that blocked fibers wait on (diagnostics).
  std::vector<const Request*> waiting_requests() const;

 private:
  Fiber root_;
  std::vector<std::unique_ptr<Fiber>> children_;  // spawned by FiberGroups
};

// `co_await wait_until(cond)`: parks the current fiber until cond holds.
struct WaitUntil {
  WaitCond cond;
  const Request* req = nullptr;
  bool yield = false;
  bool await_ready() const { return !yield && cond.ready(); }
  void await_suspend(std::coroutine_handle<> h) const { Fiber::current()->park(h, cond, req); }
  void await_resume() const {}
};
inline WaitUntil wait_until(WaitCond cond) { return WaitUntil{cond, nullptr, false}; }
// `co_await yield_now()`: resumes on the next progress pass.
inline WaitUntil yield_now() { return WaitUntil{WaitCond{}, nullptr, true}; }

// Runs tasks side by side with the current fiber. join() waits for all and yields the first
// error. Must be used from inside a fiber.
class FiberGroup {
 public:
  FiberGroup() : state_(std::make_shared<GroupState>()) {}
  void spawn(Task task);
  // `CHORUS_CO_RETURN_IF_ERROR(co_await group.join())`
  Task join();

 private:
  std::shared_ptr<GroupState> state_;
};

}  // namespace chorus
