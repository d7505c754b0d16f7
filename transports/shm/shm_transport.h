// SPDX-License-Identifier: Apache-2.0
// File: transports/shm/shm_transport.h
// Shared-memory transport between ranks of one host: each rank owns a memfd segment holding its
// incoming FIFOs, which its local peers map through /proc/<pid>/fd/<fd>. README.md has details.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/params.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "transports/transport.h"

namespace chorus::shm {

// This rank's incoming-FIFO segment: an anonymous memfd (mode 0600, close-on-exec), created
// empty so that its fd number can be published before the set of local ranks is known. It has
// no name in /dev/shm: the kernel frees it when the last fd and mapping are gone, crash or not.
// Keep it alive as long as peers may still open it (the comm's lifetime).
class ShmSegment {
 public:
  static Result<std::unique_ptr<ShmSegment>> create();

  // The fd peers open as /proc/<our pid>/fd/<fd()>.
  int fd() const { return fd_.get(); }

  // Sizes the segment to `bytes`, seals its size (a peer's mapping can never lose its pages,
  // so never faults with SIGBUS) and maps it. Once only; connect_all() calls it.
  Result<std::shared_ptr<Mapping>> size_and_map(size_t bytes);

 private:
  explicit ShmSegment(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  bool sized_ = false;
};

// What a local peer publishes through the bootstrap.
struct ShmPeer {
  int rank = -1;
  int pid = -1;
  int shm_fd = -1;       // its ShmSegment::fd()
  int doorbell_fd = -1;  // its ProcessContext::doorbell_fd()
};

struct ShmSetup {
  int rank = -1;
  int channels = 1;  // 1..64; equal on every rank
  // Ring bytes of each FIFO, a multiple of 64 and at least 4 KiB; equal on every rank.
  // 0: params::kShmFifoBytes rounded down to a multiple of 64.
  size_t fifo_bytes = 0;
  ShmSegment* segment = nullptr;  // ours, not yet sized
  // Every rank (self included) that talks shm with the others on this host, sorted ascending
  // and identical on all of them: positions in it are the local indices.
  std::vector<int> local_ranks;
  std::vector<ShmPeer> peers;  // every rank of local_ranks except self, any order
  Deadline deadline = Deadline::after_ms(params::kConnectTimeoutMs.get());
};

using ShmConnections = std::vector<std::vector<std::unique_ptr<Connection>>>;

// Sizes our segment, maps each peer's segment and process doorbell, and returns connections
// indexed [i][channel] where i indexes setup.peers. Blocks until every peer has sized its own
// segment, or until setup.deadline (a remote error naming the peer). Every local rank must
// call it, concurrently. Thread-safe across distinct setups. The connections keep the mappings
// they use alive; each mapping goes when the last connection using it is destroyed.
//
// Errors: kInvalidArgument for a malformed setup, kInvalidUsage when the ranks disagree on the
// layout (channels, FIFO bytes, local ranks), kSystemError / kRemoteError when a peer's segment
// cannot be opened, mapped or is not ready in time; each names the peer's rank and pid.
Result<ShmConnections> connect_all(const ShmSetup& setup);

// Bytes of one segment: the same on every local rank for the same layout.
size_t segment_bytes(size_t num_local_ranks, size_t channels, size_t fifo_bytes);

}  // namespace chorus::shm
