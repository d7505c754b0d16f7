// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/reduce.h
// Element-wise reduction kernels for the 12 NCCL datatypes. fp16, bf16 and both fp8 formats are
// computed in fp32 and rounded back (nearest even) once per call. Integer sum and product wrap
// around (two's complement), as NCCL's do. One table per ISA; `kernels()` is chosen once from
// the CPU's features (CHORUS_KERNELS=scalar forces the reference).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace chorus::kernels {

enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };
inline constexpr int kNumReduceOps = 4;

// dst[i] = a[i] op b[i], i < count. dst may alias a or b exactly (not partially).
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
// dst[i] = src[i] * scalar, where scalar points at one element of the datatype.
using ScaleFn = void (*)(void* dst, const void* src, size_t count, const void* scalar);
// dst[i] = dst[i] / divisor (integer division for integer types).
using DivideFn = void (*)(void* dst, size_t count, uint32_t divisor);

struct KernelTable {
  const char* isa;
  ReduceFn reduce[kNumDataTypes][kNumReduceOps];
  ScaleFn scale[kNumDataTypes];
  DivideFn divide[kNumDataTypes];
};

const KernelTable& scalar_kernels();
// The table used by the library: the best the CPU supports.
const KernelTable& kernels();

inline ReduceFn reduce_fn(DataType t, ReduceOp op) {
  return kernels().reduce[static_cast<int>(t)][static_cast<int>(op)];
}
inline ScaleFn scale_fn(DataType t) { return kernels().scale[static_cast<int>(t)]; }
inline DivideFn divide_fn(DataType t) { return kernels().divide[static_cast<int>(t)]; }

}  // namespace chorus::kernels
