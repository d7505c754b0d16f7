// SPDX-License-Identifier: Apache-2.0
// File: tests/support/coll_check.h
// Runs one collective on one rank with generated inputs and checks its output exactly, as
// nccl-tests does: inputs are small integers chosen per datatype and operator so that every
// partial result is exactly representable, whatever order the algorithm reduces in; the
// expected value of each output element is recomputed from the generator. Only nccl.h and
// chorus/stream.h are used, so the same code checks ranks in threads and in processes.
#pragma once

#include <chorus/stream.h>
#include <nccl.h>

#include <string>
#include <vector>

namespace chorus::test {

enum class Coll {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv,  // each rank sends to rank+1 and receives from rank-1, in one group
};
const char* coll_name(Coll c);
bool coll_reduces(Coll c);
bool coll_rooted(Coll c);

// 0..4: the built-in ncclRedOp_t; 5: a PreMulSum with scalar 1 on even and 2 on odd ranks.
inline constexpr int kPreMulSum = 5;
inline constexpr int kNumTestOps = 6;
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

// Every datatype, and the counts of the test matrix.
std::vector<ncclDataType_t> all_datatypes();
std::vector<size_t> matrix_counts();

}  // namespace chorus::test
