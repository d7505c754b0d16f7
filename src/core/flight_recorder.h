// SPDX-License-Identifier: Apache-2.0
// File: src/core/flight_recorder.h
// The last operations of one communicator, for diagnosis: what was called (with its sequence
// number, sizes, datatype, op, root or peers), when it was queued, started and ended, how it
// ended, and which peers it was still waiting for when it failed or timed out. The comm logs
// the record on a timeout, an abort or an error; chorusCommDumpFlightRecorder returns it.
// Bounded: CHORUS_FLIGHT_RECORDER_OPS entries (0 turns recording off). Thread-safe. Times come
// from the coarse clock (the kernel's tick, a few ms): recording costs an 8-byte AllReduce
// little, and what matters when diagnosing a hang is seconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "core/op_summary.h"

namespace chorus {

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}

  // Records a queued operation, described by `fill(OpSummary*)` (called under the lock, on a
  // reused entry: it must set every field that OpSummary::describe reads). Returns the entry's
  // id (0 when recording is off); later calls with an id that has been dropped from the window
  // do nothing.
  template <typename Fill>
  uint64_t queued(const Fill& fill) {
    return record(fill, State::kQueued);
  }
  // queued() and started() at once, for an operation that runs as soon as it is called.
  template <typename Fill>
  uint64_t running(const Fill& fill) {
    return record(fill, State::kRunning);
  }
  // An operation that ran and ended between two looks at the clock (the express path's calls
  // that did not wait long): one entry, one lock, instead of running() and finished().
  template <typename Fill>
  void completed(const Fill& fill, const Status& status) {
    record(fill, State::kRunning, &status);
  }
  void started(uint64_t id);
  void finished(uint64_t id, const Status& status);
  // What the operation is still waiting for ("rank 2 (host h, pid 7): receive 0 of 64 bytes").
  void pending(uint64_t id, std::string waiting);

  // One line per operation, oldest first, under a heading naming `owner`.
  // Failed operations show why, unless `with_failures` is false (the failure was just logged).
  std::string dump(const std::string& owner, bool with_failures = true) const;

 private:
  enum class State { kQueued, kRunning, kDone, kFailed };
  struct Entry {
    uint64_t id = 0;
    OpSummary what;
    int64_t queued_ns = 0, started_ns = 0, ended_ns = 0;
    State state = State::kQueued;
    std::string detail;
    std::string failure;  // why it failed, if it did
  };
  // A new entry in `state`; with `ended`, one that also ended now, that way.
  template <typename Fill>
  uint64_t record(const Fill& fill, State state, const Status* ended = nullptr) {
    if (capacity_ == 0) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& e = next_entry();
    fill(&e.what);
    e.state = state;
    if (state == State::kRunning) e.started_ns = e.queued_ns;
    if (ended != nullptr) {
      e.ended_ns = e.queued_ns;
      end(&e, *ended);
    }
    return e.id;
  }
  Entry* find(uint64_t id);
  static void end(Entry* e, const Status& status) {
    e->state = status.ok() ? State::kDone : State::kFailed;
    if (!status.ok()) e->failure = status.to_string();
  }
  Entry& next_entry();  // the slot of a new entry, reset (mutex_ held)

  Entry& slot(uint64_t id) { return ring_[(id - 1) % capacity_]; }
  const Entry& slot(uint64_t id) const { return ring_[(id - 1) % capacity_]; }

  // The last capacity_ entries, entry `id` in slot (id - 1) % capacity_; the ring grows to its
  // capacity, then queuing reuses a slot (and its strings' buffers) instead of allocating.
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  uint64_t next_id_ = 1;
};

}  // namespace chorus
