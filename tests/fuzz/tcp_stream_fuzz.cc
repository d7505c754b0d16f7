// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/tcp_stream_fuzz.cc
// The receive side of a TCP connection (transports/tcp/tcp_connection.cc) fed by a hostile
// peer: a real TcpConnection on one end of a socket pair posts receives described by the input,
// and the rest of the input is what the peer writes, in pieces, followed by EOF. This runs the
// 40-byte message header check (magic, tag, size against the posted receive), the plain and
// reducing (bounce buffer, partial elements) payload paths, and the peer's farewell. Input:
//   u8 receives (1 + n % 6) | u16 bounce bytes (64 + n % 1024) | u8 piece (1 + n % 255)
//   receive specs (fuzz_requests.h) | the stream: u32 magic 'CHMT' | u32 0 | MsgTag | u64 bytes
//   | payload, per message; or a farewell: u32 'CHFW' | u32 status code | MsgTag | u64 bytes
//   | reason text
// Invariants: a receive completes only with the bytes of a message whose header matched it,
// the connection fails (naming the peer) rather than accept anything else, and after a
// failure every request is finished.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "fuzz_requests.h"
#include "transports/tcp/tcp_connection.h"

using namespace chorus;
using chorus::fuzz::Input;

namespace {

// Where the first farewell of the stream starts and ends, walking it as the receiver does
// ({0, 0}: none). A peer sends a farewell's header and text in one sendmsg(), and the receiver,
// once it has the header, waits up to 200 ms for the text: the harness never stops writing
// inside one.
std::pair<size_t, size_t> find_farewell(std::string_view stream) {
  size_t pos = 0;
  while (pos + sizeof(tcp::WireHeader) <= stream.size()) {
    tcp::WireHeader h;
    std::memcpy(&h, stream.data() + pos, sizeof(h));
    if (h.magic == tcp::kFarewellMagic) {
      size_t end = pos + sizeof(h) + std::min<uint64_t>(h.bytes, kMaxFarewellBytes);
      return {pos, std::min(end, stream.size())};
    }
    if (h.bytes > stream.size()) break;
    pos += sizeof(h) + h.bytes;
  }
  return {0, 0};
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input input(data, size);
  size_t nrecv = 1 + input.u8() % 6;
  size_t bounce = 64 + input.u16() % 1024;
  size_t piece = 1 + input.u8() % 255;
  fuzz::Receives recvs;
  recvs.read(input, nrecv);
  std::string_view stream = input.rest();

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return 0;
  int peer_fd = sv[1];
  net::SockAddr addr;
  {
    tcp::TcpConnection conn(UniqueFd(sv[0]), /*my_rank=*/0, /*peer=*/1, /*channel=*/0, addr,
                            bounce);
    for (auto& r : recvs.reqs) conn.post_recv(r.get());
    const auto [farewell_start, farewell_end] = find_farewell(stream);
    size_t off = 0;
    bool shut = false;
    for (int iter = 0; iter < 100000; ++iter) {
      if (off < stream.size()) {
        size_t n = std::min(piece, stream.size() - off);
        if (off + n > farewell_start && off + n < farewell_end) n = farewell_end - off;
        off += fuzz::write_some(peer_fd, stream.substr(off, n));
      }
      if (off == stream.size() && !shut) {
        shutdown(peer_fd, SHUT_WR);  // EOF after the stream
        shut = true;
      }
      bool moved = conn.progress();
      if (!conn.error().ok() || recvs.all_done()) break;
      if (!moved && shut) {
        // Everything was written and nothing moves: the connection must be waiting on EOF,
        // which the next progress() sees.
        conn.progress();
        FUZZ_CHECK(!conn.error().ok() || recvs.all_done());
        break;
      }
    }
    if (!conn.error().ok()) {
      FUZZ_CHECK(!conn.error().message().empty());
      for (auto& r : recvs.reqs) FUZZ_CHECK(r->done());
    }
    // What completed holds exactly the payload of its message (combined with src when reducing).
    size_t pos = 0;
    for (auto& r : recvs.reqs) {
      if (!r->done() || r->failed()) break;
      FUZZ_CHECK(r->bytes_done.load() == r->bytes);
      FUZZ_CHECK(pos + sizeof(tcp::WireHeader) + r->bytes <= stream.size());
      tcp::WireHeader h;
      std::memcpy(&h, stream.data() + pos, sizeof(h));
      FUZZ_CHECK(h.magic == tcp::kWireMagic && h.tag == r->tag && h.bytes == r->bytes);
      const char* payload = stream.data() + pos + sizeof(h);
      if (r->reduce == nullptr) {
        FUZZ_CHECK(std::memcmp(r->dst, payload, r->bytes) == 0);
      } else {
        std::vector<uint8_t> expect(r->bytes + 1);  // + 1: data() is never null
        r->reduce(expect.data(), r->src, payload, r->bytes / r->elem_size);
        FUZZ_CHECK(std::memcmp(r->dst, expect.data(), r->bytes) == 0);
      }
      pos += sizeof(h) + r->bytes;
    }
  }
  close(peer_fd);
  return 0;
}
