// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/all_gather_perf.cc
// all_gather_perf: nccl-tests' all_gather_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kAllGather, argc, argv);
}
