// SPDX-License-Identifier: Apache-2.0
#include "core/flight_recorder.h"

#include <fmt/format.h>

#include "common/clock.h"

namespace chorus {

FlightRecorder::Entry& FlightRecorder::next_entry() {
  if (ring_.size() < capacity_) ring_.emplace_back();
  Entry& e = slot(next_id_);
  e.id = next_id_++;
  e.queued_ns = now_coarse_ns();
  e.started_ns = e.ended_ns = 0;
  e.state = State::kQueued;
  e.detail.clear();
  e.failure.clear();
  return e;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  if (id == 0 || id >= next_id_ || next_id_ - id > capacity_) return nullptr;
  return &slot(id);
}

void FlightRecorder::started(uint64_t id) {
  if (id == 0) return;
  const int64_t now = now_coarse_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->state = State::kRunning;
    e->started_ns = now;
  }
}

void FlightRecorder::finished(uint64_t id, const Status& status) {
  if (id == 0) return;
  const int64_t now = now_coarse_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) {
    e->ended_ns = now;
    end(e, status);
  }
}

void FlightRecorder::pending(uint64_t id, std::string waiting) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(id)) e->detail = std::move(waiting);
}

std::string FlightRecorder::dump(const std::string& owner, bool with_failures) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = now_coarse_ns();
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
  std::string out = fmt::format("flight recorder of {}: {} operation(s), oldest first", owner,
                                next_id_ - first);
  for (uint64_t id = first; id < next_id_; ++id) {
    const Entry& e = slot(id);
    const char* state = e.state == State::kQueued    ? "queued"
                        : e.state == State::kRunning ? "running"
                        : e.state == State::kDone    ? "done"
                                                     : "FAILED";
    std::string timing;
    if (e.state == State::kQueued) {
      timing = fmt::format("queued {:.0f} ms ago", ms(now - e.queued_ns));
    } else if (e.state == State::kRunning) {
      timing = fmt::format("running for {:.0f} ms", ms(now - e.started_ns));
    } else {
      timing = fmt::format("took {:.0f} ms, ended {:.0f} ms ago",
                           ms(e.ended_ns - (e.started_ns ? e.started_ns : e.queued_ns)),
                           ms(now - e.ended_ns));
    }
    out += fmt::format("\n  [{}] {} {}, {} bytes: {}", e.id, state, e.what.describe(true),
                       e.what.bytes, timing);
    if (!e.detail.empty()) out += fmt::format("; {}", e.detail);
    if (!e.failure.empty()) out += with_failures ? fmt::format("; {}", e.failure) : "; (reason logged above)";
  }
  return out;
}

}  // namespace chorus
