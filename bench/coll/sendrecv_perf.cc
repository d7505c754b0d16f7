// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/sendrecv_perf.cc
// sendrecv_perf: nccl-tests' sendrecv_perf for Chorus (see bench/README.md).
#include "bench/coll/common.h"

int main(int argc, char** argv) {
  return chorus::bench::perf_main(chorus::verify::Coll::kSendRecv, argc, argv);
}
