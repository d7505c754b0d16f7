// SPDX-License-Identifier: Apache-2.0
// File: tests/support/compress_check.h
// The compressed collectives (include/chorus/compress.h) as data-parallel training uses them:
// random non-integer data of mixed magnitudes, different on every rank and known to every rank
// (each rank regenerates the others' inputs from the seed), so each rank checks its own output
// against an fp64 reference within the analytic bound of the quantizations the algorithm makes,
// and AllReduce / AllGather outputs are compared bit for bit across ranks. Only the public API is
// used, so the same checks run on ranks in threads and in processes.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>

namespace chorus::test {

// Every compressed collective x datatype (fp32, bf16, fp16) x op (sum, avg, max, min) x codec
// (e4m3 / e5m2, fp32 / UE8M0 scales, block 128 / 32 / 1, nearest-even / stochastic) x count
// (short last block, several pipelined pieces), in place and not. `large`: include counts of
// several pieces per shard. Returns "" or what failed (a few lines).
std::string check_compressed_matrix(ncclComm_t comm, uint64_t seed, bool large);

// The byte counters of compressed AllReduce, ReduceScatter and AllGather of fp32: wire bytes
// at most 26 % of the data bytes with fp32 scales, 25.2 % with UE8M0 (block 128), on every
// peer; plain calls count wire == data.
std::string check_compressed_volume(ncclComm_t comm);

// A block holding an Inf or NaN on one rank decodes to NaN on every rank; other blocks stay
// finite.
std::string check_compressed_nonfinite(ncclComm_t comm);

// Error feedback: the same gradient AllReduced for several steps through a compressor with error
// feedback averages out to the exact sum much closer than without it; the residual is bound to
// its tensor (another count: ncclInvalidUsage) until chorusCompressorReset.
std::string check_error_feedback(ncclComm_t comm);

}  // namespace chorus::test
