// SPDX-License-Identifier: Apache-2.0
#include "transports/protocol.h"

#include <fmt/format.h>

namespace chorus {

Status accept_incoming(RecvRequest* req, const MsgTag& tag, uint64_t bytes, int peer,
                       int my_rank) {
  if (!req->size_from_sender) {
    if (tag == req->tag && bytes == req->bytes) return Status();
    return invalid_usage("rank {} sent {} but rank {} expects {} from it", peer,
                         describe_message(tag, bytes), my_rank,
                         describe_message(req->tag, req->bytes));
  }
  MsgTag any_count = req->tag;
  any_count.count = tag.count;
  if (tag != any_count) {
    return invalid_usage("rank {} sent {} but rank {} expects {} (at most) from it", peer,
                         describe_message(tag, bytes), my_rank,
                         describe_message(req->tag, req->bytes));
  }
  if (bytes > req->bytes) {
    return invalid_usage("rank {} sent {} but rank {} has room for {} bytes", peer,
                         describe_message(tag, bytes), my_rank, req->bytes);
  }
  req->tag.count = tag.count;
  req->bytes = bytes;
  return Status();
}

Status check_reducing_receive(const RecvRequest& req, int peer) {
  if (req.reduce == nullptr) return Status();
  if (req.size_from_sender) {
    return invalid_usage("reducing receive of {} from rank {} must know its size",
                         describe_tag(req.tag), peer);
  }
  if (req.elem_size > 0 && req.bytes % req.elem_size == 0) return Status();
  return invalid_usage(
      "reducing receive of {} from rank {} is not a whole number of {}-byte elements",
      describe_message(req.tag, req.bytes), peer, req.elem_size);
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
