// SPDX-License-Identifier: Apache-2.0
// File: bench/micro/pin_cpu.h
// Shared by the micro benchmarks: pins the process to one CPU (--cpu=N; default: the one it
// starts on; --cpu=-1: no pinning), so that a measurement does not migrate between cores and
// caches. Call after benchmark::Initialize (which removes the --benchmark_* flags it knows).
#pragma once

#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace chorus::bench {

inline void pin_cpu(int argc, char** argv, const char* program) {
  int cpu = sched_getcpu();
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--cpu=", 6) == 0) cpu = std::atoi(argv[i] + 6);
  }
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::fprintf(stderr, "%s: cannot pin to CPU %d; running unpinned\n", program, cpu);
  }
}

}  // namespace chorus::bench
