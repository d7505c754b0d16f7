// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/reduce.h
// Element-wise reduction kernels for the 12 NCCL datatypes. fp16, bf16 and both fp8 formats are
// computed in fp32 and rounded back (nearest even) once per call. Integer sum and product wrap
// around (two's complement), as NCCL's do. One table per ISA (scalar, AVX2, AVX-512), all
// bit-identical to the scalar reference; `kernels()` is chosen once from the CPU's features.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dtype.h"

namespace chorus::kernels {

enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };
inline constexpr int kNumReduceOps = 4;

// All kernels: no alignment requirement; count == 0 is a no-op; thread-safe (no state).
// Floating max/min are std::max/std::min: max(a, b) = a < b ? b : a, so a NaN in `a` is kept and
// a NaN in `b` is not (and of +0/-0 the first operand wins).

// dst[i] = a[i] op b[i], i < count. dst may alias a or b exactly (not partially).
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
// dst[i] = src[i] * scalar, where scalar points at one element of the datatype. dst may be src.
using ScaleFn = void (*)(void* dst, const void* src, size_t count, const void* scalar);
// dst[i] = dst[i] / divisor (divisor >= 1, the rank count). Integers: truncating division by
// the divisor's value (not wrapped to the element type). Floats: by static_cast<float>(divisor)
// (double for kFloat64), rounded once.
using DivideFn = void (*)(void* dst, size_t count, uint32_t divisor);
// dst1[i] = dst2[i] = a[i] op b[i] in one pass (a rank keeps and forwards a reduced chunk).
// Either destination may alias a or b exactly; dst1 and dst2 must not overlap partially.
using ReduceCopyFn = void (*)(void* dst1, void* dst2, const void* a, const void* b, size_t count);
// memcpy semantics: `bytes` bytes, no overlap.
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
// Conversions between fp32 and a reduced-precision float type (kFloat16, kBfloat16, kFloat8e4m3,
// kFloat8e5m2; nullptr for the other types): to_float widens exactly (a NaN code gives a NaN of
// the same sign, possibly quieted), from_float rounds to nearest even (fp8 saturating) bit for
// bit as kernels/fp8/convert.h. dst and src must not overlap.
using ConvertFn = void (*)(void* dst, const void* src, size_t count);

struct KernelTable {
  const char* isa;  // "scalar", "avx2" or "avx512"
  ReduceFn reduce[kNumDataTypes][kNumReduceOps];
  // The same reductions, bit for bit, with non-temporal stores (see reduce_for_output).
  ReduceFn reduce_stream[kNumDataTypes][kNumReduceOps];
  ScaleFn scale[kNumDataTypes];
  DivideFn divide[kNumDataTypes];
  ReduceCopyFn reduce_copy[kNumDataTypes][kNumReduceOps];
  CopyFn copy;
  // memcpy semantics, but the destination's lines bypass the caches (non-temporal stores,
  // ordered by a store fence before returning): for large copies into memory that is not read
  // again soon, it saves reading every destination line before overwriting it.
  CopyFn stream_copy;
  ConvertFn to_float[kNumDataTypes];
  ConvertFn from_float[kNumDataTypes];
};

// The reference table: plain loops, the oracle the others are tested against.
const KernelTable& scalar_kernels();
// The per-ISA tables. Building them executes no ISA-specific instruction, but calling their
// kernels on a CPU without the ISA does: use kernels_for() unless the check is already done.
const KernelTable& avx2_kernels();    // AVX2 + F16C
const KernelTable& avx512_kernels();  // AVX-512 F, BW and VL (plus AVX2 + F16C)

// The table for `isa` ("scalar", "avx2", "avx512"; case-insensitive), or nullptr when the name
// is unknown or this CPU (and OS) cannot run it.
const KernelTable* kernels_for(std::string_view isa);
// The table for a CHORUS_KERNELS value: AUTO (or empty) picks the best the CPU supports; a named
// ISA the CPU lacks falls back to the best available one, with a warning.
const KernelTable& select_kernels(std::string_view requested);
// The table used by the library: select_kernels(CHORUS_KERNELS), chosen once.
const KernelTable& kernels();

inline ReduceFn reduce_fn(DataType t, ReduceOp op) {
  return kernels().reduce[static_cast<int>(t)][static_cast<int>(op)];
}
inline ScaleFn scale_fn(DataType t) { return kernels().scale[static_cast<int>(t)]; }
inline DivideFn divide_fn(DataType t) { return kernels().divide[static_cast<int>(t)]; }
inline ReduceCopyFn reduce_copy_fn(DataType t, ReduceOp op) {
  return kernels().reduce_copy[static_cast<int>(t)][static_cast<int>(op)];
}
inline CopyFn copy_fn() { return kernels().copy; }

inline CopyFn stream_copy_fn() { return kernels().stream_copy; }

// Copies into a user's output buffer (a collective's result, a received payload): with
// streaming stores from stream_copy_min_bytes() up, memcpy below.
void copy_to_output(void* dst, const void* src, size_t bytes);
// The reduction to write an output of `bytes` with: `fn` (a reduce_fn() of kernels()), or from
// stream_copy_min_bytes() up its variant with streaming stores, as copy_to_output copies.
ReduceFn reduce_for_output(ReduceFn fn, size_t bytes);
// CHORUS_STREAM_COPY_BYTES, or UINT64_MAX when it is 0 (off).
uint64_t stream_copy_min_bytes();

}  // namespace chorus::kernels
