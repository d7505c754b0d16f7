// SPDX-License-Identifier: Apache-2.0
// File: src/core/stream.h
// A host stream (include/chorus/stream.h): an ordered chain of operations. Each operation
// queued on a stream depends on the one queued before it; the first error is remembered.
// Events capture a stream's last operation; a stream waits for an event through a gate op
// (run by the engine once the event's op is done). Modules that do their own work in stream
// order (the EP module's worker, src/ep/async.h) queue external ops and complete them.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "core/op.h"

namespace chorus {

class Stream {
 public:
  // Makes `op` wait for the stream's previous operation, and records it as the last one.
  // Call before the op is queued on its comm.
  void append(const std::shared_ptr<Op>& op);
  std::shared_ptr<Op> last() const;
  bool idle() const;
  // Called when an op of this stream completes; keeps the first error.
  void note_result(const Status& status);
  Status first_error() const;

  // Handles given to users: validated against the set of live streams.
  static Stream* from_handle(const void* handle);
  static Stream* create();
  static void destroy(Stream* stream);

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Op> last_;
  Status first_error_;
};

// A host event (chorusEvent_t): the work of a stream up to its last chorusEventRecord.
class Event {
 public:
  // Captures `stream`'s last operation (nothing pending: the event is complete).
  void record(Stream& stream);
  void clear();
  // The captured operation, or null (never recorded, or nothing was pending).
  std::shared_ptr<Op> op() const;

  static Event* from_handle(const void* handle);
  static Event* create();
  static void destroy(Event* event);

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Op> op_;
};

// Makes `stream` wait, for what is queued on it from now on, until `op` is done; a failure of
// `op` fails the stream.
void stream_wait_op(Stream& stream, const std::shared_ptr<Op>& op);

// Waits (driving the comms involved) until `op` is done; returns its status.
Status wait_op(const std::shared_ptr<Op>& op);

// Work queued on a stream but done by a thread of its owner: queue() puts an op in stream order,
// the owner waits for start() (the work before it on the stream is done; its failure is
// returned, and the work must then not run), does the work, and calls finish().
struct ExternalOp {
  static std::shared_ptr<Op> queue(Stream& stream, std::string what);
  static Status start(const std::shared_ptr<Op>& op);
  static void finish(const std::shared_ptr<Op>& op, Status status);
};

}  // namespace chorus
