// SPDX-License-Identifier: Apache-2.0
// File: tests/support/ep_ll_check.h
// MoE low-latency dispatch and combine (include/chorus/ep.h) checked on one rank of a
// communicator. As in ep_check.h, every rank's inputs are regenerated from a seed and the rank
// number, so each rank computes what each of its experts must receive, in which row, and what
// its combine must give back, using only the public API (threads and processes alike):
// received rows bit for bit (FP8: each scale against its definition, an all-zero block and one
// holding Inf included, and each decoded value within E4M3's bound of the original), counts and
// source info, and the weighted combine bit for bit against the documented float sum.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>

namespace chorus::test {

// Routings (uniform, skewed, a hot expert, -1 slots, ranks with 0 tokens) x BF16/FP32 tokens x
// no FP8 / FP8 with float scales / roundScale / UE8M0, combined in BF16 or FP32, blocking and
// with hooks. Returns "" or what failed.
std::string check_ep_ll_matrix(ncclComm_t comm, uint64_t seed);

// Two micro-batches in flight (dispatch A, dispatch B, hooks in either order; the same for
// combine), outputs untouched until the hook, a third call refused while both slots are taken,
// a normal-mode call refused with a hook pending, a handle combined before its hook refused.
std::string check_ep_ll_hooks(ncclComm_t comm, uint64_t seed);

// Where the dispatch messages and combine rows go, from the bytes the communicator sent
// (chorusCommGetByteCounters): with `mapped` (every rank on one host, mapping its peers: shared
// memory and CHORUS_EP_MAP not 0), a dispatch sends none of its messages and a combine none of
// its rows through the communicator (they are written into the peers' buffers); without, a
// dispatch sends its nranks - 1 messages of fixed size (ep.h, Cost) and a combine its rows for
// other ranks. And ranks whose hooks ran in different orders hold different slots: the next
// dispatch sends every message through the communicator in both cases, and every call's rows
// arrive.
std::string check_ep_ll_paths(ncclComm_t comm, uint64_t seed, bool mapped);

// Bad input refused with ncclInvalidArgument on every rank (the culprit naming the token, slot
// or size hint, the others naming the culprit), and the communicator usable afterwards.
std::string check_ep_ll_bad_input(ncclComm_t comm);

}  // namespace chorus::test
