// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/shm_fifo_fuzz.cc
// The consumer side of a shared-memory connection (transports/shm/shm_connection.cc) fed by a
// hostile or broken producer. A real ShmConnection reads from a FIFO in this process's memory;
// the harness plays the producer: it copies the stream from the input into the ring as space
// frees up and publishes head, like the peer process would. This runs the 64-byte MsgHeader
// check (magic, index, tag, size against the posted receive), the head/tail validation, plain and
// reducing receives straight from the ring (wrapping around it), messages by reference (the
// address comes from the stream; it rarely points anywhere valid, so those mostly fail
// cleanly), the producer's farewell (flags bit 1, reason text as payload) and the producer
// closing. Input:
//   u8 receives (1 + n % 6) | u8 ring size (64 * (1 + n % 64)) | u8 mode | u64 raw head
//   receive specs (fuzz_requests.h) | the stream: per message a MsgHeader (u32 magic 'CHSM',
//   u32 index, MsgTag, u64 bytes, u64 address, u32 flags, padding to 64) then the payload
//   padded to 64 bytes.
// mode bit 0: the producer closes once the stream is out; bit 1: once stuck, it publishes the
// raw head value instead (a corrupt counter).
// Invariants: what completes holds exactly its message's payload; a corrupt stream or counter
// fails the connection, which then finishes every request.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "fuzz_requests.h"
#include "transports/shm/shm_connection.h"

using namespace chorus;
using chorus::fuzz::Input;

namespace {

struct Fifo {
  std::unique_ptr<shm::FifoControl> control = std::make_unique<shm::FifoControl>();
  std::byte* data = nullptr;
  uint64_t bytes = 0;
  explicit Fifo(uint64_t n) : data(static_cast<std::byte*>(std::aligned_alloc(64, n))), bytes(n) {
    std::memset(data, 0, n);
  }
  ~Fifo() { std::free(data); }
  shm::FifoRef ref() const { return shm::FifoRef{control.get(), data, bytes}; }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  size_t nrecv = 1 + input.u8() % 6;
  uint64_t fifo_bytes = shm::kFifoAlign * (1 + input.u8() % 64);
  uint8_t mode = input.u8();
  uint64_t raw_head = input.u64();
  fuzz::Receives recvs;
  recvs.read(input, nrecv);
  std::string_view stream = input.rest();

  Fifo incoming(fifo_bytes), outgoing(fifo_bytes);
  DoorbellWord doorbell{};
  {
    shm::ShmConnectionConfig config;
    config.self_rank = 0;
    config.peer_rank = 1;
    config.peer_pid = getpid();
    config.send_fifo = outgoing.ref();
    config.recv_fifo = incoming.ref();
    config.peer_doorbell = &doorbell;
    shm::ShmConnection conn(std::move(config));
    for (auto& r : recvs.reqs) conn.post_recv(r.get());

    uint64_t head = 0;  // the producer's position: stream bytes written, padded to kFifoAlign
    bool corrupted = false;
    for (int iter = 0; iter < 100000 && conn.error().ok() && !recvs.all_done(); ++iter) {
      uint64_t tail = incoming.control->tail.load(std::memory_order_acquire);
      FUZZ_CHECK(tail <= head && tail % shm::kFifoAlign == 0);
      uint64_t space = fifo_bytes - (head - tail);
      uint64_t left = head < stream.size() ? stream.size() - head : 0;
      uint64_t n = std::min<uint64_t>(space, (left + shm::kFifoAlign - 1) & ~(shm::kFifoAlign - 1));
      for (uint64_t i = 0; i < n; i += shm::kFifoAlign) {
        std::byte* slot = incoming.data + (head + i) % fifo_bytes;
        std::memset(slot, 0, shm::kFifoAlign);
        if (head + i < stream.size()) {
          std::memcpy(slot, stream.data() + head + i,
                      std::min<uint64_t>(shm::kFifoAlign, stream.size() - head - i));
        }
      }
      head += n;
      incoming.control->head.store(head, std::memory_order_release);
      if (head >= stream.size() && (mode & 1)) {
        incoming.control->producer_closed.store(1, std::memory_order_release);
      }
      bool moved = conn.progress();
      if (!moved && n == 0) {
        if (!(mode & 2)) break;
        // Stuck: a broken producer publishes a head of its choice. Ring bytes past what was
        // written are zeros (or older messages), so the payload check below no longer applies.
        incoming.control->head.store(raw_head, std::memory_order_release);
        corrupted = true;
        for (int i = 0; i < 8 && conn.progress(); ++i) {
        }
        break;
      }
    }
    if (!conn.error().ok()) {
      FUZZ_CHECK(!conn.error().message().empty());
      for (auto& r : recvs.reqs) FUZZ_CHECK(r->done());
    }
    // What completed holds exactly the payload of its message (combined with src when reducing):
    // the stream as the ring holds it, zero-padded to whole kFifoAlign slots.
    std::string ring_view(stream);
    ring_view.resize((stream.size() + shm::kFifoAlign - 1) / shm::kFifoAlign * shm::kFifoAlign);
    uint64_t pos = 0;
    for (auto& r : recvs.reqs) {
      if (corrupted || !r->done() || r->failed()) break;
      FUZZ_CHECK(r->bytes_done.load() == r->bytes);
      shm::MsgHeader h;
      FUZZ_CHECK(pos + sizeof(h) <= ring_view.size());
      std::memcpy(&h, ring_view.data() + pos, sizeof(h));
      FUZZ_CHECK(h.magic == shm::kMsgMagic && h.tag == r->tag && h.bytes == r->bytes);
      // A message by reference was read from an address of the stream's choosing (in this
      // process, which plays the peer): nothing to compare it with.
      if (h.flags & shm::kByReference) {
        pos += sizeof(h);
        continue;
      }
      // A small payload may travel inside its header.
      const bool in_header = (h.flags & shm::kInline) != 0;
      FUZZ_CHECK(!in_header || r->bytes <= shm::kInlineBytes);
      FUZZ_CHECK(in_header || pos + sizeof(h) + r->bytes <= ring_view.size());
      const size_t payload_at =
          pos + (in_header ? offsetof(shm::MsgHeader, inline_payload) : sizeof(h));
      std::string_view payload(ring_view.data() + payload_at, r->bytes);
      if (r->reduce == nullptr) {
        FUZZ_CHECK(std::memcmp(r->dst, payload.data(), r->bytes) == 0);
      } else {
        std::vector<uint8_t> expect(r->bytes + 1);  // + 1: data() is never null
        r->reduce(expect.data(), r->src, payload.data(), r->bytes / r->elem_size);
        FUZZ_CHECK(std::memcmp(r->dst, expect.data(), r->bytes) == 0);
      }
      pos += sizeof(h) +
             (in_header ? 0 : (r->bytes + shm::kFifoAlign - 1) / shm::kFifoAlign * shm::kFifoAlign);
    }
  }
  return 0;
}
