// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/reduce_perf.cc
// reduce_perf: nccl-tests' reduce_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kReduce, argc, argv);
}
