// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/broadcast_perf.cc
// broadcast_perf: nccl-tests' broadcast_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kBroadcast, argc, argv);
}
