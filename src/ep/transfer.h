// SPDX-License-Identifier: Apache-2.0
// File: src/ep/transfer.h
// The one place where EP tokens move between ranks: every dispatch and combine hands its
// messages to exchange(). This slice posts them as one group of ncclSend/ncclRecv on the
// buffer's communicator; a later path (one-copy mapped peers, RDMA WRITE) replaces this file.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <vector>

#include "common/status.h"

namespace chorus::ep {

struct SendMsg {
  int peer;
  const void* data;
  size_t bytes;
};
struct RecvMsg {
  int peer;
  void* data;
  size_t bytes;
};

// A failed call of the public API, with the calling thread's last error text.
Status from_nccl(ncclResult_t r, const char* what);

// Sends every message of `sends` to its peer and receives every message of `recvs` from its
// peer; messages between the same pair of ranks match in the order given. Zero-byte messages
// are skipped (both sides agree on them: the sizes come from the count exchange). A rank's
// messages to itself are copied. Blocking; every rank calls it in the same collective step.
Status exchange(ncclComm_t comm, int rank, const std::vector<SendMsg>& sends,
                const std::vector<RecvMsg>& recvs);

}  // namespace chorus::ep
