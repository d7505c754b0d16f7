// SPDX-License-Identifier: Apache-2.0
// File: tests/support/identical_check.h
// AllReduce as data-parallel training uses it: random non-integer values of mixed magnitudes
// (x * 10^k, random sign, some signed zeros), different on every rank, in every float datatype
// and with every reduction. Every rank must end with bit-identical results (replicas that
// receive different gradients drift apart), and the result must be right to within the
// datatype's rounding against an fp64 reference. Only nccl.h is used, so the same check runs on
// ranks in threads and in processes.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::test {

// The float datatypes: fp32, fp64, fp16, bf16, fp8 e4m3, fp8 e5m2 (narrowed by
// CHORUS_TEST_DATATYPES like all_datatypes()).
std::vector<ncclDataType_t> float_datatypes();

// The AllReduce algorithm choices to check: "auto" (the tuner's) and each algorithm forced,
// as CHORUS_ALGO values.
const std::vector<std::string>& allreduce_algorithm_specs();

// On this rank of `comm` (every rank calls it at once, with the same arguments): for every
// float datatype, every operator (sum, prod, max, min, avg, a PreMulSum with a non-integer
// scalar that differs per rank) and every count (in place for the first count, out of place
// for the others), one AllReduce; then every rank's output is allgathered and compared bit for
// bit with this rank's, and this rank's output is compared with the fp64 reference. `seed`
// (and the environment variable CHORUS_TEST_SEED, when set) varies the data. Returns "" or
// what differed (at most a few lines).
std::string check_allreduce_identical(ncclComm_t comm, uint64_t seed = 1,
                                      const std::vector<size_t>& counts = {1001, 4096});

}  // namespace chorus::test
