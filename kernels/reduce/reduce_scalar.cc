// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/reduce_scalar.cc
// The reference kernels: plain loops the compiler may auto-vectorise, used where no faster
// table applies and as the oracle the other tables are tested against.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

// Storage type S, the arithmetic type C, and conversions between them.
template <typename S>
struct Plain {
  using Storage = S;
  using Compute = S;
  static Compute load(S v) { return v; }
  static S store(Compute v) { return v; }
};
template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t)>
struct Float16Like {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t v) { return FromBits(v); }
  static uint16_t store(float v) { return ToBits(v); }
};
// FP8 decodes through a 256-entry table built once from the exact decoder.
template <float (*FromBits)(uint8_t)>
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int c = 0; c < 256; ++c) value[c] = FromBits(static_cast<uint8_t>(c));
  }
};
template <uint8_t (*ToBits)(float), float (*FromBits)(uint8_t)>
struct Float8Like {
  using Storage = uint8_t;
  using Compute = float;
  static inline const Fp8Table<FromBits> kTable{};
  static float load(uint8_t v) { return kTable.value[v]; }
  static uint8_t store(float v) { return ToBits(v); }
};

using HalfT = Float16Like<float_to_half, half_to_float>;
using Bf16T = Float16Like<float_to_bf16, bf16_to_float>;
using E4m3T = Float8Like<float_to_fp8e4m3, fp8e4m3_to_float>;
using E5m2T = Float8Like<float_to_fp8e5m2, fp8e5m2_to_float>;

template <typename C>
C add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename C>
C mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    // Promote narrow unsigned types so the product cannot overflow a signed int.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<C>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <typename T, ReduceOp kOp>
typename T::Storage combine(typename T::Storage x, typename T::Storage y) {
  auto u = T::load(x);
  auto v = T::load(y);
  if constexpr (kOp == ReduceOp::kSum) {
    return T::store(add(u, v));
  } else if constexpr (kOp == ReduceOp::kProd) {
    return T::store(mul(u, v));
  } else if constexpr (kOp == ReduceOp::kMax) {
    return T::store(std::max(u, v));
  } else {
    return T::store(std::min(u, v));
  }
}

template <typename T, ReduceOp kOp>
void reduce_loop(void* dst, const void* a, const void* b, size_t count) {
  using S = typename T::Storage;
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = combine<T, kOp>(x[i], y[i]);
}

template <typename T, ReduceOp kOp>
void reduce_copy_loop(void* dst1, void* dst2, const void* a, const void* b, size_t count) {
  using S = typename T::Storage;
  auto* d1 = static_cast<S*>(dst1);
  auto* d2 = static_cast<S*>(dst2);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  for (size_t i = 0; i < count; ++i) {
    S r = combine<T, kOp>(x[i], y[i]);
    d1[i] = r;
    d2[i] = r;
  }
}

template <typename T>
void scale_loop(void* dst, const void* src, size_t count, const void* scalar) {
  using S = typename T::Storage;
  auto* d = static_cast<S*>(dst);
  const auto* s = static_cast<const S*>(src);
  auto factor = T::load(*static_cast<const S*>(scalar));
  for (size_t i = 0; i < count; ++i) d[i] = T::store(mul(T::load(s[i]), factor));
}

template <typename T>
void divide_loop(void* dst, size_t count, uint32_t divisor) {
  using S = typename T::Storage;
  using C = typename T::Compute;
  auto* d = static_cast<S*>(dst);
  if constexpr (std::is_integral_v<C>) {
    // Divide by the rank count itself, not by it wrapped to the element type (int8 / 200).
    using W = std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>;
    const W n = divisor;
    for (size_t i = 0; i < count; ++i)
      d[i] = T::store(static_cast<C>(static_cast<W>(T::load(d[i])) / n));
  } else {
    C n = static_cast<C>(divisor);
    for (size_t i = 0; i < count; ++i) d[i] = T::store(T::load(d[i]) / n);
  }
}

template <typename T>
void to_float_loop(void* dst, const void* src, size_t count) {
  const auto* s = static_cast<const typename T::Storage*>(src);
  auto* d = static_cast<float*>(dst);
  for (size_t i = 0; i < count; ++i) d[i] = T::load(s[i]);
}

template <typename T>
void from_float_loop(void* dst, const void* src, size_t count) {
  const auto* s = static_cast<const float*>(src);
  auto* d = static_cast<typename T::Storage*>(dst);
  for (size_t i = 0; i < count; ++i) d[i] = T::store(s[i]);
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

template <typename T>
constexpr void fill(KernelTable& table, DataType t) {
  int i = static_cast<int>(t);
  table.reduce[i][0] = reduce_loop<T, ReduceOp::kSum>;
  table.reduce[i][1] = reduce_loop<T, ReduceOp::kProd>;
  table.reduce[i][2] = reduce_loop<T, ReduceOp::kMax>;
  table.reduce[i][3] = reduce_loop<T, ReduceOp::kMin>;
  for (int op = 0; op < kNumReduceOps; ++op) table.reduce_stream[i][op] = table.reduce[i][op];
  table.reduce_copy[i][0] = reduce_copy_loop<T, ReduceOp::kSum>;
  table.reduce_copy[i][1] = reduce_copy_loop<T, ReduceOp::kProd>;
  table.reduce_copy[i][2] = reduce_copy_loop<T, ReduceOp::kMax>;
  table.reduce_copy[i][3] = reduce_copy_loop<T, ReduceOp::kMin>;
  table.scale[i] = scale_loop<T>;
  table.divide[i] = divide_loop<T>;
  if constexpr (!std::is_same_v<typename T::Storage, typename T::Compute>) {
    table.to_float[i] = to_float_loop<T>;
    table.from_float[i] = from_float_loop<T>;
  }
}

KernelTable make_scalar_table() {
  KernelTable table{};
  table.isa = "scalar";
  table.copy = copy_bytes;
  table.stream_copy = copy_bytes;
  fill<Plain<int8_t>>(table, DataType::kInt8);
  fill<Plain<uint8_t>>(table, DataType::kUint8);
  fill<Plain<int32_t>>(table, DataType::kInt32);
  fill<Plain<uint32_t>>(table, DataType::kUint32);
  fill<Plain<int64_t>>(table, DataType::kInt64);
  fill<Plain<uint64_t>>(table, DataType::kUint64);
  fill<HalfT>(table, DataType::kFloat16);
  fill<Plain<float>>(table, DataType::kFloat32);
  fill<Plain<double>>(table, DataType::kFloat64);
  fill<Bf16T>(table, DataType::kBfloat16);
  fill<E4m3T>(table, DataType::kFloat8e4m3);
  fill<E5m2T>(table, DataType::kFloat8e5m2);
  return table;
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table = make_scalar_table();
  return table;
}

}  // namespace chorus::kernels
