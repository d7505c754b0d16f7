// SPDX-License-Identifier: Apache-2.0
#include "core/stream.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "common/process.h"
#include "core/engine.h"

namespace chorus {

namespace {
// The live objects of one kind handed to users as handles: a handle is valid while in here.
// Leaked on purpose (handles may be checked during static destruction).
template <typename T>
class LiveSet {
 public:
  static LiveSet& get() {
    static auto* set = new LiveSet();
    return *set;
  }
  T* find(const void* handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.count(handle) ? const_cast<T*>(static_cast<const T*>(handle)) : nullptr;
  }
  T* add(T* object) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(object);
    return object;
  }
  void remove(T* object) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(object);
  }

 private:
  std::mutex mutex_;
  std::set<const void*> live_;
};

// The comms whose progress `ops` wait for (a comm op is driven by whoever waits for it).
std::vector<Comm*> comms_of(const std::vector<std::shared_ptr<Op>>& ops) {
  std::vector<Comm*> comms;
  for (const auto& op : ops)
    if (op->comm() != nullptr) comms.push_back(op->comm());
  return comms;
}
}  // namespace

void Stream::append(const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (last_ && !last_->done()) op->deps().push_back(last_);
  op->streams().push_back(this);
  last_ = op;
}

std::shared_ptr<Op> Stream::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

bool Stream::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !last_ || last_->done();
}

void Stream::note_result(const Status& status) {
  if (status.ok()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_error_.ok()) first_error_ = status;
}

Status Stream::first_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_error_;
}

Stream* Stream::from_handle(const void* handle) { return LiveSet<Stream>::get().find(handle); }

Stream* Stream::create() { return LiveSet<Stream>::get().add(new Stream()); }

void Stream::destroy(Stream* stream) {
  LiveSet<Stream>::get().remove(stream);
  delete stream;
}

void Event::record(Stream& stream) {
  std::shared_ptr<Op> last = stream.last();
  std::lock_guard<std::mutex> lock(mutex_);
  op_ = last && !last->done() ? std::move(last) : nullptr;
}

void Event::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  op_ = nullptr;
}

std::shared_ptr<Op> Event::op() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return op_;
}

Event* Event::from_handle(const void* handle) { return LiveSet<Event>::get().find(handle); }

Event* Event::create() { return LiveSet<Event>::get().add(new Event()); }

void Event::destroy(Event* event) {
  LiveSet<Event>::get().remove(event);
  delete event;  // its op lives on in the streams that wait for it
}

void stream_wait_op(Stream& stream, const std::shared_ptr<Op>& op) {
  if (!op || (op->done() && op->status().ok())) return;
  auto gate = std::make_shared<Op>(Op::Outside::kGate, "wait for an event");
  gate->deps().push_back(op);
  stream.append(gate);
  Engine::get().submit(gate);
}

Status wait_op(const std::shared_ptr<Op>& op) {
  if (!op) return Status();
  if (!op->done()) drive_until([&] { return op->done(); }, comms_of({op}));
  return op->status();
}

std::shared_ptr<Op> ExternalOp::queue(Stream& stream, std::string what) {
  auto op = std::make_shared<Op>(Op::Outside::kExternal, std::move(what));
  stream.append(op);
  return op;
}

Status ExternalOp::start(const std::shared_ptr<Op>& op) {
  if (!op->deps_done()) drive_until([&] { return op->deps_done(); }, comms_of(op->deps()));
  Status status = op->deps_status();
  op->deps().clear();
  if (status.ok()) return status;
  return Status(status.code(), fmt::format("{} not run: an earlier operation on its stream "
                                           "failed: {}", op->describe(), status.message()));
}

void ExternalOp::finish(const std::shared_ptr<Op>& op, Status status) {
  for (Stream* s : op->streams()) s->note_result(status);
  op->complete(std::move(status));
  ProcessContext::get().ring_local();
}

}  // namespace chorus
