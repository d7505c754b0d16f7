// SPDX-License-Identifier: Apache-2.0
#include "core/task.h"

#include <exception>
#include <memory>
#include <new>

namespace chorus {

namespace {
// initial-exec: these are touched on every wait and frame; avoid __tls_get_addr calls.
__attribute__((tls_model("initial-exec"))) thread_local Fiber* t_current_fiber = nullptr;

// Size classes of 128 bytes up to 4 KiB; larger frames go to the global allocator. A frame
// freed on another thread joins that thread's list; lists are capped, so memory stays bounded.
constexpr std::size_t kFrameClass = 128;
constexpr std::size_t kFrameClasses = 32;
constexpr std::size_t kFramesPerClass = 64;

struct FrameCache {
  void* frames[kFrameClasses][kFramesPerClass];
  std::size_t count[kFrameClasses] = {};
  ~FrameCache();
};
// The cache lives on the heap: only a pointer is thread-local, so the library's static TLS
// stays a few hundred bytes and it can be dlopen()ed (Python, a framework's plug-in), where
// glibc has little static TLS to spare. The owner frees the cache at thread exit; frames freed
// after that go straight to the allocator.
__attribute__((tls_model("initial-exec"))) thread_local FrameCache* t_frames = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local bool t_frames_gone = false;
thread_local std::unique_ptr<FrameCache> t_frames_owner;

FrameCache::~FrameCache() {
  for (std::size_t c = 0; c < kFrameClasses; ++c)
    for (std::size_t i = 0; i < count[c]; ++i) ::operator delete(frames[c][i]);
  t_frames = nullptr;
  t_frames_gone = true;
}

FrameCache* frame_cache() {
  if (t_frames == nullptr && !t_frames_gone) {
    t_frames_owner = std::make_unique<FrameCache>();
    t_frames = t_frames_owner.get();
  }
  return t_frames;
}

std::size_t frame_class(std::size_t bytes) { return (bytes + kFrameClass - 1) / kFrameClass; }
}  // namespace

void* frame_allocate(std::size_t bytes) {
  std::size_t c = frame_class(bytes);
  FrameCache* cache = frame_cache();
  if (cache != nullptr && c < kFrameClasses && cache->count[c] > 0)
    return cache->frames[c][--cache->count[c]];
  return ::operator new(c < kFrameClasses ? c * kFrameClass : bytes);
}

void frame_free(void* frame, std::size_t bytes) noexcept {
  std::size_t c = frame_class(bytes);
  FrameCache* cache = t_frames;  // no cache yet: this thread allocated no frame
  if (cache != nullptr && c < kFrameClasses && cache->count[c] < kFramesPerClass) {
    cache->frames[c][cache->count[c]++] = frame;
    return;
  }
  ::operator delete(frame);
}

void Task::promise_type::unhandled_exception() noexcept {
  // Library code does not throw, but allocation inside a coroutine can.
  try {
    throw;
  } catch (const std::bad_alloc&) {
    status = Status(Code::kSystemError, "out of memory inside an operation");
  } catch (const std::exception& e) {
    status = internal_error("exception inside an operation: {}", e.what());
  } catch (...) {
    status = internal_error("unknown exception inside an operation");
  }
}

Fiber* Fiber::current() { return t_current_fiber; }

bool Fiber::step() {
  if (root_.done() || !cond_.ready()) return false;
  cond_ = WaitCond{};
  waiting_req_ = nullptr;
  Fiber* previous = t_current_fiber;
  t_current_fiber = this;
  leaf_.resume();
  t_current_fiber = previous;
  if (root_.done() && group_) {
    Status status = root_.take_status();
    if (!status.ok() && group_->first_error.ok()) group_->first_error = std::move(status);
    group_->done.fetch_add(1, std::memory_order_release);
  }
  return true;
}

FiberSet::FiberSet(Task root) : root_(std::move(root), this, nullptr) {}

bool FiberSet::step_all() {
  bool ran = root_.step();
  // Index loop: stepping may spawn (append) fibers, which then run in this same pass.
  for (size_t i = 0; i < children_.size(); ++i) ran |= children_[i]->step();
  // Drop finished children once they dominate, so long pipelines do not accumulate them.
  if (children_.size() > 64) {
    size_t finished = 0;
    for (const auto& f : children_) finished += f->done() ? 1 : 0;
    if (finished * 2 > children_.size()) {
      std::vector<std::unique_ptr<Fiber>> kept;
      kept.reserve(children_.size() - finished);
      for (auto& f : children_)
        if (!f->done()) kept.push_back(std::move(f));
      children_ = std::move(kept);
    }
  }
  return ran;
}

void FiberSet::add(Task task, std::shared_ptr<GroupState> group) {
  children_.push_back(std::make_unique<Fiber>(std::move(task), this, std::move(group)));
}

std::vector<const Request*> FiberSet::waiting_requests() const {
  std::vector<const Request*> out;
  if (const Request* r = root_.waiting_on()) out.push_back(r);
  for (const auto& f : children_)
    if (const Request* r = f->waiting_on()) out.push_back(r);
  return out;
}

void FiberGroup::spawn(Task task) {
  ++state_->spawned;
  Fiber::current()->set()->add(std::move(task), state_);
}

Task FiberGroup::join() {
  std::shared_ptr<GroupState> state = state_;
  co_await wait_until(WaitCond{&state->done, state->spawned});
  co_return state->first_error;
}

}  // namespace chorus
