// SPDX-License-Identifier: Apache-2.0
#include "core/flight_recorder.h"

#include <fmt/format.h>

#include "common/clock.h"

namespace chorus {

uint64_t FlightRecorder::queued(std::string what, size_t bytes) {
  if (capacity_ == 0) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.size() == capacity_) entries_.pop_front();
  Entry e;
  e.id = next_id_++;
  e.what = std::move(what);
  e.bytes = bytes;
  e.queued_ns = now_ns();
  entries_.push_back(std::move(e));
  return entries_.back().id;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  if (id == 0 || entries_.empty() || id < entries_.front().id) return nullptr;
  size_t index = id - entries_.front().id;  // ids are consecutive
  return index < entries_.size() ? &entries_[index] : nullptr;
}

void FlightRecorder::started(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->state = State::kRunning;
    e->started_ns = now_ns();
  }
}

void FlightRecorder::finished(uint64_t id, const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->state = status.ok() ? State::kDone : State::kFailed;
    e->ended_ns = now_ns();
    if (!status.ok()) {
      std::string why = status.to_string();
      e->detail = e->detail.empty() ? why : fmt::format("{}; {}", e->detail, why);
    }
  }
}

void FlightRecorder::pending(uint64_t id, std::string waiting) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) e->detail = std::move(waiting);
}

std::string FlightRecorder::dump(const std::string& owner) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = now_ns();
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::string out = fmt::format("flight recorder of {}: {} operation(s), oldest first", owner,
                                entries_.size());
  for (const Entry& e : entries_) {
    const char* state = e.state == State::kQueued    ? "queued"
                        : e.state == State::kRunning ? "running"
                        : e.state == State::kDone    ? "done"
                                                     : "FAILED";
    std::string timing;
    if (e.state == State::kQueued) {
      timing = fmt::format("queued {:.3f} ms ago", ms(now - e.queued_ns));
    } else if (e.state == State::kRunning) {
      timing = fmt::format("running for {:.3f} ms", ms(now - e.started_ns));
    } else {
      timing = fmt::format("took {:.3f} ms, ended {:.3f} ms ago",
                           ms(e.ended_ns - (e.started_ns ? e.started_ns : e.queued_ns)),
                           ms(now - e.ended_ns));
    }
    out += fmt::format("\n  [{}] {} {}, {} bytes: {}", e.id, state, e.what, e.bytes, timing);
    if (!e.detail.empty()) out += fmt::format("; {}", e.detail);
  }
  return out;
}

}  // namespace chorus
