// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/reduce_avx2.cc
// The AVX2 + F16C table: one codec per datatype (load/widen, compute, round/store 32 bytes at a
// time) run by the loops of simd_driver.h. Bit-identical to reduce_scalar.cc for every input.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"

// Everything up to pop_options is compiled for AVX2 + F16C (no FMA: no kernel has a multiply-add
// the reference does not round twice). Standard headers stay above, so none of their inline
// functions gets an AVX2 body that the linker could pick for the rest of the library.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

#include "kernels/reduce/simd_driver.h"

namespace chorus::kernels::avx2 {
namespace {

using simd::Byte;

CHORUS_SIMD_INLINE __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
CHORUS_SIMD_INLINE void store256(void* p, __m256i v) {
  _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}
CHORUS_SIMD_INLINE __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
CHORUS_SIMD_INLINE void store128(void* p, __m128i v) {
  _mm_storeu_si128(static_cast<__m128i*>(p), v);
}
CHORUS_SIMD_INLINE __m256i splat32(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
CHORUS_SIMD_INLINE __m256i splat16(uint16_t v) { return _mm256_set1_epi16(static_cast<short>(v)); }

// 32 int32 lanes (four vectors, lane order) -> their low bytes, in order.
CHORUS_SIMD_INLINE __m256i pack_low_bytes(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
  const __m256i low = splat32(0xff);
  // Both packs work within 128-bit halves, leaving dword k of the result holding 4 bytes of
  // q[k % 4] (half k / 4); the permute puts them back in element order.
  __m256i w01 = _mm256_packus_epi32(_mm256_and_si256(q0, low), _mm256_and_si256(q1, low));
  __m256i w23 = _mm256_packus_epi32(_mm256_and_si256(q2, low), _mm256_and_si256(q3, low));
  __m256i b = _mm256_packus_epi16(w01, w23);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// ---- Integers: wrapping sum and product, exact max/min ----------------------------------------

template <typename T>
struct IntCodec {
  using Storage = T;
  using Vals = __m256i;
  static constexpr size_t kWidth = 32 / sizeof(T);
  static constexpr bool kSigned = std::is_signed_v<T>;
  static constexpr bool kVectorDivide = sizeof(T) != 8;  // 64-bit: scalar division
  static constexpr bool kNarrowFloat = false;
  // 8-bit lanes divide in fp32, 32-bit lanes in fp64: both exact (see div()).
  struct Divisor {  // only the member the lane width uses is set
    __m256 f32;
    __m256d f64;
  };

  CHORUS_SIMD_INLINE static Vals load(const void* p) { return load256(p); }
  CHORUS_SIMD_INLINE static void store(void* p, Vals v) { store256(p, v); }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    T v;
    std::memcpy(&v, s, sizeof(v));
    if constexpr (sizeof(T) == 1) return _mm256_set1_epi8(static_cast<char>(v));
    if constexpr (sizeof(T) == 4) return _mm256_set1_epi32(static_cast<int>(v));
    if constexpr (sizeof(T) == 8) return _mm256_set1_epi64x(static_cast<long long>(v));
  }

  CHORUS_SIMD_INLINE static Vals add(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) return _mm256_add_epi8(x, y);
    if constexpr (sizeof(T) == 4) return _mm256_add_epi32(x, y);
    if constexpr (sizeof(T) == 8) return _mm256_add_epi64(x, y);
  }
  CHORUS_SIMD_INLINE static Vals mul(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) {
      // No 8-bit multiply: the low byte of a 16-bit product depends only on the low bytes.
      __m256i even = _mm256_mullo_epi16(x, y);
      __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(x, 8), _mm256_srli_epi16(y, 8));
      return _mm256_or_si256(_mm256_and_si256(even, splat16(0xff)), _mm256_slli_epi16(odd, 8));
    }
    if constexpr (sizeof(T) == 4) return _mm256_mullo_epi32(x, y);
    if constexpr (sizeof(T) == 8) {
      // x*y mod 2^64 = lo(x)lo(y) + ((hi(x)lo(y) + lo(x)hi(y)) << 32).
      __m256i lo = _mm256_mul_epu32(x, y);
      __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), y),
                                       _mm256_mul_epu32(x, _mm256_srli_epi64(y, 32)));
      return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
    }
  }
  // All-ones lanes where x > y.
  CHORUS_SIMD_INLINE static Vals greater64(Vals x, Vals y) {
    if constexpr (kSigned) return _mm256_cmpgt_epi64(x, y);
    const __m256i flip = _mm256_set1_epi64x(INT64_MIN);
    return _mm256_cmpgt_epi64(_mm256_xor_si256(x, flip), _mm256_xor_si256(y, flip));
  }
  CHORUS_SIMD_INLINE static Vals max(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm256_max_epi8(x, y) : _mm256_max_epu8(x, y);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm256_max_epi32(x, y) : _mm256_max_epu32(x, y);
    if constexpr (sizeof(T) == 8) return _mm256_blendv_epi8(y, x, greater64(x, y));
  }
  CHORUS_SIMD_INLINE static Vals min(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm256_min_epi8(x, y) : _mm256_min_epu8(x, y);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm256_min_epi32(x, y) : _mm256_min_epu32(x, y);
    if constexpr (sizeof(T) == 8) return _mm256_blendv_epi8(x, y, greater64(x, y));
  }
  template <ReduceOp kOp>
  CHORUS_SIMD_INLINE static Vals apply(Vals x, Vals y) {
    if constexpr (kOp == ReduceOp::kSum) return add(x, y);
    if constexpr (kOp == ReduceOp::kProd) return mul(x, y);
    if constexpr (kOp == ReduceOp::kMax) return max(x, y);
    if constexpr (kOp == ReduceOp::kMin) return min(x, y);
  }

  // Truncating division by the divisor itself (never wrapped to T: an 8-bit value divided by
  // 200 ranks is 0).
  CHORUS_SIMD_INLINE static Divisor make_divisor(uint32_t divisor) {
    if constexpr (sizeof(T) == 1)
      return {_mm256_set1_ps(static_cast<float>(divisor)), _mm256_setzero_pd()};
    return {_mm256_setzero_ps(), _mm256_set1_pd(static_cast<double>(divisor))};
  }
  // 8-bit: |x| <= 255; for n <= 255 a non-integral x/n is >= 1/255 of its magnitude away from
  // an integer, far above fp32's rounding error, and for larger n the quotient is below 1; likewise 32-bit values in fp64. Truncating the
  // correctly rounded quotient therefore gives the integer quotient.
  CHORUS_SIMD_INLINE static __m256i div8(__m128i bytes, __m256 n) {
    __m256i w = kSigned ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_cvttps_epi32(_mm256_div_ps(_mm256_cvtepi32_ps(w), n));
  }
  CHORUS_SIMD_INLINE static __m128i div32(__m128i x, __m256d n) {
    if constexpr (kSigned) return _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(x), n));
    // uint32 <-> fp64 through the signed conversions, offset by 2^31 (exact).
    const __m256d offset = _mm256_set1_pd(2147483648.0);
    const __m128i flip = _mm_set1_epi32(INT32_MIN);
    __m256d v = _mm256_add_pd(_mm256_cvtepi32_pd(_mm_xor_si128(x, flip)), offset);
    __m256d q = _mm256_round_pd(_mm256_div_pd(v, n), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    return _mm_xor_si128(_mm256_cvttpd_epi32(_mm256_sub_pd(q, offset)), flip);
  }
  CHORUS_SIMD_INLINE static Vals div(Vals x, Divisor n) {
    __m128i lo = _mm256_castsi256_si128(x), hi = _mm256_extracti128_si256(x, 1);
    if constexpr (sizeof(T) == 1) {
      return pack_low_bytes(div8(lo, n.f32), div8(_mm_srli_si128(lo, 8), n.f32), div8(hi, n.f32),
                            div8(_mm_srli_si128(hi, 8), n.f32));
    } else {
      return _mm256_set_m128i(div32(hi, n.f64), div32(lo, n.f64));
    }
  }
};

// ---- fp32 lanes shared by float, half, bfloat16 and fp8 ---------------------------------------

template <int N>
struct F32 {
  __m256 v[N];
};

template <ReduceOp kOp>
CHORUS_SIMD_INLINE __m256 apply_ps(__m256 x, __m256 y) {
  if constexpr (kOp == ReduceOp::kSum) return _mm256_add_ps(x, y);
  if constexpr (kOp == ReduceOp::kProd) return _mm256_mul_ps(x, y);
  // std::max(x, y) = x < y ? y : x, and vmaxps(a, b) = a > b ? a : b: so max(y, x), which also
  // returns x when either is NaN or both are zero, as the reference does. Likewise min.
  if constexpr (kOp == ReduceOp::kMax) return _mm256_max_ps(y, x);
  if constexpr (kOp == ReduceOp::kMin) return _mm256_min_ps(y, x);
}

template <int N>
struct FloatOps {
  using Vals = F32<N>;
  static constexpr bool kVectorDivide = true;
  using Divisor = __m256;

  template <ReduceOp kOp>
  CHORUS_SIMD_INLINE static Vals apply(Vals x, Vals y) {
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) x.v[i] = apply_ps<kOp>(x.v[i], y.v[i]);
    return x;
  }
  CHORUS_SIMD_INLINE static Vals mul(Vals x, Vals y) { return apply<ReduceOp::kProd>(x, y); }
  CHORUS_SIMD_INLINE static Divisor make_divisor(uint32_t divisor) {
    return _mm256_set1_ps(static_cast<float>(divisor));
  }
  CHORUS_SIMD_INLINE static Vals div(Vals x, Divisor n) {
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) x.v[i] = _mm256_div_ps(x.v[i], n);
    return x;
  }
  CHORUS_SIMD_INLINE static Vals broadcast(float f) {
    Vals r;
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) r.v[i] = _mm256_set1_ps(f);
    return r;
  }
  CHORUS_SIMD_INLINE static Vals load_f32(const void* p) {
    Vals r;
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) r.v[i] =
        _mm256_loadu_ps(static_cast<const float*>(p) + 8 * i);
    return r;
  }
  CHORUS_SIMD_INLINE static void store_f32(void* p, Vals x) {
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i)
        _mm256_storeu_ps(static_cast<float*>(p) + 8 * i, x.v[i]);
  }
};

struct FloatCodec : FloatOps<1> {
  using Storage = float;
  static constexpr size_t kWidth = 8;
  static constexpr bool kNarrowFloat = false;
  CHORUS_SIMD_INLINE static Vals load(const void* p) { return load_f32(p); }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) { store_f32(p, x); }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    return broadcast(*static_cast<const float*>(s));
  }
};

struct DoubleCodec {
  using Storage = double;
  using Vals = __m256d;
  using Divisor = __m256d;
  static constexpr size_t kWidth = 4;
  static constexpr bool kVectorDivide = true;
  static constexpr bool kNarrowFloat = false;
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    return _mm256_loadu_pd(static_cast<const double*>(p));
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    _mm256_storeu_pd(static_cast<double*>(p), x);
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    return _mm256_set1_pd(*static_cast<const double*>(s));
  }
  template <ReduceOp kOp>
  CHORUS_SIMD_INLINE static Vals apply(Vals x, Vals y) {
    if constexpr (kOp == ReduceOp::kSum) return _mm256_add_pd(x, y);
    if constexpr (kOp == ReduceOp::kProd) return _mm256_mul_pd(x, y);
    if constexpr (kOp == ReduceOp::kMax) return _mm256_max_pd(y, x);  // see apply_ps
    if constexpr (kOp == ReduceOp::kMin) return _mm256_min_pd(y, x);
  }
  CHORUS_SIMD_INLINE static Vals mul(Vals x, Vals y) { return _mm256_mul_pd(x, y); }
  CHORUS_SIMD_INLINE static Divisor make_divisor(uint32_t divisor) {
    return _mm256_set1_pd(static_cast<double>(divisor));
  }
  CHORUS_SIMD_INLINE static Vals div(Vals x, Divisor n) { return _mm256_div_pd(x, n); }
};

// ---- fp16 and bfloat16 --------------------------------------------------------------------

// 8 floats -> 8 halves, nearest even (F16C handles overflow to inf and subnormals exactly as
// float_to_half). A NaN keeps its payload in vcvtps2ph; the reference returns sign|0x7e00.
CHORUS_SIMD_INLINE __m128i f32_to_half8(__m256 x) {
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
  __m128i canonical =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(INT16_MIN)), _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, canonical, nan);
}

struct HalfCodec : FloatOps<2> {
  using Storage = uint16_t;
  static constexpr size_t kWidth = 16;
  static constexpr bool kNarrowFloat = true;
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    const auto* b = static_cast<const Byte*>(p);
    return {{_mm256_cvtph_ps(load128(b)), _mm256_cvtph_ps(load128(b + 16))}};
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    auto* b = static_cast<Byte*>(p);
    store128(b, f32_to_half8(x.v[0]));
    store128(b + 16, f32_to_half8(x.v[1]));
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    uint16_t h;
    std::memcpy(&h, s, sizeof(h));
    return broadcast(half_to_float(h));
  }
};

// 8 floats -> 8 bfloat16 in the low halves of 32-bit lanes, as float_to_bf16: a NaN becomes its
// top half with the quiet bit set; anything else rounds to nearest even by adding 0x7fff plus
// the lowest kept bit and truncating (carries into the exponent round up to the next binade
// or to infinity, exactly as the reference does).
CHORUS_SIMD_INLINE __m256i f32_to_bf16_lanes(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, splat32(0x7fffffff)), splat32(0x7f800000));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat32(1));
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat32(0x7fff)), lsb), 16);
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), splat32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

struct Bf16Codec : FloatOps<2> {
  using Storage = uint16_t;
  static constexpr size_t kWidth = 16;
  static constexpr bool kNarrowFloat = true;
  CHORUS_SIMD_INLINE static __m256 widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    const auto* b = static_cast<const Byte*>(p);
    return {{widen(load128(b)), widen(load128(b + 16))}};
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    // packus works per 128-bit half: [x0 lo, x1 lo, x0 hi, x1 hi]; 0xd8 restores the order.
    __m256i packed = _mm256_packus_epi32(f32_to_bf16_lanes(x.v[0]), f32_to_bf16_lanes(x.v[1]));
    store256(p, _mm256_permute4x64_epi64(packed, 0xd8));
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    uint16_t h;
    std::memcpy(&h, s, sizeof(h));
    return broadcast(bf16_to_float(h));
  }
};

// ---- fp8 (e4m3, e5m2) -------------------------------------------------------------------------

// 16 fp8 codes -> 16 halves whose values are the codes' values (e4m3: divided by 256). e5m2 is
// the top byte of a half. e4m3 has one exponent bit less: shifting its magnitude into a half
// gives a bias of 15 instead of 7, undone by the caller's exact multiply by 2^8 (subnormals
// included: a half subnormal is a normal float). NaN codes become the half sign|0x7e00, which
// widens to the reference decoder's sign|0x7fc00000.
template <class Fmt>
CHORUS_SIMD_INLINE __m256i fp8_to_half16(__m128i codes) {
  __m256i x = _mm256_cvtepu8_epi16(codes);
  __m256i h, nan;
  if constexpr (Fmt::kHasInf) {
    h = _mm256_slli_epi16(x, 8);
    nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, splat16(0x7fff)), splat16(0x7c00));
  } else {
    __m256i mag = _mm256_and_si256(x, splat16(0x7f));
    h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                        _mm256_slli_epi16(_mm256_and_si256(x, splat16(0x80)), 8));
    nan = _mm256_cmpeq_epi16(mag, splat16(0x7f));
  }
  __m256i canonical = _mm256_or_si256(_mm256_and_si256(h, splat16(0x8000)), splat16(0x7e00));
  return _mm256_blendv_epi8(h, canonical, nan);
}

// 8 floats -> 8 fp8 codes (low bytes of 32-bit lanes), bit-exact with Fp8Format::encode.
// Normal results (|x| >= 2^(1 - bias)): rounding the float's own bits to kMan fraction bits
// (add half an fp8 ulp minus one plus the lowest kept bit: ties go to even) leaves exponent and
// fraction side by side, a carry out of the fraction bumping the exponent as in the reference;
// shifting and rebiasing gives the code. Subnormal results: the code is |x| * 2^(bias-1+kMan)
// rounded to an integer, ties to even. The scaling is exact (a power of two, no overflow, and
// float subnormals round to 0 as in the reference), and vroundps uses the rounding mode given,
// not MXCSR's; a subnormal rounding up to 2^kMan is the smallest normal code. Codes past kMaxCode
// (infinity included) saturate; NaN becomes kNanCode; the sign is copied.
template <class Fmt>
CHORUS_SIMD_INLINE __m256i f32_to_fp8_lanes(__m256 x) {
  constexpr int kShift = 23 - Fmt::kMan;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan)
                                       << 23;
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, splat32(0x7fffffff));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(abs, kShift), splat32(1));
  const __m256i rounded =
      _mm256_add_epi32(abs, _mm256_add_epi32(lsb, splat32((1u << (kShift - 1)) - 1)));
  const __m256i normal =
      _mm256_sub_epi32(_mm256_srli_epi32(rounded, kShift),
                       splat32(static_cast<uint32_t>(127 - Fmt::kBias) << Fmt::kMan));
  const __m256 scaled =
      _mm256_mul_ps(_mm256_castsi256_ps(abs), _mm256_castsi256_ps(splat32(kSubnormalScale)));
  const __m256i subnormal =
      _mm256_cvttps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i code =
      _mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(abs, splat32(kMinNormal - 1)));
  code = _mm256_min_epu32(code, splat32(Fmt::kMaxCode));
  code = _mm256_blendv_epi8(code, splat32(Fmt::kNanCode),
                            _mm256_cmpgt_epi32(abs, splat32(0x7f800000)));
  return _mm256_or_si256(code, _mm256_srli_epi32(_mm256_andnot_si256(abs, u), 24));
}

template <class Fmt, float (*kDecode)(uint8_t)>
struct Fp8Codec : FloatOps<4> {
  using Storage = uint8_t;
  static constexpr size_t kWidth = 32;
  static constexpr bool kNarrowFloat = true;
  CHORUS_SIMD_INLINE static void widen16(__m128i codes, __m256* out) {
    __m256i h = fp8_to_half16<Fmt>(codes);
    out[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    out[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if constexpr (!Fmt::kHasInf) {
      const __m256 scale = _mm256_set1_ps(256.0f);
      out[0] = _mm256_mul_ps(out[0], scale);
      out[1] = _mm256_mul_ps(out[1], scale);
    }
  }
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    const auto* b = static_cast<const Byte*>(p);
    Vals r;
    widen16(load128(b), &r.v[0]);
    widen16(load128(b + 16), &r.v[2]);
    return r;
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    store256(p, pack_low_bytes(f32_to_fp8_lanes<Fmt>(x.v[0]), f32_to_fp8_lanes<Fmt>(x.v[1]),
                               f32_to_fp8_lanes<Fmt>(x.v[2]), f32_to_fp8_lanes<Fmt>(x.v[3])));
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    return broadcast(kDecode(*static_cast<const uint8_t*>(s)));
  }
};

using E4m3Codec = Fp8Codec<simd::E4m3, fp8e4m3_to_float>;
using E5m2Codec = Fp8Codec<simd::E5m2, fp8e5m2_to_float>;

}  // namespace
}  // namespace chorus::kernels::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#include "kernels/reduce/simd_table.h"

namespace chorus::kernels {
namespace {

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

__attribute__((target("avx2"))) void stream_copy_bytes(void* dst, const void* src,
                                                       size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Up to 32-byte alignment of the destination with an ordinary copy, then 128 bytes per step.
  size_t head = (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32;
  if (head > bytes) head = bytes;
  if (head != 0) std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 128; d += 128, s += 128, bytes -= 128) {
    __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    __m256i v3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), v0);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), v1);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), v2);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), v3);
  }
  if (bytes != 0) std::memcpy(d, s, bytes);
  // Streaming stores are weakly ordered: fence them before whatever publishes the data.
  _mm_sfence();
}

KernelTable make_avx2_table() {
  using simd::fill_type;
  KernelTable table{};
  table.isa = "avx2";
  table.copy = copy_bytes;
  table.stream_copy = stream_copy_bytes;
  fill_type<avx2::IntCodec<int8_t>>(table, DataType::kInt8);
  fill_type<avx2::IntCodec<uint8_t>>(table, DataType::kUint8);
  fill_type<avx2::IntCodec<int32_t>>(table, DataType::kInt32);
  fill_type<avx2::IntCodec<uint32_t>>(table, DataType::kUint32);
  fill_type<avx2::IntCodec<int64_t>>(table, DataType::kInt64);
  fill_type<avx2::IntCodec<uint64_t>>(table, DataType::kUint64);
  fill_type<avx2::HalfCodec>(table, DataType::kFloat16);
  fill_type<avx2::FloatCodec>(table, DataType::kFloat32);
  fill_type<avx2::DoubleCodec>(table, DataType::kFloat64);
  fill_type<avx2::Bf16Codec>(table, DataType::kBfloat16);
  fill_type<avx2::E4m3Codec>(table, DataType::kFloat8e4m3);
  fill_type<avx2::E5m2Codec>(table, DataType::kFloat8e5m2);
  return table;
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = make_avx2_table();
  return table;
}

}  // namespace chorus::kernels

#endif  // __x86_64__
