// SPDX-License-Identifier: Apache-2.0
// File: src/ep/transfer.cc
// Grouped point-to-point transfers of the EP layer (transfer.h).
#include "ep/transfer.h"

#include <fmt/format.h>

#include <cstring>

namespace chorus::ep {

Status from_nccl(ncclResult_t r, const char* what) {
  return Status(static_cast<Code>(r), fmt::format("{}: {}", what, ncclGetLastError(nullptr)))
      .mark_logged();
}

Status exchange(ncclComm_t comm, int rank, const std::vector<SendMsg>& sends,
                const std::vector<RecvMsg>& recvs) {
  // To itself: the i-th message sent matches the i-th received.
  std::vector<const SendMsg*> self_sends;
  std::vector<const RecvMsg*> self_recvs;
  for (const auto& s : sends)
    if (s.peer == rank && s.bytes > 0) self_sends.push_back(&s);
  for (const auto& r : recvs)
    if (r.peer == rank && r.bytes > 0) self_recvs.push_back(&r);
  if (self_sends.size() != self_recvs.size())
    return internal_error("ep exchange: {} messages to self but {} from self", self_sends.size(),
                          self_recvs.size());
  for (size_t i = 0; i < self_sends.size(); ++i) {
    if (self_sends[i]->bytes != self_recvs[i]->bytes)
      return internal_error("ep exchange: message {} to self of {} bytes, received as {}", i,
                            self_sends[i]->bytes, self_recvs[i]->bytes);
    std::memcpy(self_recvs[i]->data, self_sends[i]->data, self_sends[i]->bytes);
  }

  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return from_nccl(r, "ncclGroupStart");
  ncclResult_t posted = ncclSuccess;
  for (const auto& s : sends) {
    if (s.peer == rank || s.bytes == 0) continue;
    posted = ncclSend(s.data, s.bytes, ncclUint8, s.peer, comm, nullptr);
    if (posted != ncclSuccess) break;
  }
  for (const auto& m : recvs) {
    if (posted != ncclSuccess) break;
    if (m.peer == rank || m.bytes == 0) continue;
    posted = ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comm, nullptr);
  }
  // The group is closed whatever happened, so the communicator leaves group mode.
  Status post_error = posted == ncclSuccess ? Status() : from_nccl(posted, "ncclSend/ncclRecv");
  r = ncclGroupEnd();
  if (!post_error.ok()) return post_error;
  if (r != ncclSuccess) return from_nccl(r, "grouped ncclSend/ncclRecv of EP tokens");
  return Status();
}

}  // namespace chorus::ep
