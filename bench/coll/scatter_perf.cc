// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/scatter_perf.cc
// scatter_perf: nccl-tests' scatter_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kScatter, argc, argv);
}
