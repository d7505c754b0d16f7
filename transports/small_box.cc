// SPDX-License-Identifier: Apache-2.0
// File: transports/small_box.cc
#include "transports/small_box.h"

#include <cstring>
#include <new>

namespace chorus {

static_assert(sizeof(SmallBox::SlotHeader) == 32, "two slot headers share a cache line");
static_assert(sizeof(SmallBox::Control) == 128);
static_assert(SmallBox::region_bytes() % 64 == 0);

void SmallBox::init(void* region) {
  auto* base = static_cast<std::byte*>(region);
  new (base) Control();
  auto* headers = reinterpret_cast<SlotHeader*>(base + sizeof(Control));
  for (uint32_t i = 0; i < kSlots; ++i) new (headers + i) SlotHeader();
  auto* tags = reinterpret_cast<TagCopy*>(headers + kSlots);
  for (uint32_t i = 0; i < kSlots; ++i) new (tags + i) TagCopy();
}

SmallBox::SmallBox(void* outgoing, void* incoming, DoorbellWord* peer_doorbell, int self, int peer)
    : out_(static_cast<std::byte*>(outgoing)),
      in_(static_cast<std::byte*>(incoming)),
      peer_doorbell_(peer_doorbell),
      self_(self),
      peer_(peer) {}

uint64_t SmallBox::tag_digest(const MsgTag& tag) {
  // The fields MsgTag::operator== compares, mixed (splitmix64's finaliser): equal tags give
  // equal digests, different ones differ but for a 2^-64 chance.
  auto mix = [](uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  };
  uint64_t h = mix(tag.seq, uint64_t{tag.coll} | uint64_t{tag.dtype} << 8 |
                                uint64_t{tag.redop} << 16 |
                                uint64_t{static_cast<uint32_t>(tag.root)} << 32);
  return mix(h, tag.count);
}

Status SmallBox::closed_error(bool peer_produces) const {
  return remote_error("rank {} closed its small-message box {} rank {} (its communicator failed "
                      "or was destroyed)", peer_, peer_produces ? "to" : "from", self_);
}

bool SmallBox::can_send(BoxWait* wait, size_t bytes) {
  const uint32_t window = bytes > kInlineBytes ? kPayloadSlots : kSlots;
  if (slot_free(consumed_cached_, window) || peer_gone_) return true;
  Control* c = control(out_);
  consumed_cached_ = c->consumed.load(std::memory_order_acquire);
  if (!slot_free(consumed_cached_, window)) {
    // Ask to be rung when a slot frees, then look again (Dekker with release(): either it sees
    // our flag or we see its count).
    if (!waiting_raised_) {
      c->producer_waiting.store(1, std::memory_order_seq_cst);
      waiting_raised_ = true;
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    consumed_cached_ = c->consumed.load(std::memory_order_acquire);
    if (!slot_free(consumed_cached_, window)) {
      *wait = BoxWait{&c->consumed, sent_ + 1 - window};
      return false;
    }
  }
  if (waiting_raised_) {
    c->producer_waiting.store(0, std::memory_order_relaxed);
    waiting_raised_ = false;
  }
  // A closing consumer pushes its count ahead first: seen here, send() fails.
  peer_gone_ = c->consumer_closed.load(std::memory_order_acquire) != 0;
  return true;
}

Status SmallBox::send(const MsgTag& tag, const void* data, size_t bytes) {
  if (closed_) {
    return remote_error("rank {}'s small-message box to rank {} is closed", self_, peer_);
  }
  if (peer_gone_) return closed_error(false);
  if (bytes > kMaxBytes) {
    return invalid_argument("a small-message box carries at most {} bytes, not {}", kMaxBytes,
                            bytes);
  }
  SlotHeader* s = slot(out_, sent_);
  if (bytes == 0) {
    // Nothing to copy (data may be null).
  } else if (bytes <= kInlineBytes) {
    std::memcpy(s->inline_payload, data, bytes);
  } else {
    std::memcpy(payload(out_, sent_), data, bytes);
  }
  tag_copy(out_, sent_)->tag = tag;
  s->bytes = static_cast<uint32_t>(bytes);
  s->digest = tag_digest(tag);
  s->seq.store(++sent_, std::memory_order_release);
  ring_doorbell(peer_doorbell_);
  return Status();
}

bool SmallBox::can_receive(BoxWait* wait) const {
  SlotHeader* s = slot(in_, received_);
  if (s->seq.load(std::memory_order_acquire) == received_ + 1) return true;
  // Dekker with close() on the producer's side: it raises its flag, then looks at our count.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control(in_)->producer_closed.load(std::memory_order_acquire) != 0) return true;
  *wait = BoxWait{&s->seq, received_ + 1};
  return false;
}

Result<const void*> SmallBox::receive(const MsgTag& tag, size_t bytes) {
  SlotHeader* s = slot(in_, received_);
  if (s->seq.load(std::memory_order_acquire) != received_ + 1 || s->bytes == kClosedMarker)
    return closed_error(true);
  if (s->digest != tag_digest(tag) || s->bytes != bytes) {
    return invalid_usage("rank {} sent {} but rank {} expects {} from it", peer_,
                         describe_message(tag_copy(in_, received_)->tag, s->bytes), self_,
                         describe_message(tag, bytes));
  }
  if (bytes <= kInlineBytes) return static_cast<const void*>(s->inline_payload);
  return static_cast<const void*>(payload(in_, received_));
}

void SmallBox::release() {
  Control* c = control(in_);
  c->consumed.store(++received_, std::memory_order_release);
  // Dekker with can_send(): it raises producer_waiting, then reloads our count.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (c->producer_waiting.load(std::memory_order_relaxed) != 0) ring_doorbell(peer_doorbell_);
}

void SmallBox::close() {
  if (closed_) return;
  closed_ = true;
  // As a consumer: push our count far ahead, so that a producer waiting for a slot wakes (it
  // then sees consumer_closed).
  Control* in = control(in_);
  in->consumer_closed.store(1, std::memory_order_release);
  in->consumed.store(received_ + (1u << 30), std::memory_order_release);
  // As a producer: raise our flag, then write a closing marker into the slot the consumer waits
  // on next, if it is free (else the consumer has messages to read first, and sees our flag
  // before it waits: can_receive()).
  Control* out = control(out_);
  out->producer_closed.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (slot_free(out->consumed.load(std::memory_order_acquire))) {
    SlotHeader* s = slot(out_, sent_);
    s->bytes = kClosedMarker;
    s->seq.store(sent_ + 1, std::memory_order_release);
  }
  ring_doorbell(peer_doorbell_);
}

}  // namespace chorus
