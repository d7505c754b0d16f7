// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_stats.h
// How many payload bytes went which way: through the receiver's ring (the bounce buffer,
// copied out of a slot at the receiver) or zero copy (written by the sender's HCA straight
// into the receiver's registered buffer). Per instance, and summed over the process, so that
// tests can tell whether registered memory really skipped the ring.
#pragma once

#include <atomic>
#include <cstdint>

namespace chorus::verbs {

struct ByteCounts {
  uint64_t ring_sent = 0;           // payload written into a peer's ring slots
  uint64_t ring_received = 0;       // payload copied (or reduced) out of our ring slots
  uint64_t zero_copy_sent = 0;      // payload written into a peer's buffer
  uint64_t zero_copy_received = 0;  // payload a peer wrote into our buffer
  uint64_t inline_sent = 0;         // of ring_sent: in inline sends, completed when posted
};

// One instance's counters, shared by its connections; each addition also counts in the
// process's totals. Relaxed atomics: readers only want totals between operations.
class ByteCounters {
 public:
  void ring_sent(uint64_t n);
  void ring_received(uint64_t n);
  void zero_copy_sent(uint64_t n);
  void zero_copy_received(uint64_t n);
  void inline_sent(uint64_t n);
  ByteCounts get() const;

 private:
  std::atomic<uint64_t> ring_sent_{0}, ring_received_{0}, zero_copy_sent_{0},
      zero_copy_received_{0}, inline_sent_{0};
};

// Every verbs instance of this process, since it started.
ByteCounts process_byte_counts();

}  // namespace chorus::verbs
