// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/wire.h
// The bootstrap wire format (internal): little-endian integer codecs, framed messages and the
// payloads exchanged between ranks and root servers. Every frame is
//   u32 magic 'CHBF' | u32 type | u32 length | payload[length]   (length <= kMaxPayloadBytes)
// and the length is checked before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/auth.h"
#include "net/socket.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/status.h"

namespace chorus::bootstrap {
using net::auth_initiator;
using net::auth_responder;
using net::Handshake;
using net::Secret;
}  // namespace chorus::bootstrap

namespace chorus::bootstrap::wire {

using le::get_u16;
using le::get_u32;
using le::get_u64;
using le::put_u16;
using le::put_u32;
using le::put_u64;

// Appends little-endian fields to a byte string.
class Writer {
 public:
  void u16(uint16_t v);
  void u32(uint32_t v);
  void u64(uint64_t v);
  void bytes(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what Writer wrote. A read past the end returns zeros and makes ok() false for good.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  uint16_t u16();
  uint32_t u32();
  uint64_t u64();
  void bytes(void* out, size_t n);
  // `n` bytes as a view into the input (empty if short).
  std::string_view view(size_t n);
  bool ok() const { return ok_; }
  size_t remaining() const { return in_.size(); }

 private:
  const uint8_t* take(size_t n);
  std::string_view in_;
  bool ok_ = true;
};

// An address as 24 bytes: u16 family (4 or 6), u16 port, 16 bytes address, u32 IPv6 scope.
inline constexpr size_t kAddrBytes = 24;
void put_addr(Writer& w, const net::SockAddr& addr);
// Empty SockAddr (family AF_UNSPEC) when the bytes do not describe an address.
net::SockAddr get_addr(Reader& r);

// ---- Frames ---------------------------------------------------------------------------------

inline constexpr uint32_t kFrameMagic = 0x43484246;  // "CHBF"
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 12;
inline constexpr size_t kMaxBlobBytes = size_t{1} << 20;
inline constexpr size_t kMaxPayloadBytes = kMaxBlobBytes + 256;
inline constexpr size_t kMaxErrorBytes = 2048;

enum class FrameType : uint32_t {
  kHello = 1,     // rank -> root: Hello
  kForward = 2,   // group root -> root 0: Forward, then Forward::count kEntry frames
  kEntry = 3,     // one rank's blob: u32 rank, u32 length, bytes
  kTable = 4,     // root -> rank / group root: u32 nranks, then nranks kEntry frames
  kProgress = 5,  // root -> rank: u32 joined, u32 nranks
  kError = 6,     // root -> rank: text; the root then closes
};
inline constexpr uint32_t kMaxFrameType = 6;

struct FrameHeader {
  uint32_t magic = 0;
  FrameType type = FrameType::kError;
  uint32_t length = 0;
};

std::string_view frame_type_name(FrameType type);

// Appends header + payload to `out`.
void append_frame(std::string* out, FrameType type, std::string_view payload);
// Checks magic, type and length (before anything is allocated).
Status parse_header(const uint8_t* in, FrameHeader* out);

// Reads one frame at a time from a non-blocking socket. Not thread-safe.
class FrameReader {
 public:
  // Reads what is available without blocking. True once a whole frame is buffered; header() and
  // payload() then stay valid until next(). Errors: bad header, EOF, socket errors.
  Result<bool> read(int fd);
  const FrameHeader& header() const { return header_; }
  std::string_view payload() const { return payload_; }
  void next();

 private:
  uint8_t hdr_[kHeaderBytes] = {};
  size_t hdr_got_ = 0;
  FrameHeader header_;
  std::string payload_;
  size_t payload_got_ = 0;
  bool complete_ = false;
};

// Blocking forms, bounded by `deadline` (errors as net::send_all / net::recv_all).
Status write_frame(int fd, FrameType type, std::string_view payload, Deadline deadline);
Status read_frame(int fd, Deadline deadline, FrameHeader* header, std::string* payload);

// ---- Payloads -------------------------------------------------------------------------------

struct Hello {
  int32_t rank = -1;
  int32_t nranks = 0;
  uint64_t comm_uid = 0;  // the uid of the id this rank contacts
  uint32_t nroots = 1;    // > 1: ncclCommInitRankScalable
  uint32_t group = 0;     // rank * nroots / nranks
  // nroots > 1 only: root 0 and its secret, XOR-wrapped with a key derived from the
  // connection's session key (see wrap_secret), so it never crosses the network in clear.
  net::SockAddr root0;
  uint64_t root0_uid = 0;
  Secret root0_secret_wrapped;
  std::string_view blob;
};
std::string encode_hello(const Hello& hello);
Status decode_hello(std::string_view payload, Hello* out);  // out->blob views `payload`

// XOR with HMAC(session_key, "chorus-wrap-root0"): a one-time pad, as the key is fresh per
// connection. Its own inverse.
Secret wrap_secret(const Secret& secret, const Secret& session_key);

struct Forward {
  uint32_t nranks = 0;
  uint32_t nroots = 0;
  uint32_t group = 0;
  uint64_t comm_uid = 0;  // root 0's uid
  uint32_t count = 0;     // kEntry frames that follow
};
std::string encode_forward(const Forward& f);
Status decode_forward(std::string_view payload, Forward* out);

std::string encode_entry(uint32_t rank, std::string_view blob);
Status decode_entry(std::string_view payload, uint32_t* rank, std::string_view* blob);

std::string encode_pair(uint32_t a, uint32_t b);  // kProgress
Status decode_pair(std::string_view payload, uint32_t* a, uint32_t* b);

// Which of `nroots` groups a rank belongs to (ncclCommInitRankScalable).
inline uint32_t group_of(int64_t rank, int64_t nranks, int64_t nroots) {
  return static_cast<uint32_t>(rank * nroots / nranks);
}
// The first rank of group `group` (ranks first(g) .. first(g + 1) - 1 form group g).
inline int64_t group_first(int64_t group, int64_t nranks, int64_t nroots) {
  return (group * nranks + nroots - 1) / nroots;
}

}  // namespace chorus::bootstrap::wire
