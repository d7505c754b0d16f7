// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/bootstrap_wire_fuzz.cc
// The bootstrap wire format (src/bootstrap/wire.h) as a rank or a root receives it: the input is
// a byte stream of frames. Each frame header goes through parse_header() and each payload
// through the decoder of its type (HELLO, FORWARD, ENTRY, PROGRESS, TABLE); what decodes must
// survive encode -> decode unchanged. Then the same stream is read incrementally by
// FrameReader from a socket, as the root server does, and must yield the same frames.
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "bootstrap/wire.h"
#include "fuzz_common.h"

namespace wire = chorus::bootstrap::wire;
using chorus::fuzz::Input;

namespace {

void check_hello(std::string_view payload) {
  wire::Hello h;
  if (!wire::decode_hello(payload, &h).ok()) return;
  FUZZ_CHECK(h.blob.size() <= wire::kMaxBlobBytes);
  FUZZ_CHECK(h.blob.data() >= payload.data() &&
             h.blob.data() + h.blob.size() <= payload.data() + payload.size());
  std::string again = wire::encode_hello(h);
  wire::Hello h2;
  FUZZ_CHECK(wire::decode_hello(again, &h2).ok());
  FUZZ_CHECK(h2.rank == h.rank && h2.nranks == h.nranks && h2.comm_uid == h.comm_uid);
  FUZZ_CHECK(h2.nroots == h.nroots && h2.group == h.group && h2.blob == h.blob);
  if (h.nroots > 1) {
    FUZZ_CHECK(h2.root0 == h.root0 && h2.root0_uid == h.root0_uid);
    FUZZ_CHECK(h2.root0_secret_wrapped.bytes == h.root0_secret_wrapped.bytes);
  }
  // The wrap is its own inverse.
  chorus::net::Secret key;
  key.bytes[0] = 1;
  FUZZ_CHECK(wire::wrap_secret(wire::wrap_secret(h.root0_secret_wrapped, key), key).bytes ==
             h.root0_secret_wrapped.bytes);
}

void check_forward(std::string_view payload) {
  wire::Forward f;
  if (!wire::decode_forward(payload, &f).ok()) return;
  FUZZ_CHECK(wire::encode_forward(f) == payload);
}

void check_entry(std::string_view payload) {
  uint32_t rank = 0;
  std::string_view blob;
  if (!wire::decode_entry(payload, &rank, &blob).ok()) return;
  FUZZ_CHECK(blob.size() <= wire::kMaxBlobBytes);
  FUZZ_CHECK(wire::encode_entry(rank, blob) == payload);
}

void check_pair(std::string_view payload) {
  uint32_t a = 0, b = 0;
  if (!wire::decode_pair(payload, &a, &b).ok()) return;
  FUZZ_CHECK(wire::encode_pair(a, b) == payload);
}

void check_table(std::string_view payload) {
  wire::Reader r(payload);
  (void)r.u32();
  (void)r.ok();
}

struct Frame {
  wire::FrameType type;
  std::string payload;
};

// Parses the stream in memory; stops at the first bad header or truncated frame.
std::vector<Frame> parse_stream(std::string_view in) {
  std::vector<Frame> frames;
  while (in.size() >= wire::kHeaderBytes) {
    wire::FrameHeader h;
    if (!wire::parse_header(reinterpret_cast<const uint8_t*>(in.data()), &h).ok()) break;
    FUZZ_CHECK(h.length <= wire::kMaxPayloadBytes);
    FUZZ_CHECK(!wire::frame_type_name(h.type).empty());
    in.remove_prefix(wire::kHeaderBytes);
    if (in.size() < h.length) break;
    std::string_view payload = in.substr(0, h.length);
    in.remove_prefix(h.length);
    switch (h.type) {
      case wire::FrameType::kHello: check_hello(payload); break;
      case wire::FrameType::kForward: check_forward(payload); break;
      case wire::FrameType::kEntry: check_entry(payload); break;
      case wire::FrameType::kTable: check_table(payload); break;
      case wire::FrameType::kProgress: check_pair(payload); break;
      case wire::FrameType::kError: (void)payload.substr(0, wire::kMaxErrorBytes); break;
    }
    std::string again;
    wire::append_frame(&again, h.type, payload);
    wire::FrameHeader h2;
    FUZZ_CHECK(wire::parse_header(reinterpret_cast<const uint8_t*>(again.data()), &h2).ok());
    FUZZ_CHECK(h2.type == h.type && h2.length == h.length);
    frames.push_back(Frame{h.type, std::string(payload)});
  }
  return frames;
}

// The same stream through FrameReader over a socket, written in pieces of `step` bytes so that
// headers and payloads arrive split.
void read_incrementally(std::string_view in, size_t step, const std::vector<Frame>& expected) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return;
  wire::FrameReader reader;
  size_t got = 0;
  bool failed = false;
  size_t off = 0;
  bool shut = false;
  while (!failed) {
    if (off < in.size()) off += chorus::fuzz::write_some(sv[1], in.substr(off, step));
    if (off == in.size() && !shut) {
      shutdown(sv[1], SHUT_WR);  // then the reader sees the end of the stream
      shut = true;
    }
    for (;;) {
      auto r = reader.read(sv[0]);
      if (!r.ok()) {
        failed = true;  // a bad header or the end of the stream
        break;
      }
      if (!*r) break;  // needs more bytes
      FUZZ_CHECK(got < expected.size());
      FUZZ_CHECK(reader.header().type == expected[got].type);
      FUZZ_CHECK(reader.payload() == expected[got].payload);
      ++got;
      reader.next();
    }
  }
  FUZZ_CHECK(got == expected.size());
  close(sv[0]);
  close(sv[1]);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  size_t step = 1 + input.u8() % 64;
  std::string_view stream = input.rest();
  std::vector<Frame> frames = parse_stream(stream);
  read_incrementally(stream, step, frames);
  return 0;
}
