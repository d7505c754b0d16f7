// SPDX-License-Identifier: Apache-2.0
// File: src/core/stream.h
// A host stream (include/chorus/stream.h): an ordered chain of operations. Each operation
// queued on a stream depends on the one queued before it; the first error is remembered.
#pragma once

#include <memory>
#include <mutex>

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

}  // namespace chorus
