// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/gather_perf.cc
// gather_perf: nccl-tests' gather_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kGather, argc, argv);
}
