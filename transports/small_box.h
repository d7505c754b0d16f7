// SPDX-License-Identifier: Apache-2.0
// File: transports/small_box.h
// Small-message boxes: a second, lighter channel between two ranks of one host, beside a
// connection's ordered byte stream, for the latency-bound collectives (src/algo/box.cc).
//
// A box is a single-producer single-consumer ring of kSlots fixed slots in memory both ranks
// map. A slot is a 32-byte header (two to a cache line, the headers back to back) and a
// payload area. A message is written whole into the next slot and published by one store of
// its ordinal into the header's first word; the consumer waits on that very word (a fiber's
// WaitCond), so a message of up to kInlineBytes moves at most one cache line from producer to
// consumer (half a line when the producer runs ahead) and nothing else: no head index, no
// chunk layer, no request queue. Longer messages take a payload area, kPayloadSlots of them in
// turn. The consumer frees a slot by counting it consumed, in a line of its own that the
// producer reads only when its cached count says the ring may be full (once per kSlots
// messages in the steady state).
//
// Wake-ups: the producer rings the consumer's process doorbell after each message (a sleeping
// consumer wakes; ring_doorbell costs a fence and a load when nobody sleeps). A producer that
// finds the ring full raises `producer_waiting` and is rung by the consumer when it frees a
// slot. Closing: a side that goes away (its connection is destroyed or fails) raises its closed
// flag; a peer waiting on it is woken (the producer writes a closing marker into the slot the
// consumer waits on; the consumer pushes the consumed count far ahead) and its wait fails with
// kRemoteError naming the peer, instead of lasting until CHORUS_TIMEOUT_MS.
//
// Messages carry the sender's MsgTag: the header a 64-bit digest of it, a slot's tag copy the
// tag itself. A rank in a different collective (another digest) gets kInvalidUsage naming
// both calls, as on the byte stream. Counters are 32-bit and compared with serial-number
// arithmetic (WaitCond does too), so they may wrap.
//
// Not thread-safe: one thread at a time uses a box's side (the one driving its communicator).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/process.h"
#include "common/status.h"
#include "transports/transport.h"

namespace chorus {

// What a side waits on before trying again: until *word reaches target (serial-number
// arithmetic), as a fiber's WaitCond (src/core/task.h) does.
struct BoxWait {
  const std::atomic<uint32_t>* word = nullptr;
  uint32_t target = 0;
};

class SmallBox {
 public:
  // Deep enough that ranks sharing a core exchange many small calls per time slice (4 ranks on
  // 2 cores, 16-byte Broadcast: 1.08-1.24 us per call with 16 slots, 0.67-0.94 us with 64).
  static constexpr uint32_t kSlots = 64;         // messages in flight
  static constexpr uint32_t kPayloadSlots = 16;  // of them, longer than kInlineBytes
  static constexpr size_t kMaxBytes = 4096;      // payload of one message
  static constexpr size_t kInlineBytes = 16;     // travels in the slot header

  // Wire layout, in the consumer's shared memory: a control block, kSlots slot headers, kSlots
  // tag copies, kPayloadSlots payload areas (region_bytes()).
  struct Control {
    // Written by the consumer only: messages consumed (release, after reading them), and set
    // once when the consumer goes away.
    alignas(64) std::atomic<uint32_t> consumed{0};
    std::atomic<uint32_t> consumer_closed{0};
    // Written by the producer only: it waits for a free slot (ring it), or it went away.
    alignas(64) std::atomic<uint32_t> producer_waiting{0};
    std::atomic<uint32_t> producer_closed{0};
  };
  struct SlotHeader {
    // Ordinal + 1 of the message in the slot (stored last, release); the consumer waits on it.
    std::atomic<uint32_t> seq{0};
    uint32_t bytes = 0;  // payload bytes, or kClosedMarker
    uint64_t digest = 0;  // tag_digest() of the message's tag (the tag itself: TagCopy)
    unsigned char inline_payload[kInlineBytes];
  };
  // The message's whole tag, read by the consumer only to name the call of a message whose
  // digest differs from the one expected.
  struct alignas(32) TagCopy {
    MsgTag tag;
  };
  // Bytes of one box in shared memory (a multiple of 64): the control block, the kSlots slot
  // headers back to back (a consumer reading them in turn walks consecutive cache lines), their
  // tag copies, then the payload areas of messages too long to travel inline.
  static constexpr size_t region_bytes() {
    return sizeof(Control) + kSlots * (sizeof(SlotHeader) + sizeof(TagCopy)) +
           kPayloadSlots * kMaxBytes;
  }
  // Prepares a zeroed region for use (its owner, before peers map it).
  static void init(void* region);

  // `outgoing`: the box we produce into (in the peer's memory); `incoming`: the one we consume
  // (ours). `peer_doorbell` wakes the peer's process. `self` and `peer` (communicator ranks)
  // name the two sides in errors.
  SmallBox(void* outgoing, void* incoming, DoorbellWord* peer_doorbell, int self, int peer);
  SmallBox(const SmallBox&) = delete;
  SmallBox& operator=(const SmallBox&) = delete;

  int peer() const { return peer_; }

  // ---- Producer ----
  // True when the next message, `bytes` long, can be written now. Otherwise asks the consumer
  // to ring us and sets *wait to what to wait on before asking again.
  bool can_send(BoxWait* wait, size_t bytes);
  // Writes the next message (can_send() was true): `bytes` <= kMaxBytes. Fails once the
  // consumer went away.
  Status send(const MsgTag& tag, const void* data, size_t bytes);

  // ---- Consumer ----
  // True when the next message has arrived (or the producer went away: receive() says so).
  // Otherwise sets *wait to the word to wait on.
  bool can_receive(BoxWait* wait) const;
  // The next message, which must be `tag` and `bytes` long: its payload, valid until
  // release(). Fails on a mismatch (kInvalidUsage) or when the producer went away.
  Result<const void*> receive(const MsgTag& tag, size_t bytes);
  // Frees the slot of the message receive() returned.
  void release();

  // This side goes away: wakes a peer that waits on us. Idempotent.
  void close();

 private:
  static constexpr uint32_t kClosedMarker = 0xffffffffu;
  SlotHeader* slot(std::byte* box, uint32_t ordinal) const {
    return reinterpret_cast<SlotHeader*>(box + sizeof(Control)) + ordinal % kSlots;
  }
  TagCopy* tag_copy(std::byte* box, uint32_t ordinal) const {
    return reinterpret_cast<TagCopy*>(box + sizeof(Control) + kSlots * sizeof(SlotHeader)) +
           ordinal % kSlots;
  }
  // Message `ordinal`'s payload, if longer than kInlineBytes: message ordinal - kPayloadSlots
  // had the area before it.
  std::byte* payload(std::byte* box, uint32_t ordinal) const {
    return box + sizeof(Control) + kSlots * (sizeof(SlotHeader) + sizeof(TagCopy)) +
           (ordinal % kPayloadSlots) * kMaxBytes;
  }
  static uint64_t tag_digest(const MsgTag& tag);
  Control* control(std::byte* box) const { return reinterpret_cast<Control*>(box); }
  // Whether the next message's slot is free: `window` is kSlots, or kPayloadSlots for a
  // message with a payload area.
  bool slot_free(uint32_t consumed, uint32_t window = kSlots) const {
    return static_cast<int32_t>(consumed - (sent_ + 1 - window)) >= 0;
  }
  Status closed_error(bool peer_produces) const;

  std::byte* const out_;
  std::byte* const in_;
  DoorbellWord* const peer_doorbell_;
  const int self_;
  const int peer_;
  uint32_t sent_ = 0;             // messages written
  uint32_t consumed_cached_ = 0;  // last value loaded from out_'s consumed
  uint32_t received_ = 0;         // messages consumed
  bool waiting_raised_ = false;   // producer_waiting is set
  bool peer_gone_ = false;        // the consumer closed (seen when reloading its count)
  bool closed_ = false;
};

}  // namespace chorus
