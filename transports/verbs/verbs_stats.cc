// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_stats.cc
#include "transports/verbs/verbs_stats.h"

namespace chorus::verbs {

namespace {

ByteCounters& process_counters() {
  static ByteCounters counters;
  return counters;
}

void add(std::atomic<uint64_t>& to, uint64_t n) { to.fetch_add(n, std::memory_order_relaxed); }

}  // namespace

void ByteCounters::ring_sent(uint64_t n) {
  add(ring_sent_, n);
  if (this != &process_counters()) process_counters().ring_sent(n);
}
void ByteCounters::ring_received(uint64_t n) {
  add(ring_received_, n);
  if (this != &process_counters()) process_counters().ring_received(n);
}
void ByteCounters::zero_copy_sent(uint64_t n) {
  add(zero_copy_sent_, n);
  if (this != &process_counters()) process_counters().zero_copy_sent(n);
}
void ByteCounters::zero_copy_received(uint64_t n) {
  add(zero_copy_received_, n);
  if (this != &process_counters()) process_counters().zero_copy_received(n);
}

void ByteCounters::inline_sent(uint64_t n) {
  add(inline_sent_, n);
  if (this != &process_counters()) process_counters().inline_sent(n);
}

ByteCounts ByteCounters::get() const {
  ByteCounts c;
  c.ring_sent = ring_sent_.load(std::memory_order_relaxed);
  c.ring_received = ring_received_.load(std::memory_order_relaxed);
  c.zero_copy_sent = zero_copy_sent_.load(std::memory_order_relaxed);
  c.zero_copy_received = zero_copy_received_.load(std::memory_order_relaxed);
  c.inline_sent = inline_sent_.load(std::memory_order_relaxed);
  return c;
}

ByteCounts process_byte_counts() { return process_counters().get(); }

}  // namespace chorus::verbs
