// SPDX-License-Identifier: Apache-2.0
// File: src/core/lifecycle.h
// How communicators come to be: from unique ids (init), from a parent (split, shrink), and how
// their connection setup runs (now, at the end of a group, or on a background thread for a
// non-blocking comm). The api layer validates arguments, registers handles and calls these.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "bootstrap/unique_id.h"
#include "common/status.h"
#include "core/comm.h"

namespace chorus {

// A communicator made but not connected: `connect` exchanges PeerInfo and connects it.
struct NewComm {
  std::shared_ptr<Comm> comm;      // null: this rank is in no child (NCCL_SPLIT_NOCOLOR)
  std::function<Status()> connect;
};

// A rank of a new communicator whose peers meet at the root(s) of `ids` (several ids: the
// scalable bootstrap).
NewComm make_comm(const std::vector<bootstrap::UniqueId>& ids, int rank, int nranks,
                  const CommConfig& cfg);

// ncclCommSplit: every rank of `parent` calls it with its colour (or NCCL_SPLIT_NOCOLOR) and
// key; ranks of one colour form a child ordered by (key, parent rank). Runs internal
// operations on the parent.
Result<NewComm> make_split_child(const std::shared_ptr<Comm>& parent, int color, int key,
                                 const CommConfig& cfg);

// ncclCommShrink: the parent ranks `members` (ascending) form a child without using the
// parent's connections (it may be broken): they meet at a rendezvous served by the lowest
// member on its parent's rendezvous listener, authenticated with a secret derived from the
// parent's. `ordinal` is the parent's next_child_ordinal(), taken when the call was made.
Result<NewComm> make_shrink_child(const std::shared_ptr<Comm>& parent,
                                  const std::vector<int>& members, uint32_t ordinal,
                                  const CommConfig& cfg);

// Runs `c.connect`: at once (blocking comm), when the enclosing group ends, or on a background
// thread (non-blocking comm: returns kInProgress; `key` names the thread for join_setup()). A
// failed setup poisons the comm and leaves it kFailed.
Status start_setup(const NewComm& c, const void* key);
// Waits for the background setup started under `key`, if any.
void join_setup(const void* key);

// The uid of a child communicator (equal on every rank that makes it).
uint64_t child_uid(uint64_t parent, uint32_t ordinal, int color);

}  // namespace chorus
