// SPDX-License-Identifier: Apache-2.0
#include "transports/protocol.h"

#include <fmt/format.h>

namespace chorus {

Status check_incoming(const RecvRequest& req, const MsgTag& tag, uint64_t bytes, int peer,
                      int my_rank) {
  if (tag == req.tag && bytes == req.bytes) return Status();
  return invalid_usage("rank {} sent {} ({} bytes) but rank {} expects {} ({} bytes) from it", peer,
                       describe_tag(tag), bytes, my_rank, describe_tag(req.tag), req.bytes);
}

Status check_reducing_receive(const RecvRequest& req, int peer) {
  if (req.reduce == nullptr || (req.elem_size > 0 && req.bytes % req.elem_size == 0))
    return Status();
  return invalid_usage(
      "reducing receive of {} ({} bytes) from rank {} is not a whole number of {}-byte elements",
      describe_tag(req.tag), req.bytes, peer, req.elem_size);
}

Code farewell_code(uint32_t wire) {
  auto code = static_cast<Code>(wire);
  return code == Code::kInvalidUsage || code == Code::kInvalidArgument ? code : Code::kRemoteError;
}

std::string describe_request(const Request* req) {
  if (req == nullptr) return "nothing";
  return fmt::format("{} ({} of {} bytes)", describe_tag(req->tag),
                     req->bytes_done.load(std::memory_order_relaxed), req->bytes);
}

}  // namespace chorus
