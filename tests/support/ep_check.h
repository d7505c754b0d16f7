// SPDX-License-Identifier: Apache-2.0
// File: tests/support/ep_check.h
// MoE dispatch and combine (include/chorus/ep.h) checked on one rank of a communicator. Every
// rank's inputs (token counts, tokens, routing, weights) are regenerated from a seed and the rank
// number, so each rank computes independently what it must receive from every other rank and
// what its combine must give back, and compares its own outputs: received rows bit for bit,
// local expert indices, weights, counts per expert, and the combined weighted sum of expert
// outputs bit for bit (both sides add in float in a fixed order). Only the public API is used,
// so the same checks run on ranks in threads and in processes.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>

namespace chorus::test {

// Every routing (uniform, skewed, a hot expert in every token, tokens with fewer than topk
// experts, ranks that receive nothing and a rank with no tokens) x dispatch datatype (FP32,
// BF16, FP8 E4M3 with scales) with varied hidden sizes, topk, expert alignment, layout given or
// not; each case dispatches, runs an "expert" on what arrived, combines, and checks. Also two
// handles alive at once, a handle combined twice, combine without weights. Returns "" or what
// failed.
std::string check_ep_matrix(ncclComm_t comm, uint64_t seed);

// Asynchronous calls on a host stream run in its order: a dispatch reads x only after the work
// queued on the stream before it (a host function that writes x after a pause), returns the
// count of received tokens at once, and its outputs and the combine's are right once an event
// recorded after them completes.
std::string check_ep_async(ncclComm_t comm);

// Outputs allocated during the dispatch by chorusEpDispatchOutput_t's allocate callback, blocking
// and on a stream: a callback failing on one rank, or giving too few rows, refuses the call on
// every rank (ncclSystemError / ncclInvalidArgument there, ncclInvalidArgument naming it on the
// others), a rank refusing before the count exchange does not call it, and the next dispatch on
// the same buffer is right. (The matrix checks the callback's outputs against the reference.)
std::string check_ep_allocate(ncclComm_t comm);

// Bad input refused with ncclInvalidArgument on every rank (the culprit naming the token, slot
// or size hint, the others naming the culprit), and the communicator usable afterwards.
std::string check_ep_bad_input(ncclComm_t comm);

}  // namespace chorus::test
