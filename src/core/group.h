// SPDX-License-Identifier: Apache-2.0
// File: src/core/group.h
// ncclGroupStart/End. Calls made inside a group are collected per thread and launched together
// at the outermost ncclGroupEnd: communicator initialisations first (concurrently), then the
// operations — each collective as one operation, and all sends and receives of one comm as one
// batch, posted at once so that any order of matching calls completes.
#pragma once

#include <functional>
#include <memory>

#include "common/status.h"
#include "core/comm.h"
#include "core/op.h"
#include "core/stream.h"

namespace chorus {

bool in_group();
Status group_start();
// Launches the group; with NULL streams returns when its operations are complete. Returns the
// first error, or kInProgress when operations of non-blocking comms are still running.
Status group_end();
// Ends the group without running it; estimates its duration (microseconds).
Status group_simulate_end(float* estimated_us);

// A validated call: queued in the current group, or launched at once (a group of one).
Status submit_call(const std::shared_ptr<Comm>& comm, const CollCall& call, Stream* stream);
// Records that a call inside the current group failed: the group will not be launched and
// ncclGroupEnd reports the error. No-op outside a group.
void group_fail(const Status& status);
// Communicator initialisation work: deferred to the group's end, or run now. At the group's
// end the jobs run concurrently, except those with the same non-null order_key (the parent of
// a split), which run one after another in call order.
Status submit_init(std::function<Status()> job, const void* order_key = nullptr);

// Inside a group: the batch of sends and receives that the group launches on `comm` calls
// `watch` as its receives arrive (Op::recv_watch), so that a module can use what arrived while
// the rest travels (the EP module's combine sums the tokens whose rows are in). The batch
// waits for its receives first, in posting order, then its sends. When the batch has no
// receive (or the group launches nothing on `comm`), `watch` is never called.
Status group_watch_receives(Comm* comm, std::function<void(size_t arrived)> watch);

// Queues ops built outside a group (internal operations) and waits for them.
Status run_and_wait(const std::vector<std::shared_ptr<Op>>& ops, const std::vector<Comm*>& comms);

}  // namespace chorus
