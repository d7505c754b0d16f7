// SPDX-License-Identifier: Apache-2.0
// File: kernels/reduce/reduce_avx512.cc
// The AVX-512 (F, BW, VL) table: the codecs of reduce_avx2.cc on 64-byte blocks, with mask
// registers for NaN fix-ups. Bit-identical to reduce_scalar.cc for every input. AVX512-FP16 and
// -BF16 are not used: VCVTNEPS2BF16 flushes subnormals, and the reference rounds once from fp32.
#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from themselves, which
// -W(maybe-)uninitialized reports wherever they are inlined (GCC bug 105593); the warnings refer
// to lines of the header, so ignoring them over the include silences only those.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"

// Everything up to pop_options is compiled for AVX-512; see reduce_avx2.cc for why the standard
// headers stay above.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512bw,avx512vl")
#endif

#include "kernels/reduce/simd_driver.h"

namespace chorus::kernels::avx512 {
namespace {

using simd::Byte;

CHORUS_SIMD_INLINE __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
CHORUS_SIMD_INLINE void store512(void* p, __m512i v) { _mm512_storeu_si512(p, v); }
CHORUS_SIMD_INLINE void store128(void* p, __m128i v) {
  _mm_storeu_si128(static_cast<__m128i*>(p), v);
}
CHORUS_SIMD_INLINE __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
CHORUS_SIMD_INLINE void store256(void* p, __m256i v) {
  _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}
CHORUS_SIMD_INLINE __m512i splat32(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
CHORUS_SIMD_INLINE __m512i splat16(uint16_t v) { return _mm512_set1_epi16(static_cast<short>(v)); }

// ---- Integers: wrapping sum and product, exact max/min ----------------------------------------

template <typename T>
struct IntCodec {
  using Storage = T;
  using Vals = __m512i;
  static constexpr size_t kWidth = 64 / sizeof(T);
  static constexpr bool kSigned = std::is_signed_v<T>;
  static constexpr bool kVectorDivide = sizeof(T) != 8;  // 64-bit: scalar division
  static constexpr bool kNarrowFloat = false;
  struct Divisor {  // only the member the lane width uses is set
    __m512 f32;
    __m512d f64;
  };

  CHORUS_SIMD_INLINE static Vals load(const void* p) { return load512(p); }
  CHORUS_SIMD_INLINE static void store(void* p, Vals v) { store512(p, v); }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    T v;
    std::memcpy(&v, s, sizeof(v));
    if constexpr (sizeof(T) == 1) return _mm512_set1_epi8(static_cast<char>(v));
    if constexpr (sizeof(T) == 4) return _mm512_set1_epi32(static_cast<int>(v));
    if constexpr (sizeof(T) == 8) return _mm512_set1_epi64(static_cast<long long>(v));
  }

  CHORUS_SIMD_INLINE static Vals add(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) return _mm512_add_epi8(x, y);
    if constexpr (sizeof(T) == 4) return _mm512_add_epi32(x, y);
    if constexpr (sizeof(T) == 8) return _mm512_add_epi64(x, y);
  }
  CHORUS_SIMD_INLINE static Vals mul(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) {
      // No 8-bit multiply: the low byte of a 16-bit product depends only on the low bytes.
      __m512i even = _mm512_mullo_epi16(x, y);
      __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(x, 8), _mm512_srli_epi16(y, 8));
      return _mm512_or_si512(_mm512_and_si512(even, splat16(0xff)), _mm512_slli_epi16(odd, 8));
    }
    if constexpr (sizeof(T) == 4) return _mm512_mullo_epi32(x, y);
    if constexpr (sizeof(T) == 8) {
      // x*y mod 2^64 = lo(x)lo(y) + ((hi(x)lo(y) + lo(x)hi(y)) << 32); vpmullq needs AVX512DQ.
      __m512i lo = _mm512_mul_epu32(x, y);
      __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(x, 32), y),
                                       _mm512_mul_epu32(x, _mm512_srli_epi64(y, 32)));
      return _mm512_add_epi64(lo, _mm512_slli_epi64(cross, 32));
    }
  }
  CHORUS_SIMD_INLINE static Vals max(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm512_max_epi8(x, y) : _mm512_max_epu8(x, y);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm512_max_epi32(x, y) : _mm512_max_epu32(x, y);
    if constexpr (sizeof(T) == 8) return kSigned ? _mm512_max_epi64(x, y) : _mm512_max_epu64(x, y);
  }
  CHORUS_SIMD_INLINE static Vals min(Vals x, Vals y) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm512_min_epi8(x, y) : _mm512_min_epu8(x, y);
    if constexpr (sizeof(T) == 4) return kSigned ? _mm512_min_epi32(x, y) : _mm512_min_epu32(x, y);
    if constexpr (sizeof(T) == 8) return kSigned ? _mm512_min_epi64(x, y) : _mm512_min_epu64(x, y);
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
      return {_mm512_set1_ps(static_cast<float>(divisor)), _mm512_setzero_pd()};
    return {_mm512_setzero_ps(), _mm512_set1_pd(static_cast<double>(divisor))};
  }
  CHORUS_SIMD_INLINE static __m128i div8(__m128i bytes, __m512 n) {
    __m512i w = kSigned ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes);
    return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_div_ps(_mm512_cvtepi32_ps(w), n)));
  }
  CHORUS_SIMD_INLINE static __m256i div32(__m256i x, __m512d n) {
    if constexpr (kSigned) return _mm512_cvttpd_epi32(_mm512_div_pd(_mm512_cvtepi32_pd(x), n));
    return _mm512_cvttpd_epu32(_mm512_div_pd(_mm512_cvtepu32_pd(x), n));
  }
  CHORUS_SIMD_INLINE static Vals div(Vals x, Divisor n) {
    if constexpr (sizeof(T) == 1) {
      __m512i r = _mm512_castsi128_si512(div8(_mm512_castsi512_si128(x), n.f32));
      r = _mm512_inserti32x4(r, div8(_mm512_extracti32x4_epi32(x, 1), n.f32), 1);
      r = _mm512_inserti32x4(r, div8(_mm512_extracti32x4_epi32(x, 2), n.f32), 2);
      return _mm512_inserti32x4(r, div8(_mm512_extracti32x4_epi32(x, 3), n.f32), 3);
    } else {
      __m512i r = _mm512_castsi256_si512(div32(_mm512_castsi512_si256(x), n.f64));
      return _mm512_inserti64x4(r, div32(_mm512_extracti64x4_epi64(x, 1), n.f64), 1);
    }
  }
};

// ---- fp32 lanes shared by float, half, bfloat16 and fp8 ---------------------------------------

template <int N>
struct F32 {
  __m512 v[N];
};

template <ReduceOp kOp>
CHORUS_SIMD_INLINE __m512 apply_ps(__m512 x, __m512 y) {
  if constexpr (kOp == ReduceOp::kSum) return _mm512_add_ps(x, y);
  if constexpr (kOp == ReduceOp::kProd) return _mm512_mul_ps(x, y);
  // std::max(x, y) = x < y ? y : x, and vmaxps(a, b) = a > b ? a : b: so max(y, x), which also
  // returns x when either is NaN or both are zero, as the reference does. Likewise min.
  if constexpr (kOp == ReduceOp::kMax) return _mm512_max_ps(y, x);
  if constexpr (kOp == ReduceOp::kMin) return _mm512_min_ps(y, x);
}

template <int N>
struct FloatOps {
  using Vals = F32<N>;
  static constexpr bool kVectorDivide = true;
  using Divisor = __m512;

  template <ReduceOp kOp>
  CHORUS_SIMD_INLINE static Vals apply(Vals x, Vals y) {
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) x.v[i] = apply_ps<kOp>(x.v[i], y.v[i]);
    return x;
  }
  CHORUS_SIMD_INLINE static Vals mul(Vals x, Vals y) { return apply<ReduceOp::kProd>(x, y); }
  CHORUS_SIMD_INLINE static Divisor make_divisor(uint32_t divisor) {
    return _mm512_set1_ps(static_cast<float>(divisor));
  }
  CHORUS_SIMD_INLINE static Vals div(Vals x, Divisor n) {
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) x.v[i] = _mm512_div_ps(x.v[i], n);
    return x;
  }
  CHORUS_SIMD_INLINE static Vals broadcast(float f) {
    Vals r;
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) r.v[i] = _mm512_set1_ps(f);
    return r;
  }
  CHORUS_SIMD_INLINE static Vals load_f32(const void* p) {
    Vals r;
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i) r.v[i] =
        _mm512_loadu_ps(static_cast<const float*>(p) + 16 * i);
    return r;
  }
  CHORUS_SIMD_INLINE static void store_f32(void* p, Vals x) {
    CHORUS_UNROLL_ALL for (int i = 0; i < N; ++i)
        _mm512_storeu_ps(static_cast<float*>(p) + 16 * i, x.v[i]);
  }
};

struct FloatCodec : FloatOps<1> {
  using Storage = float;
  static constexpr size_t kWidth = 16;
  static constexpr bool kNarrowFloat = false;
  CHORUS_SIMD_INLINE static Vals load(const void* p) { return load_f32(p); }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) { store_f32(p, x); }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    return broadcast(*static_cast<const float*>(s));
  }
};

struct DoubleCodec {
  using Storage = double;
  using Vals = __m512d;
  using Divisor = __m512d;
  static constexpr size_t kWidth = 8;
  static constexpr bool kVectorDivide = true;
  static constexpr bool kNarrowFloat = false;
  CHORUS_SIMD_INLINE static Vals load(const void* p) { return _mm512_loadu_pd(p); }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) { _mm512_storeu_pd(p, x); }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    return _mm512_set1_pd(*static_cast<const double*>(s));
  }
  template <ReduceOp kOp>
  CHORUS_SIMD_INLINE static Vals apply(Vals x, Vals y) {
    if constexpr (kOp == ReduceOp::kSum) return _mm512_add_pd(x, y);
    if constexpr (kOp == ReduceOp::kProd) return _mm512_mul_pd(x, y);
    if constexpr (kOp == ReduceOp::kMax) return _mm512_max_pd(y, x);  // see apply_ps
    if constexpr (kOp == ReduceOp::kMin) return _mm512_min_pd(y, x);
  }
  CHORUS_SIMD_INLINE static Vals mul(Vals x, Vals y) { return _mm512_mul_pd(x, y); }
  CHORUS_SIMD_INLINE static Divisor make_divisor(uint32_t divisor) {
    return _mm512_set1_pd(static_cast<double>(divisor));
  }
  CHORUS_SIMD_INLINE static Vals div(Vals x, Divisor n) { return _mm512_div_pd(x, n); }
};

// ---- fp16 and bfloat16 --------------------------------------------------------------------

// 16 floats -> 16 halves, nearest even; NaNs become the reference's sign|0x7e00 (vcvtps2ph
// would keep their payloads).
CHORUS_SIMD_INLINE __m256i f32_to_half16(__m512 x) {
  __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m256i canonical =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(INT16_MIN)), _mm256_set1_epi16(0x7e00));
  return _mm256_mask_blend_epi16(nan, h, canonical);
}

struct HalfCodec : FloatOps<2> {
  using Storage = uint16_t;
  static constexpr size_t kWidth = 32;
  static constexpr bool kNarrowFloat = true;
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    const auto* b = static_cast<const Byte*>(p);
    return {{_mm512_cvtph_ps(load256(b)), _mm512_cvtph_ps(load256(b + 32))}};
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    auto* b = static_cast<Byte*>(p);
    store256(b, f32_to_half16(x.v[0]));
    store256(b + 32, f32_to_half16(x.v[1]));
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    uint16_t h;
    std::memcpy(&h, s, sizeof(h));
    return broadcast(half_to_float(h));
  }
};

// 16 floats -> 16 bfloat16, as float_to_bf16 (see f32_to_bf16_lanes in reduce_avx2.cc).
CHORUS_SIMD_INLINE __m256i f32_to_bf16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, splat32(0x7fffffff)), splat32(0x7f800000));
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), splat32(1));
  __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, splat32(0x7fff)), lsb), 16);
  __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), splat32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

struct Bf16Codec : FloatOps<2> {
  using Storage = uint16_t;
  static constexpr size_t kWidth = 32;
  static constexpr bool kNarrowFloat = true;
  CHORUS_SIMD_INLINE static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    const auto* b = static_cast<const Byte*>(p);
    return {{widen(load256(b)), widen(load256(b + 32))}};
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    auto* b = static_cast<Byte*>(p);
    store256(b, f32_to_bf16(x.v[0]));
    store256(b + 32, f32_to_bf16(x.v[1]));
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    uint16_t h;
    std::memcpy(&h, s, sizeof(h));
    return broadcast(bf16_to_float(h));
  }
};

// ---- fp8 (e4m3, e5m2) -------------------------------------------------------------------------

// 32 fp8 codes -> 32 halves; the mapping is explained at fp8_to_half16 in reduce_avx2.cc.
template <class Fmt>
CHORUS_SIMD_INLINE __m512i fp8_to_half32(__m256i codes) {
  __m512i x = _mm512_cvtepu8_epi16(codes);
  __m512i h;
  __mmask32 nan;
  if constexpr (Fmt::kHasInf) {
    h = _mm512_slli_epi16(x, 8);
    nan = _mm512_cmpgt_epi16_mask(_mm512_and_si512(h, splat16(0x7fff)), splat16(0x7c00));
  } else {
    __m512i mag = _mm512_and_si512(x, splat16(0x7f));
    h = _mm512_or_si512(_mm512_slli_epi16(mag, 7),
                        _mm512_slli_epi16(_mm512_and_si512(x, splat16(0x80)), 8));
    nan = _mm512_cmpeq_epi16_mask(mag, splat16(0x7f));
  }
  __m512i canonical = _mm512_or_si512(_mm512_and_si512(h, splat16(0x8000)), splat16(0x7e00));
  return _mm512_mask_blend_epi16(nan, h, canonical);
}

// 16 floats -> 16 fp8 codes, bit-exact with Fp8Format::encode; the derivation is at
// f32_to_fp8_lanes in reduce_avx2.cc (here the subnormal path converts with embedded rounding).
template <class Fmt>
CHORUS_SIMD_INLINE __m128i f32_to_fp8(__m512 x) {
  constexpr int kShift = 23 - Fmt::kMan;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan)
                                       << 23;
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, splat32(0x7fffffff));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs, kShift), splat32(1));
  const __m512i rounded =
      _mm512_add_epi32(abs, _mm512_add_epi32(lsb, splat32((1u << (kShift - 1)) - 1)));
  const __m512i normal =
      _mm512_sub_epi32(_mm512_srli_epi32(rounded, kShift),
                       splat32(static_cast<uint32_t>(127 - Fmt::kBias) << Fmt::kMan));
  const __m512 scaled =
      _mm512_mul_ps(_mm512_castsi512_ps(abs), _mm512_castsi512_ps(splat32(kSubnormalScale)));
  const __m512i subnormal =
      _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512i code = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(abs, splat32(kMinNormal - 1)),
                                         subnormal, normal);
  code = _mm512_min_epu32(code, splat32(Fmt::kMaxCode));
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(abs, splat32(0x7f800000)),
                               splat32(Fmt::kNanCode));
  code = _mm512_or_si512(code, _mm512_srli_epi32(_mm512_andnot_si512(abs, u), 24));
  return _mm512_cvtepi32_epi8(code);
}

template <class Fmt, float (*kDecode)(uint8_t)>
struct Fp8Codec : FloatOps<4> {
  using Storage = uint8_t;
  static constexpr size_t kWidth = 64;
  static constexpr bool kNarrowFloat = true;
  CHORUS_SIMD_INLINE static void widen32(__m256i codes, __m512* out) {
    __m512i h = fp8_to_half32<Fmt>(codes);
    out[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    out[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    if constexpr (!Fmt::kHasInf) {  // e4m3: undo the half's larger bias (exact)
      const __m512 scale = _mm512_set1_ps(256.0f);
      out[0] = _mm512_mul_ps(out[0], scale);
      out[1] = _mm512_mul_ps(out[1], scale);
    }
  }
  CHORUS_SIMD_INLINE static Vals load(const void* p) {
    const auto* b = static_cast<const Byte*>(p);
    Vals r;
    widen32(load256(b), &r.v[0]);
    widen32(load256(b + 32), &r.v[2]);
    return r;
  }
  CHORUS_SIMD_INLINE static void store(void* p, Vals x) {
    auto* b = static_cast<Byte*>(p);
    for (int i = 0; i < 4; ++i) store128(b + 16 * i, f32_to_fp8<Fmt>(x.v[i]));
  }
  CHORUS_SIMD_INLINE static Vals splat(const void* s) {
    return broadcast(kDecode(*static_cast<const uint8_t*>(s)));
  }
};

using E4m3Codec = Fp8Codec<simd::E4m3, fp8e4m3_to_float>;
using E5m2Codec = Fp8Codec<simd::E5m2, fp8e5m2_to_float>;

}  // namespace
}  // namespace chorus::kernels::avx512

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

KernelTable make_avx512_table() {
  using simd::fill_type;
  KernelTable table{};
  table.isa = "avx512";
  table.copy = copy_bytes;
  table.stream_copy = avx2_kernels().stream_copy;  // 256-bit streaming stores are as fast
  fill_type<avx512::IntCodec<int8_t>>(table, DataType::kInt8);
  fill_type<avx512::IntCodec<uint8_t>>(table, DataType::kUint8);
  fill_type<avx512::IntCodec<int32_t>>(table, DataType::kInt32);
  fill_type<avx512::IntCodec<uint32_t>>(table, DataType::kUint32);
  fill_type<avx512::IntCodec<int64_t>>(table, DataType::kInt64);
  fill_type<avx512::IntCodec<uint64_t>>(table, DataType::kUint64);
  fill_type<avx512::HalfCodec>(table, DataType::kFloat16);
  fill_type<avx512::FloatCodec>(table, DataType::kFloat32);
  fill_type<avx512::DoubleCodec>(table, DataType::kFloat64);
  fill_type<avx512::Bf16Codec>(table, DataType::kBfloat16);
  fill_type<avx512::E4m3Codec>(table, DataType::kFloat8e4m3);
  fill_type<avx512::E5m2Codec>(table, DataType::kFloat8e5m2);
  return table;
}

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table = make_avx512_table();
  return table;
}

}  // namespace chorus::kernels

#endif  // __x86_64__
