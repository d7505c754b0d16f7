// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/simd_driver.h
// The loops shared by the SIMD tables. A kernel walks its arrays one block of Codec::kWidth
// elements at a time and runs the tail through zero-padded bounce buffers, so every element takes
// the same vector path. Include it only inside an ISA's `#pragma GCC target` region, after every
// standard header (see reduce_avx2.cc): its templates must be compiled for that ISA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"

// Codec helpers must inline into the kernels: a block of fp8 lanes is four vectors, which GCC
// would otherwise pass through memory.
#define CHORUS_SIMD_INLINE inline __attribute__((always_inline))
// Loops over the vectors of a block are short and must unroll completely.
#define CHORUS_UNROLL_ALL _Pragma("GCC unroll 16")

namespace chorus::kernels::simd {

// A Codec describes one datatype on one ISA (all members static):
//   Storage, kWidth                  the element type; elements per block
//   Vals load(const void*)           one block from memory (unaligned), widened to compute lanes
//   void store(void*, Vals)          one block back, rounded as the reference rounds
//   Vals splat(const void* scalar)   one element, broadcast
//   Vals apply<ReduceOp>(Vals, Vals) the reduction; mul(Vals, Vals) is apply<kProd>
//   kVectorDivide, Divisor, make_divisor(uint32_t), div(Vals, Divisor)  Avg's division
//   (the fp16/bf16/fp8 codecs) load_f32(const void*), store_f32(void*, Vals): kWidth floats
// Instantiated with codecs of an ISA TU's unnamed namespace, these templates have internal
// linkage, so the AVX2 and AVX-512 copies never meet at link time.

using Byte = unsigned char;

template <class C>
inline constexpr size_t kBlockBytes = C::kWidth * sizeof(typename C::Storage);

// A zero-filled block holding the first `n` bytes of `src` (the tail of an array).
template <size_t kBytes>
struct Bounce {
  alignas(64) Byte bytes[kBytes] = {};
  Bounce() = default;
  Bounce(const void* src, size_t n) { std::memcpy(bytes, src, n); }
};

template <class C, ReduceOp kOp>
void reduce_kernel(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kBytes = kBlockBytes<C>;
  auto* d = static_cast<Byte*>(dst);
  const auto* x = static_cast<const Byte*>(a);
  const auto* y = static_cast<const Byte*>(b);
  const size_t bytes = count * sizeof(typename C::Storage);
  size_t off = 0;
  // Both blocks are loaded before either is stored, so exact aliasing of dst is harmless.
  for (; off + 2 * kBytes <= bytes; off += 2 * kBytes) {
    auto r0 = C::template apply<kOp>(C::load(x + off), C::load(y + off));
    auto r1 = C::template apply<kOp>(C::load(x + off + kBytes), C::load(y + off + kBytes));
    C::store(d + off, r0);
    C::store(d + off + kBytes, r1);
  }
  for (; off + kBytes <= bytes; off += kBytes) {
    C::store(d + off, C::template apply<kOp>(C::load(x + off), C::load(y + off)));
  }
  if (off == bytes) return;
  const size_t n = bytes - off;
  Bounce<kBytes> bx(x + off, n), by(y + off, n), out;
  C::store(out.bytes, C::template apply<kOp>(C::load(bx.bytes), C::load(by.bytes)));
  std::memcpy(d + off, out.bytes, n);
}

// reduce_kernel with non-temporal stores: each block is rounded into an aligned local block
// (the codec's own store, so the bits are reduce_kernel's) and streamed to dst 32 bytes at a
// time, which needs dst's blocks 32-byte aligned. Leading elements up to that alignment, and
// all of an array whose elements cannot reach it, take reduce_kernel's path. Streaming skips
// reading each output line before writing it: a third less memory traffic for outputs too
// large to stay in cache. Fenced before returning, as stream_copy is.
template <class C, ReduceOp kOp>
void reduce_stream_kernel(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kBytes = kBlockBytes<C>;
  constexpr size_t kElem = sizeof(typename C::Storage);
  static_assert(kBytes % 32 == 0, "blocks are streamed as 32-byte vectors");
  auto* d = static_cast<Byte*>(dst);
  const auto* x = static_cast<const Byte*>(a);
  const auto* y = static_cast<const Byte*>(b);
  const size_t bytes = count * kElem;
  const size_t head = (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32;
  if (head % kElem != 0 || head + kBytes > bytes) {
    reduce_kernel<C, kOp>(dst, a, b, count);
    return;
  }
  reduce_kernel<C, kOp>(d, x, y, head / kElem);
  size_t off = head;
  for (; off + kBytes <= bytes; off += kBytes) {
    alignas(64) Byte block[kBytes];
    C::store(block, C::template apply<kOp>(C::load(x + off), C::load(y + off)));
    CHORUS_UNROLL_ALL
    for (size_t v = 0; v < kBytes; v += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + off + v),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(block + v)));
    }
  }
  reduce_kernel<C, kOp>(d + off, x + off, y + off, (bytes - off) / kElem);
  _mm_sfence();
}

template <class C, ReduceOp kOp>
void reduce_copy_kernel(void* dst1, void* dst2, const void* a, const void* b, size_t count) {
  constexpr size_t kBytes = kBlockBytes<C>;
  auto* d1 = static_cast<Byte*>(dst1);
  auto* d2 = static_cast<Byte*>(dst2);
  const auto* x = static_cast<const Byte*>(a);
  const auto* y = static_cast<const Byte*>(b);
  const size_t bytes = count * sizeof(typename C::Storage);
  size_t off = 0;
  for (; off + kBytes <= bytes; off += kBytes) {
    auto r = C::template apply<kOp>(C::load(x + off), C::load(y + off));
    C::store(d1 + off, r);
    C::store(d2 + off, r);
  }
  if (off == bytes) return;
  const size_t n = bytes - off;
  Bounce<kBytes> bx(x + off, n), by(y + off, n), out;
  C::store(out.bytes, C::template apply<kOp>(C::load(bx.bytes), C::load(by.bytes)));
  std::memcpy(d1 + off, out.bytes, n);
  std::memcpy(d2 + off, out.bytes, n);
}

template <class C>
void scale_kernel(void* dst, const void* src, size_t count, const void* scalar) {
  constexpr size_t kBytes = kBlockBytes<C>;
  auto* d = static_cast<Byte*>(dst);
  const auto* s = static_cast<const Byte*>(src);
  const auto factor = C::splat(scalar);
  const size_t bytes = count * sizeof(typename C::Storage);
  size_t off = 0;
  for (; off + kBytes <= bytes; off += kBytes) C::store(d + off, C::mul(C::load(s + off), factor));
  if (off == bytes) return;
  const size_t n = bytes - off;
  Bounce<kBytes> bs(s + off, n), out;
  C::store(out.bytes, C::mul(C::load(bs.bytes), factor));
  std::memcpy(d + off, out.bytes, n);
}

// The reference's integer division, for the widths no ISA divides in vectors (64-bit).
template <typename T>
void divide_scalar(void* dst, size_t count, uint32_t divisor) {
  const T n = static_cast<T>(divisor);
  auto* d = static_cast<Byte*>(dst);
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, d + i * sizeof(T), sizeof(T));
    v = static_cast<T>(v / n);
    std::memcpy(d + i * sizeof(T), &v, sizeof(T));
  }
}

template <class C>
void divide_kernel(void* dst, size_t count, uint32_t divisor) {
  constexpr size_t kBytes = kBlockBytes<C>;
  auto* d = static_cast<Byte*>(dst);
  const auto n = C::make_divisor(divisor);
  const size_t bytes = count * sizeof(typename C::Storage);
  size_t off = 0;
  for (; off + kBytes <= bytes; off += kBytes) C::store(d + off, C::div(C::load(d + off), n));
  if (off == bytes) return;
  const size_t rest = bytes - off;
  Bounce<kBytes> bd(d + off, rest), out;
  C::store(out.bytes, C::div(C::load(bd.bytes), n));
  std::memcpy(d + off, out.bytes, rest);
}

template <class C>
void to_float_kernel(void* dst, const void* src, size_t count) {
  constexpr size_t kIn = kBlockBytes<C>;
  constexpr size_t kOut = C::kWidth * sizeof(float);
  auto* d = static_cast<Byte*>(dst);
  const auto* s = static_cast<const Byte*>(src);
  size_t i = 0;
  for (; i + C::kWidth <= count; i += C::kWidth) {
    C::store_f32(d + i * sizeof(float), C::load(s + i * sizeof(typename C::Storage)));
  }
  if (i == count) return;
  Bounce<kIn> bs(s + i * sizeof(typename C::Storage), (count - i) * sizeof(typename C::Storage));
  Bounce<kOut> out;
  C::store_f32(out.bytes, C::load(bs.bytes));
  std::memcpy(d + i * sizeof(float), out.bytes, (count - i) * sizeof(float));
}

template <class C>
void from_float_kernel(void* dst, const void* src, size_t count) {
  constexpr size_t kIn = C::kWidth * sizeof(float);
  constexpr size_t kOut = kBlockBytes<C>;
  auto* d = static_cast<Byte*>(dst);
  const auto* s = static_cast<const Byte*>(src);
  size_t i = 0;
  for (; i + C::kWidth <= count; i += C::kWidth) {
    C::store(d + i * sizeof(typename C::Storage), C::load_f32(s + i * sizeof(float)));
  }
  if (i == count) return;
  Bounce<kIn> bs(s + i * sizeof(float), (count - i) * sizeof(float));
  Bounce<kOut> out;
  C::store(out.bytes, C::load_f32(bs.bytes));
  std::memcpy(d + i * sizeof(typename C::Storage), out.bytes,
              (count - i) * sizeof(typename C::Storage));
}

// The fp8 formats as the encoders see them; the values come from kernels/fp8/convert.h.
struct E4m3 {
  static constexpr int kMan = 3;
  static constexpr int kBias = Fp8E4M3::kBias;
  static constexpr uint32_t kMaxCode = 0x7e;  // 448
  static constexpr uint32_t kNanCode = 0x7f;
  static constexpr bool kHasInf = false;
};
struct E5m2 {
  static constexpr int kMan = 2;
  static constexpr int kBias = Fp8E5M2::kBias;
  static constexpr uint32_t kMaxCode = 0x7b;  // 57344
  static constexpr uint32_t kNanCode = 0x7f;
  static constexpr bool kHasInf = true;
};

}  // namespace chorus::kernels::simd
