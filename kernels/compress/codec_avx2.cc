// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/codec_avx2.cc
// The AVX2 + F16C block codecs: 8 elements per step, through the loops of codec_driver.h.
// Bit-identical to codec_scalar.cc for every input (the derivations are beside each helper).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/compress/block_codec.h"
#include "kernels/compress/codec_common.h"
#include "kernels/fp8/convert.h"

// Everything up to pop_options is compiled for AVX2 + F16C (no FMA: the reference rounds every
// product and sum). Standard headers stay above, so none of their inline functions gets an AVX2
// body that the linker could pick for the rest of the library.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

#include "kernels/compress/codec_driver.h"

namespace chorus::kernels::avx2_codec {
namespace {

using codec::Byte;

CHORUS_CODEC_INLINE __m256i splat32(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
CHORUS_CODEC_INLINE __m128i splat16(uint16_t v) { return _mm_set1_epi16(static_cast<short>(v)); }

CHORUS_CODEC_INLINE __m256i fmix32(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, splat32(0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, splat32(0xc2b2ae35u));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// The nearest-even encoders need no saturation: every element they see is q = x * (1/s) of a
// finite block, |x| <= amax. With FP32 scales s = amax / fmax (or FLT_MIN, larger), 1/s and
// x * (1/s) each rounded once: |q| <= fmax * (1 + 2^-24)^3 < fmax * (1 + 2^-22), far below the
// midpoint between fmax and the next code step (fmax * (1 + 1/28) for E4M3, (1 + 1/14) for
// E5M2), so q rounds to at most kMaxCode; with UE8M0 scales |q| <= fmax exactly. (Stochastic
// rounding can round such a q up, and saturates.)

// The fp8 code magnitudes of 8 floats' bits abs (sign cleared), each at least 2^(1 - bias) (a
// normal code), round to nearest even, as Fp8Format::encode: rounding the float's own bits to
// kMan fraction bits (add half a code step minus one plus the lowest kept bit: ties go to even)
// leaves exponent and fraction side by side, a carry bumping the exponent as in the reference;
// shifting and rebiasing gives the code.
template <class Fmt>
CHORUS_CODEC_INLINE __m256i normal_codes_rne(__m256i abs) {
  constexpr int kShift = 23 - Fmt::kMan;
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(abs, kShift), splat32(1));
  // The rebias is subtracted before the shift (a multiple of 2^kShift; normal lanes stay >= 0).
  const uint32_t bias_half = ((1u << (kShift - 1)) - 1) -
                             (static_cast<uint32_t>(127 - Fmt::kBias) << 23);
  return _mm256_srli_epi32(_mm256_add_epi32(abs, _mm256_add_epi32(lsb, splat32(bias_half))),
                           kShift);
}

// 8 finite floats -> 8 fp8 codes (low bytes of 32-bit lanes), round to nearest even, as
// Fp8Format::encode for the scaled elements of a block (no saturation: see above). Normal codes
// as normal_codes_rne; subnormal codes: |x| * 2^(bias-1+kMan) (exact) rounded to an integer,
// ties to even (vroundps with an explicit mode); a subnormal rounding up to 2^kMan is the
// smallest normal code. The sign is copied. x must be finite (the codecs handle non-finite
// blocks before: Fp8Format::encode's NaN case is not here).
template <class Fmt>
CHORUS_CODEC_INLINE __m256i f32_to_fp8_rne(__m256 x) {
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan)
                                       << 23;
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, splat32(0x7fffffff));
  __m256i code = normal_codes_rne<Fmt>(abs);
  const __m256i normal = _mm256_cmpgt_epi32(abs, splat32(kMinNormal - 1));
  if (_mm256_movemask_ps(_mm256_castsi256_ps(normal)) != 0xff) {  // rare in gradients
    const __m256 scaled =
        _mm256_mul_ps(_mm256_castsi256_ps(abs), _mm256_castsi256_ps(splat32(kSubnormalScale)));
    const __m256i subnormal = _mm256_cvttps_epi32(
        _mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    code = _mm256_blendv_epi8(subnormal, code, normal);
  }
  return _mm256_or_si256(code, _mm256_srli_epi32(_mm256_andnot_si256(abs, u), 24));
}

// 8 floats -> 8 fp8 codes, stochastic rounding with the words r, as codec::encode_stochastic:
// normal codes add the low 23-kMan bits of r below the kept fraction and truncate; subnormal
// codes truncate |x| * 2^(bias-1+kMan) + (r >> 8) * 2^-24 (one rounded float addition; the
// conversion of r >> 8 < 2^24 and its scaling are exact); float subnormals give +-0.
template <class Fmt>
CHORUS_CODEC_INLINE __m256i f32_to_fp8_sr(__m256 x, __m256i r) {
  constexpr int kShift = 23 - Fmt::kMan;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan)
                                       << 23;
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, splat32(0x7fffffff));
  const __m256i dither = _mm256_and_si256(r, splat32((1u << kShift) - 1));
  const uint32_t rebias = static_cast<uint32_t>(127 - Fmt::kBias) << 23;  // before the shift
  __m256i code = _mm256_srli_epi32(
      _mm256_add_epi32(abs, _mm256_sub_epi32(dither, splat32(rebias))), kShift);
  const __m256i normal = _mm256_cmpgt_epi32(abs, splat32(kMinNormal - 1));
  if (_mm256_movemask_ps(_mm256_castsi256_ps(normal)) != 0xff) {  // rare in gradients
    const __m256 scaled =
        _mm256_mul_ps(_mm256_castsi256_ps(abs), _mm256_castsi256_ps(splat32(kSubnormalScale)));
    const __m256 uniform =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(0x1p-24f));
    const __m256i subnormal = _mm256_cvttps_epi32(_mm256_add_ps(scaled, uniform));
    code = _mm256_blendv_epi8(subnormal, code, normal);
    code = _mm256_and_si256(code, _mm256_cmpgt_epi32(abs, splat32(0x007fffff)));
  }
  code = _mm256_min_epu32(code, splat32(Fmt::kMaxCode));
  return _mm256_or_si256(code, _mm256_srli_epi32(_mm256_andnot_si256(abs, u), 24));
}

// The low bytes of 8 32-bit lanes, in order, as 8 bytes at p.
CHORUS_CODEC_INLINE void store_low_bytes(Byte* p, __m256i v) {
  const __m256i gather = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1);
  const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, gather),
                                                     _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// 8 fp8 codes -> 8 halves: e5m2 is the top byte of a half. e4m3 sign-extended to 16 bits and
// shifted left by 7 has its magnitude where a half's is, with a bias of 15 instead of 7, so the
// half is the value / 256 (exact, subnormals included: a half subnormal is a normal float), and
// its sign in bit 15, with one extension bit to clear (bit 14). e4m3's NaN code (magnitude 0x7f,
// the half 0x3f80) becomes the half NaN 0x7f80.
template <class Fmt>
CHORUS_CODEC_INLINE __m128i fp8_to_half8(__m128i codes) {
  if constexpr (Fmt::kHasInf) {
    return _mm_slli_epi16(_mm_cvtepu8_epi16(codes), 8);
  } else {
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7), splat16(0xbfff));
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, splat16(0x7fff)), splat16(0x3f80));
    return _mm_or_si128(h, _mm_and_si128(nan, splat16(0x4000)));
  }
}

// 8 e4m3 codes, none of them NaN -> their values / 256 (fp8_to_half8 without the NaN fix).
CHORUS_CODEC_INLINE __m256 e4m3_plain8(const Byte* p) {
  const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7), splat16(0xbfff)));
}

// 8 floats -> 8 bfloat16 as float_to_bf16: a NaN becomes its top half with the quiet bit set;
// anything else rounds to nearest even by adding 0x7fff plus the lowest kept bit.
CHORUS_CODEC_INLINE __m128i f32_to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, splat32(0x7fffffff)), splat32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), splat32(0x40));
  const __m256i lanes = _mm256_blendv_epi8(rounded, quiet, nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
}

struct Lanes {
  static constexpr size_t kWidth = 8;
  using F = __m256;
  using I = __m256i;

  template <DataType S>
  CHORUS_CODEC_INLINE static F load(const Byte* p) {
    if constexpr (S == DataType::kFloat32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else if constexpr (S == DataType::kBfloat16) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
  }
  CHORUS_CODEC_INLINE static I zero() { return _mm256_setzero_si256(); }
  CHORUS_CODEC_INLINE static I max_u32(I a, I b) { return _mm256_max_epu32(a, b); }
  CHORUS_CODEC_INLINE static I max_abs(I a, F x) {
    return _mm256_max_epu32(a, _mm256_and_si256(_mm256_castps_si256(x), splat32(0x7fffffff)));
  }
  // Lane j: the largest lane of a[j]. Three halving steps, each pairing two vectors and keeping
  // the larger of their two halves (128, 64 bits, then single lanes); after the last, lane
  // 4c + k holds block c + 2k, and a permute restores block order. 22 ops for 8 blocks.
  CHORUS_CODEC_INLINE static I hmax_each(const I* a) {
    I r1[4], r2[2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {  // half 0: block 2j, half 1: block 2j + 1
      r1[j] = _mm256_max_epu32(_mm256_permute2x128_si256(a[2 * j], a[2 * j + 1], 0x20),
                               _mm256_permute2x128_si256(a[2 * j], a[2 * j + 1], 0x31));
    }
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {  // half c: qword 0 block 4j + c, qword 1 block 4j + 2 + c
      r2[j] = _mm256_max_epu32(_mm256_unpacklo_epi64(r1[2 * j], r1[2 * j + 1]),
                               _mm256_unpackhi_epi64(r1[2 * j], r1[2 * j + 1]));
    }
    const __m256 x = _mm256_castsi256_ps(r2[0]), y = _mm256_castsi256_ps(r2[1]);
    const __m256i m = _mm256_max_epu32(
        _mm256_castps_si256(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0))),
        _mm256_castps_si256(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1))));
    return _mm256_permutevar8x32_epi32(m, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  CHORUS_CODEC_INLINE static void store_u32(uint32_t* p, I v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  // codec::block_scale for FP32 scales, 8 blocks at once: the same divisions (vdivps rounds as
  // divss does) and the same FLT_MIN floor (s is never NaN: non-finite lanes divide zero).
  // Unsigned amax < 0x7f800000 is a signed compare: both sides are below 2^31 or amax is NaN.
  template <class Fmt>
  CHORUS_CODEC_INLINE static void fp32_scales(I amax, uint32_t* bits, float* inv) {
    const __m256i finite = _mm256_andnot_si256(_mm256_cmpgt_epi32(amax, splat32(0x7f7fffffu)),
                                               _mm256_cmpgt_epi32(splat32(0x7f800000u), amax));
    const __m256 a = _mm256_castsi256_ps(_mm256_and_si256(finite, amax));
    const __m256 s = _mm256_max_ps(_mm256_div_ps(a, _mm256_set1_ps(Fmt::kMaxValue)),
                                   _mm256_set1_ps(FLT_MIN));
    _mm256_storeu_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), s));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits),
                        _mm256_blendv_epi8(splat32(codec::kNanScaleBits), _mm256_castps_si256(s),
                                           finite));
  }
  CHORUS_CODEC_INLINE static F splat(float f) { return _mm256_set1_ps(f); }
  CHORUS_CODEC_INLINE static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  CHORUS_CODEC_INLINE static F add(F a, F b) { return _mm256_add_ps(a, b); }
  // vminps/vmaxps return their second operand when either is NaN.
  CHORUS_CODEC_INLINE static F clamp(F v, F hi, F lo) {
    return _mm256_max_ps(lo, _mm256_min_ps(hi, v));
  }
  CHORUS_CODEC_INLINE static F load_f32(const Byte* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  CHORUS_CODEC_INLINE static void store_f32(Byte* p, F v) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  }

  template <class Fmt>
  CHORUS_CODEC_INLINE static I codes_rne(F q) {
    return f32_to_fp8_rne<Fmt>(q);
  }
  template <class Fmt>
  CHORUS_CODEC_INLINE static I codes_sr(F q, I r) {
    return f32_to_fp8_sr<Fmt>(q, r);
  }
  CHORUS_CODEC_INLINE static void store_codes(Byte* p, I c) { store_low_bytes(p, c); }
  // 32 codes (each in [0, 255]) in order: the packs work per 128-bit half, leaving dword k
  // holding 4 codes of c[k % 4] (half k / 4); the permute restores element order.
  CHORUS_CODEC_INLINE static void store_codes4(Byte* p, I c0, I c1, I c2, I c3) {
    const __m256i bytes =
        _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  // 32 codes, nearest even. When all are normal codes (one test for the four vectors), their
  // magnitudes and their signs are packed separately: signed saturating packs of the float bits
  // themselves keep each one's sign in bit 7 of its byte, in the same byte order as the
  // magnitudes' packs. Otherwise one vector at a time, as f32_to_fp8_rne.
  template <class Fmt>
  CHORUS_CODEC_INLINE static void store_rne4(Byte* p, F q0, F q1, F q2, F q3) {
    constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
    const __m256i u0 = _mm256_castps_si256(q0), u1 = _mm256_castps_si256(q1);
    const __m256i u2 = _mm256_castps_si256(q2), u3 = _mm256_castps_si256(q3);
    const __m256i a0 = _mm256_and_si256(u0, splat32(0x7fffffff));
    const __m256i a1 = _mm256_and_si256(u1, splat32(0x7fffffff));
    const __m256i a2 = _mm256_and_si256(u2, splat32(0x7fffffff));
    const __m256i a3 = _mm256_and_si256(u3, splat32(0x7fffffff));
    const __m256i least = _mm256_min_epu32(_mm256_min_epu32(a0, a1), _mm256_min_epu32(a2, a3));
    const __m256i normal = _mm256_cmpgt_epi32(least, splat32(kMinNormal - 1));
    if (__builtin_expect(_mm256_movemask_ps(_mm256_castsi256_ps(normal)) != 0xff, 0)) {
      store_codes4(p, f32_to_fp8_rne<Fmt>(q0), f32_to_fp8_rne<Fmt>(q1), f32_to_fp8_rne<Fmt>(q2),
                   f32_to_fp8_rne<Fmt>(q3));
      return;
    }
    const __m256i mag = _mm256_packus_epi16(
        _mm256_packus_epi32(normal_codes_rne<Fmt>(a0), normal_codes_rne<Fmt>(a1)),
        _mm256_packus_epi32(normal_codes_rne<Fmt>(a2), normal_codes_rne<Fmt>(a3)));
    const __m256i sign = _mm256_packs_epi16(_mm256_packs_epi32(u0, u1), _mm256_packs_epi32(u2, u3));
    const __m256i bytes = _mm256_or_si256(mag, _mm256_andnot_si256(_mm256_set1_epi8(0x7f), sign));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  // Unsigned idx < lo is a signed compare after flipping both sign bits.
  CHORUS_CODEC_INLINE static I random_one_key(uint32_t first, uint32_t k0) {
    const __m256i idx = _mm256_add_epi32(splat32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return fmix32(_mm256_xor_si256(idx, splat32(k0)));
  }
  CHORUS_CODEC_INLINE static I random(uint32_t first, uint32_t lo, uint32_t k0, uint32_t k1) {
    const __m256i idx = _mm256_add_epi32(splat32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i flip = splat32(0x80000000u);
    const __m256i wrapped =
        _mm256_cmpgt_epi32(_mm256_xor_si256(splat32(lo), flip), _mm256_xor_si256(idx, flip));
    const __m256i key = _mm256_blendv_epi8(splat32(k0), splat32(k1), wrapped);
    return fmix32(_mm256_xor_si256(idx, key));
  }

  template <class Fmt>
  CHORUS_CODEC_INLINE static F load_codes(const Byte* p) {
    return _mm256_cvtph_ps(fp8_to_half8<Fmt>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  template <class Fmt>
  // 32 codes. e4m3: the NaN codes are looked for once in the 32 (rare: only a block holding an
  // Inf or NaN has them), so that the halves of the codes without one take 3 ops per vector.
  CHORUS_CODEC_INLINE static void load_codes4(const Byte* p, F& v0, F& v1, F& v2, F& v3) {
    if constexpr (!Fmt::kHasInf) {
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i ones = _mm256_set1_epi8(-1);
      const __m256i nan = _mm256_cmpeq_epi8(_mm256_or_si256(codes, _mm256_set1_epi8(-128)), ones);
      if (_mm256_testz_si256(nan, nan)) {
        v0 = e4m3_plain8(p);
        v1 = e4m3_plain8(p + 8);
        v2 = e4m3_plain8(p + 16);
        v3 = e4m3_plain8(p + 24);
        return;
      }
    }
    v0 = load_codes<Fmt>(p);
    v1 = load_codes<Fmt>(p + 8);
    v2 = load_codes<Fmt>(p + 16);
    v3 = load_codes<Fmt>(p + 24);
  }
  template <DataType S>
  CHORUS_CODEC_INLINE static void store_out(Byte* p, F v) {
    if constexpr (S == DataType::kFloat32) {
      _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
    } else if constexpr (S == DataType::kBfloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), f32_to_bf16(v));
    } else {
      // vcvtps2ph rounds to nearest even, overflows to inf and keeps NaNs NaN, as float_to_half.
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
};

}  // namespace
}  // namespace chorus::kernels::avx2_codec

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#include "kernels/compress/codec_table.h"

namespace chorus::kernels {
namespace {

CodecTable make_avx2_codecs() {
  CodecTable table{};
  table.isa = "avx2";
  codec::fill_codec_table<avx2_codec::Lanes>(table);
  return table;
}

}  // namespace

const CodecTable& avx2_codecs() {
  static const CodecTable table = make_avx2_codecs();
  return table;
}

}  // namespace chorus::kernels

#endif  // __x86_64__
