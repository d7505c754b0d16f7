// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/simd_table.h
// Fills a KernelTable row from a codec's kernels (simd_driver.h). Include it after an ISA's
// `#pragma GCC pop_options`: taking the kernels' addresses must itself run on any x86-64 CPU.
#pragma once

#include "kernels/reduce/reduce.h"
#include "kernels/reduce/simd_driver.h"

namespace chorus::kernels::simd {

template <class C>
void fill_type(KernelTable& table, DataType type) {
  const int t = static_cast<int>(type);
  table.reduce[t][0] = reduce_kernel<C, ReduceOp::kSum>;
  table.reduce[t][1] = reduce_kernel<C, ReduceOp::kProd>;
  table.reduce[t][2] = reduce_kernel<C, ReduceOp::kMax>;
  table.reduce[t][3] = reduce_kernel<C, ReduceOp::kMin>;
  table.reduce_stream[t][0] = reduce_stream_kernel<C, ReduceOp::kSum>;
  table.reduce_stream[t][1] = reduce_stream_kernel<C, ReduceOp::kProd>;
  table.reduce_stream[t][2] = reduce_stream_kernel<C, ReduceOp::kMax>;
  table.reduce_stream[t][3] = reduce_stream_kernel<C, ReduceOp::kMin>;
  table.reduce_copy[t][0] = reduce_copy_kernel<C, ReduceOp::kSum>;
  table.reduce_copy[t][1] = reduce_copy_kernel<C, ReduceOp::kProd>;
  table.reduce_copy[t][2] = reduce_copy_kernel<C, ReduceOp::kMax>;
  table.reduce_copy[t][3] = reduce_copy_kernel<C, ReduceOp::kMin>;
  table.scale[t] = scale_kernel<C>;
  if constexpr (C::kVectorDivide) {
    table.divide[t] = divide_kernel<C>;
  } else {
    table.divide[t] = divide_scalar<typename C::Storage>;
  }
  if constexpr (C::kNarrowFloat) {
    table.to_float[t] = to_float_kernel<C>;
    table.from_float[t] = from_float_kernel<C>;
  }
}

}  // namespace chorus::kernels::simd
