// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/alltoall_perf.cc
// alltoall_perf: nccl-tests' alltoall_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kAlltoAll, argc, argv);
}
