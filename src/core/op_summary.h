// SPDX-License-Identifier: Apache-2.0
// File: src/core/op_summary.h
// What the flight recorder keeps of an operation: the identities of its calls, not their text.
// Queuing an operation formats nothing; the text is built only when someone reads the record
// (formatting it per call took 16 % of an 8-byte AllReduce).
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "transports/transport.h"

namespace chorus {

struct OpSummary {
  static constexpr size_t kShownCalls = 8;  // calls of a send/receive group kept by name
  enum class Kind : unsigned char { kCollective, kP2p, kInternal, kHostFn };
  struct Call {
    MsgTag tag;
    int peer = -1;  // send/receive: the other rank
    bool send = false;
  };

  Kind kind = Kind::kCollective;
  std::string internal;  // kInternal: what it does
  std::array<Call, kShownCalls> calls{};
  size_t ncalls = 0, nsends = 0;
  size_t bytes = 0;

  // "AllReduce #12 (count 1024, float, sum)" or "group of 1 sends and 2 receives"; `detailed`
  // adds the peers of a send/receive group.
  std::string describe(bool detailed) const;
};

}  // namespace chorus
