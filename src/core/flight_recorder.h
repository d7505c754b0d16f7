// SPDX-License-Identifier: Apache-2.0
// File: src/core/flight_recorder.h
// The last operations of one communicator, for diagnosis: what was called (with its sequence
// number, sizes, datatype, op, root or peers), when it was queued, started and ended, how it
// ended, and which peers it was still waiting for when it failed or timed out. The comm logs
// the record on a timeout, an abort or an error; chorusCommDumpFlightRecorder returns it.
// Bounded: CHORUS_FLIGHT_RECORDER_OPS entries (0 turns recording off). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "common/status.h"

namespace chorus {

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}

  // Returns the entry's id (0 when recording is off); later calls with an id that has been
  // dropped from the window do nothing.
  uint64_t queued(std::string what, size_t bytes);
  void started(uint64_t id);
  void finished(uint64_t id, const Status& status);
  // What the operation is still waiting for ("rank 2 (host h, pid 7): receive 0 of 64 bytes").
  void pending(uint64_t id, std::string waiting);

  // One line per operation, oldest first, under a heading naming `owner`.
  std::string dump(const std::string& owner) const;

 private:
  enum class State { kQueued, kRunning, kDone, kFailed };
  struct Entry {
    uint64_t id = 0;
    std::string what;
    size_t bytes = 0;
    int64_t queued_ns = 0, started_ns = 0, ended_ns = 0;
    State state = State::kQueued;
    std::string detail;
  };
  Entry* find(uint64_t id);

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<Entry> entries_;
  uint64_t next_id_ = 1;
};

}  // namespace chorus
