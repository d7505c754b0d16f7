// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/fuzz_requests.h
// Receive requests described by the fuzz input, for the transport targets: the receiver posts
// these, then reads whatever stream the (hostile) peer produced. Each is 27 bytes of input:
//   u8 flags   bit 0 reducing receive, bits 1-4 datatype (% 12), bits 5-6 operator
//   u16 bytes  message size (a reducing receive rounds it down to whole elements)
//   MsgTag     24 bytes, as on the wire
// Destination (and, for reductions, source) buffers are exactly the message size, so that the
// address sanitizer catches any write past them.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "fuzz_common.h"
#include "kernels/reduce/reduce.h"
#include "transports/transport.h"

namespace chorus::fuzz {

inline constexpr size_t kRecvSpecBytes = 27;

struct Receives {
  std::vector<std::unique_ptr<RecvRequest>> reqs;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;

  uint8_t* buffer(size_t bytes, uint8_t fill) {
    buffers.push_back(std::make_unique<uint8_t[]>(bytes == 0 ? 1 : bytes));
    std::memset(buffers.back().get(), fill, bytes);
    return buffers.back().get();
  }

  void read(Input& input, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      uint8_t flags = input.u8();
      size_t bytes = input.u16();
      auto req = std::make_unique<RecvRequest>();
      std::string_view tag = input.bytes(sizeof(MsgTag));
      std::memcpy(&req->tag, tag.data(), tag.size());
      if (flags & 1) {
        auto dtype = static_cast<DataType>(((flags >> 1) & 15) % kNumDataTypes);
        auto op = static_cast<kernels::ReduceOp>((flags >> 5) & 3);
        req->elem_size = datatype_size(dtype);
        bytes -= bytes % req->elem_size;
        req->reduce = kernels::reduce_fn(dtype, op);
        req->src = buffer(bytes, 0x11);
      }
      req->bytes = bytes;
      req->dst = buffer(bytes, 0x22);
      reqs.push_back(std::move(req));
    }
  }

  bool all_done() const {
    for (const auto& r : reqs)
      if (!r->done()) return false;
    return true;
  }
};

// A seed's receive spec (the generator's side of Receives::read).
inline void put_recv_spec(std::string* out, uint8_t flags, uint16_t bytes, const MsgTag& tag) {
  put_le(out, flags, 1);
  put_le(out, bytes, 2);
  out->append(reinterpret_cast<const char*>(&tag), sizeof(tag));
}

}  // namespace chorus::fuzz
