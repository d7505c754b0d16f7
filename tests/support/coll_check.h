// SPDX-License-Identifier: Apache-2.0
// File: tests/support/coll_check.h
// Runs one collective on one rank with generated inputs and checks its output exactly, as
// nccl-tests does, with the generator of bench/common/verifiable.h. Only nccl.h and
// chorus/stream.h are used, so the same code checks ranks in threads and in processes.
#pragma once

#include <chorus/stream.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "bench/common/verifiable.h"

namespace chorus::test {

// The collectives, their names and the generator live in bench/common/verifiable.h, shared
// with the benchmarks.
using verify::Coll;
using verify::coll_name;
using verify::coll_reduces;
using verify::coll_rooted;

// 0..4: the built-in ncclRedOp_t; 5: a PreMulSum with scalar 1 on even and 2 on odd ranks.
inline constexpr int kPreMulSum = verify::kPreMulSum;
inline constexpr int kNumTestOps = verify::kNumOps;
const char* op_name(int op);

struct Case {
  Coll coll = Coll::kAllReduce;
  ncclDataType_t dtype = ncclFloat;
  int op = 0;
  size_t count = 0;
  int root = 0;
  bool in_place = false;
  cudaStream_t stream = nullptr;
  std::string describe() const;
};

// Runs `c` on this rank and checks the result. Returns "" on success, else what was wrong
// (the call's ncclResult_t and ncclGetLastError, or the first mismatching elements).
std::string run_case(ncclComm_t comm, const Case& c);

// Every datatype (only those named in CHORUS_TEST_DATATYPES, e.g. "int8,float", when set),
// and the counts of the test matrix.
std::vector<ncclDataType_t> all_datatypes();
std::vector<size_t> matrix_counts();

}  // namespace chorus::test
