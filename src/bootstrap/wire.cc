// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/wire.cc
// Bootstrap frame and payload codecs (see wire.h).
#include "bootstrap/wire.h"

#include <netinet/in.h>

#include <cstring>

namespace chorus::bootstrap::wire {

void Writer::u16(uint16_t v) {
  uint8_t b[2];
  put_u16(b, v);
  bytes(b, 2);
}
void Writer::u32(uint32_t v) {
  uint8_t b[4];
  put_u32(b, v);
  bytes(b, 4);
}
void Writer::u64(uint64_t v) {
  uint8_t b[8];
  put_u64(b, v);
  bytes(b, 8);
}

const uint8_t* Reader::take(size_t n) {
  if (!ok_ || in_.size() < n) {
    ok_ = false;
    return nullptr;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(in_.data());
  in_.remove_prefix(n);
  return p;
}
uint16_t Reader::u16() {
  const uint8_t* p = take(2);
  return p ? get_u16(p) : 0;
}
uint32_t Reader::u32() {
  const uint8_t* p = take(4);
  return p ? get_u32(p) : 0;
}
uint64_t Reader::u64() {
  const uint8_t* p = take(8);
  return p ? get_u64(p) : 0;
}
void Reader::bytes(void* out, size_t n) {
  const uint8_t* p = take(n);
  if (p)
    std::memcpy(out, p, n);
  else
    std::memset(out, 0, n);
}
std::string_view Reader::view(size_t n) {
  const uint8_t* p = take(n);
  return p ? std::string_view(reinterpret_cast<const char*>(p), n) : std::string_view();
}

void put_addr(Writer& w, const net::SockAddr& addr) {
  uint8_t ip[16] = {};
  uint32_t scope = 0;
  uint16_t family = 0;
  if (addr.family() == AF_INET) {
    family = 4;
    std::memcpy(ip, &reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_addr, 4);
  } else if (addr.family() == AF_INET6) {
    family = 6;
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr.storage);
    std::memcpy(ip, &in6->sin6_addr, 16);
    scope = in6->sin6_scope_id;
  }
  w.u16(family);
  w.u16(addr.port());
  w.bytes(ip, 16);
  w.u32(scope);
}

net::SockAddr get_addr(Reader& r) {
  uint16_t family = r.u16();
  uint16_t port = r.u16();
  uint8_t ip[16];
  r.bytes(ip, 16);
  uint32_t scope = r.u32();
  net::SockAddr out;
  if (family == 4) {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&out.storage);
    in4->sin_family = AF_INET;
    std::memcpy(&in4->sin_addr, ip, 4);
    out.len = sizeof(sockaddr_in);
  } else if (family == 6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, ip, 16);
    in6->sin6_scope_id = scope;
    out.len = sizeof(sockaddr_in6);
  }
  out.set_port(port);
  return out;
}

// ---- Frames ---------------------------------------------------------------------------------

std::string_view frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kForward:
      return "FORWARD";
    case FrameType::kEntry:
      return "ENTRY";
    case FrameType::kTable:
      return "TABLE";
    case FrameType::kProgress:
      return "PROGRESS";
    case FrameType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

void append_frame(std::string* out, FrameType type, std::string_view payload) {
  uint8_t hdr[kHeaderBytes];
  put_u32(hdr, kFrameMagic);
  put_u32(hdr + 4, static_cast<uint32_t>(type));
  put_u32(hdr + 8, static_cast<uint32_t>(payload.size()));
  out->append(reinterpret_cast<const char*>(hdr), kHeaderBytes);
  out->append(payload);
}

Status parse_header(const uint8_t* in, FrameHeader* out) {
  out->magic = get_u32(in);
  uint32_t type = get_u32(in + 4);
  out->length = get_u32(in + 8);
  if (out->magic != kFrameMagic) {
    return remote_error("bad frame magic 0x{:08x} (expected 0x{:08x})", out->magic, kFrameMagic);
  }
  if (type == 0 || type > kMaxFrameType) return remote_error("unknown frame type {}", type);
  out->type = static_cast<FrameType>(type);
  if (out->length > kMaxPayloadBytes) {
    return remote_error("{} frame of {} bytes exceeds the limit of {} bytes",
                        frame_type_name(out->type), out->length, kMaxPayloadBytes);
  }
  return ok_status();
}

Result<bool> FrameReader::read(int fd) {
  if (complete_) return true;
  while (hdr_got_ < kHeaderBytes) {
    CHORUS_ASSIGN_OR_RETURN(size_t n, net::recv_some(fd, hdr_ + hdr_got_, kHeaderBytes - hdr_got_));
    if (n == 0) return false;
    hdr_got_ += n;
    if (hdr_got_ == kHeaderBytes) {
      CHORUS_RETURN_IF_ERROR(parse_header(hdr_, &header_));
      payload_.resize(header_.length);
      payload_got_ = 0;
    }
  }
  while (payload_got_ < payload_.size()) {
    CHORUS_ASSIGN_OR_RETURN(size_t n, net::recv_some(fd, payload_.data() + payload_got_,
                                                     payload_.size() - payload_got_));
    if (n == 0) return false;
    payload_got_ += n;
  }
  complete_ = true;
  return true;
}

void FrameReader::next() {
  hdr_got_ = 0;
  payload_got_ = 0;
  payload_.clear();
  complete_ = false;
}

Status write_frame(int fd, FrameType type, std::string_view payload, Deadline deadline) {
  std::string frame;
  frame.reserve(kHeaderBytes + payload.size());
  append_frame(&frame, type, payload);
  return net::send_all(fd, frame.data(), frame.size(), deadline);
}

Status read_frame(int fd, Deadline deadline, FrameHeader* header, std::string* payload) {
  uint8_t hdr[kHeaderBytes];
  CHORUS_RETURN_IF_ERROR(net::recv_all(fd, hdr, kHeaderBytes, deadline));
  CHORUS_RETURN_IF_ERROR(parse_header(hdr, header));
  payload->resize(header->length);
  return net::recv_all(fd, payload->data(), payload->size(), deadline);
}

// ---- Payloads -------------------------------------------------------------------------------

std::string encode_hello(const Hello& h) {
  Writer w;
  w.u32(kProtocolVersion);
  w.u32(static_cast<uint32_t>(h.rank));
  w.u32(static_cast<uint32_t>(h.nranks));
  w.u64(h.comm_uid);
  w.u32(h.nroots);
  w.u32(h.group);
  if (h.nroots > 1) {
    put_addr(w, h.root0);
    w.u64(h.root0_uid);
    w.bytes(h.root0_secret_wrapped.bytes.data(), 32);
  }
  w.u32(static_cast<uint32_t>(h.blob.size()));
  w.bytes(h.blob.data(), h.blob.size());
  return w.take();
}

Status decode_hello(std::string_view payload, Hello* out) {
  Reader r(payload);
  uint32_t version = r.u32();
  out->rank = static_cast<int32_t>(r.u32());
  out->nranks = static_cast<int32_t>(r.u32());
  out->comm_uid = r.u64();
  out->nroots = r.u32();
  out->group = r.u32();
  if (r.ok() && version != kProtocolVersion) {
    return remote_error("HELLO of protocol version {} (this root speaks {})", version,
                        kProtocolVersion);
  }
  if (out->nroots > 1) {
    out->root0 = get_addr(r);
    out->root0_uid = r.u64();
    r.bytes(out->root0_secret_wrapped.bytes.data(), 32);
  }
  uint32_t blob_len = r.u32();
  out->blob = r.view(blob_len);
  if (!r.ok() || r.remaining() != 0)
    return remote_error("malformed HELLO ({} bytes)", payload.size());
  if (blob_len > kMaxBlobBytes) return remote_error("HELLO blob of {} bytes", blob_len);
  return ok_status();
}

Secret wrap_secret(const Secret& secret, const Secret& session_key) {
  Secret pad = session_key.derive("chorus-wrap-root0");
  for (size_t i = 0; i < pad.bytes.size(); ++i) pad.bytes[i] ^= secret.bytes[i];
  return pad;
}

std::string encode_forward(const Forward& f) {
  Writer w;
  w.u32(kProtocolVersion);
  w.u32(f.nranks);
  w.u32(f.nroots);
  w.u32(f.group);
  w.u64(f.comm_uid);
  w.u32(f.count);
  return w.take();
}

Status decode_forward(std::string_view payload, Forward* out) {
  Reader r(payload);
  uint32_t version = r.u32();
  out->nranks = r.u32();
  out->nroots = r.u32();
  out->group = r.u32();
  out->comm_uid = r.u64();
  out->count = r.u32();
  if (!r.ok() || r.remaining() != 0)
    return remote_error("malformed FORWARD ({} bytes)", payload.size());
  if (version != kProtocolVersion) return remote_error("FORWARD of protocol version {}", version);
  return ok_status();
}

std::string encode_entry(uint32_t rank, std::string_view blob) {
  Writer w;
  w.u32(rank);
  w.u32(static_cast<uint32_t>(blob.size()));
  w.bytes(blob.data(), blob.size());
  return w.take();
}

Status decode_entry(std::string_view payload, uint32_t* rank, std::string_view* blob) {
  Reader r(payload);
  *rank = r.u32();
  uint32_t len = r.u32();
  *blob = r.view(len);
  if (!r.ok() || r.remaining() != 0 || len > kMaxBlobBytes) {
    return remote_error("malformed ENTRY ({} bytes)", payload.size());
  }
  return ok_status();
}

std::string encode_pair(uint32_t a, uint32_t b) {
  Writer w;
  w.u32(a);
  w.u32(b);
  return w.take();
}

Status decode_pair(std::string_view payload, uint32_t* a, uint32_t* b) {
  Reader r(payload);
  *a = r.u32();
  *b = r.u32();
  if (!r.ok() || r.remaining() != 0)
    return remote_error("malformed frame ({} bytes)", payload.size());
  return ok_status();
}

}  // namespace chorus::bootstrap::wire
