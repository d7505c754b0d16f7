// SPDX-License-Identifier: Apache-2.0
#include "core/stream.h"

#include <set>

namespace chorus {

namespace {
std::mutex g_streams_mutex;
std::set<const void*>& live_streams() {
  static auto* set = new std::set<const void*>();
  return *set;
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

}  // namespace chorus
