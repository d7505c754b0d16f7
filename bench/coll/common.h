// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/common.h
// The whole of a *_perf tool behind its one-line main: parse the command line, join the
// processes of the job, run this process's ranks as threads, and return the exit status.
#pragma once

#include "bench/common/verifiable.h"

namespace chorus::bench {

// Runs the nccl-tests-compatible benchmark of `coll`. Returns the process exit status: 0 when
// every check passed, 1 on wrong results, errors or timeout, 2 for a bad command line.
int perf_main(verify::Coll coll, int argc, char** argv);

}  // namespace chorus::bench
