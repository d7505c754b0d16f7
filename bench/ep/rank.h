// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/rank.h
// What ep_bench's modes share (ep_bench.cc runs normal mode, low_latency.cc the low-latency
// one): the options, one rank of the job, and how a failed call ends the run.
#pragma once

#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/ep/tokens.h"

namespace chorus::bench::ep {

enum class Mode { kNormal, kLowLatency };
inline const char* mode_name(Mode m) { return m == Mode::kLowLatency ? "ll" : "normal"; }
inline const char* dtype_name(ncclDataType_t t) { return t == ncclFloat8e4m3 ? "fp8" : "bf16"; }

struct Options {
  Mode mode = Mode::kNormal;
  Shape shape;  // dtype: see dtypes; tokens: 128 in low-latency mode unless given
  std::vector<ncclDataType_t> dtypes = {ncclBfloat16, ncclFloat8e4m3};
  int iters = 20;
  int warmup = 3;
  int nthreads = 1;
  uint64_t seed = 0;
};

// A failed call ends the whole job at once: chorus-run then stops the other processes, and
// the other rank threads of this one go with it.
[[noreturn]] inline void fail(int rank, const std::string& what) {
  std::fprintf(stderr, "ep_bench: rank %d: FAILED: %s\n", rank, what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}
inline void check(int rank, ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    fail(rank, fmt::format("{}: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr)));
}

// One rank of the job and what it shares with the others.
struct Rank {
  const Options& opt;
  ncclComm_t comm;
  int rank;
  int nranks;
  std::vector<int64_t> host;  // [nranks]: a hash of each rank's host name

  void barrier() {
    float one = 1.0f;
    check(rank, ncclAllReduce(&one, &one, 1, ncclFloat, ncclSum, comm, nullptr), "barrier");
  }
  template <typename T>
  void all_reduce(T* v, size_t count, ncclDataType_t t, ncclRedOp_t op) {
    check(rank, ncclAllReduce(v, v, count, t, op, comm, nullptr), "ncclAllReduce of results");
  }
};

// Seconds since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace chorus::bench::ep
