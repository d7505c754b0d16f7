// SPDX-License-Identifier: Apache-2.0
// File: src/core/internal_ops.h
// Exchanges Chorus runs over an existing communicator's connections: the allgather of
// variable-length records that ncclCommSplit and ncclCommShrink build new communicators with.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "core/comm.h"

namespace chorus {

// Every rank of `members` (ranks of comm, in the order that defines the result, this rank
// included) contributes `mine`; returns the records in members' order. Only the members call
// it; it runs as an internal operation on comm and blocks until done.
Result<std::vector<std::string>> allgather_records(Comm& comm, const std::vector<int>& members,
                                                   const std::string& mine);

}  // namespace chorus
