// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/reduce_scatter_perf.cc
// reduce_scatter_perf: nccl-tests' reduce_scatter_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kReduceScatter, argc, argv);
}
