// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/dispatch.cc
// Chooses the kernel table once, from the CPU's features and CHORUS_KERNELS; exposes the tables
// by name for tests and benchmarks.
#include <cctype>
#include <cstring>
#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "common/log.h"
#include "common/params.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// __builtin_cpu_supports also checks that the OS saves the YMM/ZMM state (XGETBV). F16C comes
// from CPUID (leaf 1, ECX), which clang's __builtin_cpu_supports does not know.
bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

const KernelTable& best_available() {
  if (const KernelTable* t = kernels_for("avx512")) return *t;
  if (const KernelTable* t = kernels_for("avx2")) return *t;
  return scalar_kernels();
}

}  // namespace

const KernelTable* kernels_for(std::string_view isa) {
  if (iequals(isa, "scalar")) return &scalar_kernels();
#if defined(__x86_64__)
  if (iequals(isa, "avx2")) return cpu_has_avx2() ? &avx2_kernels() : nullptr;
  if (iequals(isa, "avx512")) return cpu_has_avx512() ? &avx512_kernels() : nullptr;
#endif
  return nullptr;
}

const KernelTable& select_kernels(std::string_view requested) {
  if (requested.empty() || iequals(requested, "auto")) return best_available();
  if (const KernelTable* t = kernels_for(requested)) return *t;
  const KernelTable& fallback = best_available();
  CHORUS_WARN(kInit, "CHORUS_KERNELS={} is not supported by this CPU; using the {} kernels",
              requested, fallback.isa);
  return fallback;
}

const KernelTable& kernels() {
  static const KernelTable& table = []() -> const KernelTable& {
    const KernelTable& t = select_kernels(params::kKernels.get());
    CHORUS_INFO(kInit, "reduction kernels: {}", t.isa);
    return t;
  }();
  return table;
}

uint64_t stream_copy_min_bytes() {
  const int64_t threshold = params::kStreamCopyBytes.get();
  return threshold > 0 ? static_cast<uint64_t>(threshold) : UINT64_MAX;
}

void copy_to_output(void* dst, const void* src, size_t bytes) {
  if (bytes >= stream_copy_min_bytes()) {
    kernels().stream_copy(dst, src, bytes);
  } else if (bytes != 0) {
    std::memcpy(dst, src, bytes);
  }
}

ReduceFn reduce_for_output(ReduceFn fn, size_t bytes) {
  if (bytes < stream_copy_min_bytes()) return fn;
  const KernelTable& table = kernels();
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (int op = 0; op < kNumReduceOps; ++op) {
      if (table.reduce[t][op] == fn) return table.reduce_stream[t][op];
    }
  }
  return fn;
}

}  // namespace chorus::kernels
