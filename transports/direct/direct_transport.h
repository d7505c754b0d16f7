// SPDX-License-Identifier: Apache-2.0
// File: transports/direct/direct_transport.h
// Ranks that live in one process exchange data through direct pointers: the sender posts a
// descriptor of its buffer, and the receiver copies (or reduces) straight from the sender's
// memory into its own. One copy, no staging buffer, and the receive-side reduction reads both
// inputs in place. The sender's request completes when the receiver has consumed it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "transports/transport.h"

namespace chorus::direct {

class Inbox;

// A rank's endpoint in the process-wide registry, found by (comm uid, rank).
class DirectNode {
 public:
  DirectNode(uint64_t comm_uid, int rank) : comm_uid_(comm_uid), rank_(rank) {}
  ~DirectNode();
  DirectNode(const DirectNode&) = delete;
  DirectNode& operator=(const DirectNode&) = delete;

  uint64_t comm_uid() const { return comm_uid_; }
  int rank() const { return rank_; }
  // The queue of descriptors sent to this rank by `from` on `channel` (created on first use by
  // either side, so the two sides may connect in any order).
  std::shared_ptr<Inbox> inbox(int from, int channel);

 private:
  uint64_t comm_uid_;
  int rank_;
  struct Entry {
    int from, channel;
    std::shared_ptr<Inbox> inbox;
  };
  std::mutex mutex_;
  std::vector<Entry> inboxes_;
};

// Registers this rank so that the other ranks of its comm in this process can find it. The
// registration ends when the returned node is destroyed.
std::shared_ptr<DirectNode> register_node(uint64_t comm_uid, int rank);

struct DirectSetup {
  int rank = 0;
  uint64_t comm_uid = 0;
  int channels = 1;
  std::shared_ptr<DirectNode> node;  // ours, from register_node
  std::vector<int> peers;            // ranks of this comm in this process (not self)
  Deadline deadline = Deadline::never();
};

// One connection per peer and channel, indexed [i][channel] for setup.peers[i].
Result<std::vector<std::vector<std::unique_ptr<Connection>>>> connect_all(const DirectSetup& setup);

}  // namespace chorus::direct
