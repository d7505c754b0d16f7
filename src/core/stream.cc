// SPDX-License-Identifier: Apache-2.0
#include "core/stream.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "common/process.h"
#include "core/engine.h"

namespace chorus {

namespace {
std::mutex g_streams_mutex;
std::set<const void*>& live_streams() {
  static auto* set = new std::set<const void*>();
  return *set;
}
std::mutex g_events_mutex;
std::set<const void*>& live_events() {
  static auto* set = new std::set<const void*>();
  return *set;
}

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

Stream* Stream::from_handle(const void* handle) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  return live_streams().count(handle) ? const_cast<Stream*>(static_cast<const Stream*>(handle))
                                      : nullptr;
}

Stream* Stream::create() {
  auto* s = new Stream();
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  live_streams().insert(s);
  return s;
}

void Stream::destroy(Stream* stream) {
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    live_streams().erase(stream);
  }
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

Event* Event::from_handle(const void* handle) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  return live_events().count(handle) ? const_cast<Event*>(static_cast<const Event*>(handle))
                                     : nullptr;
}

Event* Event::create() {
  auto* e = new Event();
  std::lock_guard<std::mutex> lock(g_events_mutex);
  live_events().insert(e);
  return e;
}

void Event::destroy(Event* event) {
  {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    live_events().erase(event);
  }
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
