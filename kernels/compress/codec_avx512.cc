// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/codec_avx512.cc
// The AVX-512 (F, BW, VL) block codecs: 16 elements per step, through the loops of
// codec_driver.h. Bit-identical to codec_scalar.cc; the lane derivations are in codec_avx2.cc.
#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics trip -W(maybe-)uninitialized (GCC bug 105593), see
// kernels/reduce/reduce_avx512.cc.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/compress/block_codec.h"
#include "kernels/compress/codec_common.h"
#include "kernels/fp8/convert.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512bw,avx512vl")
#endif

#include "kernels/compress/codec_driver.h"

namespace chorus::kernels::avx512_codec {
namespace {

using codec::Byte;

CHORUS_CODEC_INLINE __m512i splat32(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
CHORUS_CODEC_INLINE __m256i splat16(uint16_t v) { return _mm256_set1_epi16(static_cast<short>(v)); }

CHORUS_CODEC_INLINE __m512i fmix32(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, splat32(0x85ebca6bu));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, splat32(0xc2b2ae35u));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

// code | the sign of the float bits u, as 0x80 (vpternlogd: code | (u >> 24 & 0x80)).
CHORUS_CODEC_INLINE __m512i or_sign(__m512i code, __m512i u) {
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24), splat32(0x80), 0xf8);
}

// 16 finite floats -> 16 fp8 codes, round to nearest even, as Fp8Format::encode for the scaled
// elements of a block (see f32_to_fp8_rne in codec_avx2.cc: no saturation is needed).
template <class Fmt>
CHORUS_CODEC_INLINE __m512i f32_to_fp8_rne(__m512 x) {
  constexpr int kShift = 23 - Fmt::kMan;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan)
                                       << 23;
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, splat32(0x7fffffff));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs, kShift), splat32(1));
  // The rebias is subtracted before the shift (a multiple of 2^kShift; normal lanes stay >= 0).
  const uint32_t bias_half = ((1u << (kShift - 1)) - 1) -
                             (static_cast<uint32_t>(127 - Fmt::kBias) << 23);
  __m512i code = _mm512_srli_epi32(_mm512_add_epi32(abs, _mm512_add_epi32(lsb, splat32(bias_half))),
                                   kShift);
  const __mmask16 normal = _mm512_cmpgt_epi32_mask(abs, splat32(kMinNormal - 1));
  if (normal != 0xffff) {  // rare in gradients: zeros and values below 2^(1-bias) * scale
    const __m512 scaled =
        _mm512_mul_ps(_mm512_castsi512_ps(abs), _mm512_castsi512_ps(splat32(kSubnormalScale)));
    const __m512i subnormal =
        _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    code = _mm512_mask_blend_epi32(normal, subnormal, code);
  }
  return or_sign(code, u);
}

// A vector of 32 words v. The empty asm hides that it is a constant: GCC would otherwise
// rebuild it inside the encoding loop (a move and a broadcast each time) rather than keep it in
// a register or reload it as a memory operand.
template <uint16_t v>
struct Words {
  alignas(64) static constexpr uint16_t w[32] = {v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v,
                                                 v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v};
};
template <uint16_t v>
CHORUS_CODEC_INLINE __m512i words() {
  __m512i r = _mm512_load_si512(Words<v>::w);
  asm("" : "+v"(r));
  return r;
}

// 32 finite floats (x0, then x1) -> the magnitudes of their 32 fp8 codes in 16-bit lanes (mag)
// and the floats' top halves (hi: the sign is bit 15), round to nearest even, as f32_to_fp8_rne
// for the lanes whose codes are normal; false if some lane's is not (|x| below 2^(1 - bias)),
// and then `mag` is not to be used. Rounding to kMan fraction bits needs only the float's top 16
// bits (sign, exponent, 7 fraction bits: the kept bits and the round bit) and whether any bit
// below the round bit is set, so each float is narrowed to its top half with bit 0 or-ed with
// "the bottom half is not zero" (rounding to odd). The nearest-even sum of f32_to_fp8_rne,
// scaled down by 2^16, then gives the same codes for half the vector work.
template <class Fmt>
CHORUS_CODEC_INLINE bool f32_to_fp8_rne_x32(__m512 x0, __m512 x1, __m512i& mag, __m512i& hi) {
  constexpr int kShift = 7 - Fmt::kMan;
  constexpr uint16_t kMinNormal = static_cast<uint16_t>((128 - Fmt::kBias) << 7);
  // Half a code step minus one, less the rebias (a multiple of 2^kShift; mod 2^16).
  constexpr uint16_t kBiasHalf =
      static_cast<uint16_t>(((1u << (kShift - 1)) - 1) - (static_cast<uint32_t>(127 - Fmt::kBias) << 7));
  // Word 2j + 1 (2j) of x0:x1 is the top (bottom) half of float j.
  const __m512i odd = _mm512_setr_epi32(0x00030001, 0x00070005, 0x000b0009, 0x000f000d,
                                        0x00130011, 0x00170015, 0x001b0019, 0x001f001d,
                                        0x00230021, 0x00270025, 0x002b0029, 0x002f002d,
                                        0x00330031, 0x00370035, 0x003b0039, 0x003f003d);
  const __m512i u0 = _mm512_castps_si512(x0), u1 = _mm512_castps_si512(x1);
  hi = _mm512_permutex2var_epi16(u0, odd, u1);
  const __m512i lo = _mm512_permutex2var_epi16(u0, _mm512_sub_epi16(odd, words<1>()), u1);
  // (hi & 0x7fff) | min(lo, 1) (vpternlogd: a & c | b).
  const __m512i abs = _mm512_ternarylogic_epi32(hi, _mm512_min_epu16(lo, words<1>()),
                                                words<0x7fff>(), 0xec);
  // abs + kBiasHalf + the lowest kept bit (a masked add of 1 where that bit is set).
  const __mmask32 lsb = _mm512_test_epi16_mask(abs, words<1u << kShift>());
  const __m512i biased = _mm512_add_epi16(abs, words<kBiasHalf>());
  const __m512i sum = _mm512_mask_add_epi16(biased, lsb, biased, words<1>());
  mag = _mm512_srli_epi16(sum, kShift);  // at most kMaxCode (no saturation)
  return _mm512_cmpge_epu16_mask(abs, words<kMinNormal>()) == 0xffffffffu;
}

// 16 floats -> 16 fp8 codes, stochastic rounding with the words r, as
// codec::encode_stochastic (the derivation is there).
template <class Fmt>
CHORUS_CODEC_INLINE __m512i f32_to_fp8_sr(__m512 x, __m512i r) {
  constexpr int kShift = 23 - Fmt::kMan;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan)
                                       << 23;
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, splat32(0x7fffffff));
  const __m512i dither = _mm512_and_si512(r, splat32((1u << kShift) - 1));
  const uint32_t rebias = static_cast<uint32_t>(127 - Fmt::kBias) << 23;  // before the shift
  __m512i code = _mm512_srli_epi32(
      _mm512_add_epi32(abs, _mm512_sub_epi32(dither, splat32(rebias))), kShift);
  const __mmask16 normal = _mm512_cmpgt_epi32_mask(abs, splat32(kMinNormal - 1));
  if (normal != 0xffff) {  // rare in gradients: zeros and values below 2^(1-bias) * scale
    const __m512 scaled =
        _mm512_mul_ps(_mm512_castsi512_ps(abs), _mm512_castsi512_ps(splat32(kSubnormalScale)));
    const __m512 uniform =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 8)), _mm512_set1_ps(0x1p-24f));
    const __m512i subnormal = _mm512_cvttps_epi32(_mm512_add_ps(scaled, uniform));
    code = _mm512_mask_blend_epi32(normal, subnormal, code);
    code = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(abs, splat32(0x007fffff)), code);
  }
  code = _mm512_min_epu32(code, splat32(Fmt::kMaxCode));
  return or_sign(code, u);
}

// 16 fp8 codes -> 16 halves (see fp8_to_half8 in codec_avx2.cc): e5m2 is the top byte of a
// half; e4m3 sign-extended to 16 bits and shifted left by 7 has its magnitude in place (a half
// of value / 256) and its sign in bit 15, with one extension bit to clear (bit 14); e4m3's NaN
// code (magnitude 0x7f, the half 0x3f80) becomes the half NaN 0x7f80.
template <class Fmt>
CHORUS_CODEC_INLINE __m256i fp8_to_half16(__m128i codes) {
  if constexpr (Fmt::kHasInf) {
    return _mm256_slli_epi16(_mm256_cvtepu8_epi16(codes), 8);
  } else {
    const __m256i h =
        _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7), splat16(0xbfff));
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(codes, _mm_set1_epi8(-128)),
                                              _mm_set1_epi8(-1));
    return _mm256_mask_add_epi16(h, nan, h, splat16(0x4000));  // bit 14 is clear: an or
  }
}

// 16 e4m3 codes, none of them NaN -> their values / 256 (fp8_to_half16 without the NaN fix).
CHORUS_CODEC_INLINE __m512 e4m3_plain16(const Byte* p) {
  const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtph_ps(
      _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7), splat16(0xbfff)));
}

// 16 floats -> 16 bfloat16 as float_to_bf16 (NaNs quieted, the rest rounded to nearest even).
CHORUS_CODEC_INLINE __m256i f32_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, splat32(0x7fffffff)), splat32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), splat32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, splat32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), splat32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

struct Lanes {
  static constexpr size_t kWidth = 16;
  using F = __m512;
  using I = __m512i;

  template <DataType S>
  CHORUS_CODEC_INLINE static F load(const Byte* p) {
    if constexpr (S == DataType::kFloat32) {
      return _mm512_loadu_ps(p);
    } else if constexpr (S == DataType::kBfloat16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
  }
  CHORUS_CODEC_INLINE static I zero() { return _mm512_setzero_si512(); }
  CHORUS_CODEC_INLINE static I max_u32(I a, I b) { return _mm512_max_epu32(a, b); }
  CHORUS_CODEC_INLINE static I max_abs(I a, F x) {
    return _mm512_max_epu32(a, _mm512_and_si512(_mm512_castps_si512(x), splat32(0x7fffffff)));
  }
  // Lane j: the largest lane of a[j]. Four halving steps, each pairing two vectors and keeping
  // the larger of their two halves (256, 128, 64 bits, then single lanes); after the last, lane
  // 4c + k holds block c + 4k, and a permute restores block order. 46 ops for 16 blocks.
  CHORUS_CODEC_INLINE static I hmax_each(const I* a) {
    I r1[8], r2[4], r3[2];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {  // chunks 0-1: block 2j, 2-3: block 2j + 1
      r1[j] = _mm512_max_epu32(_mm512_shuffle_i64x2(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_i64x2(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {  // chunk c: block 4j + c
      r2[j] = _mm512_max_epu32(_mm512_shuffle_i64x2(r1[2 * j], r1[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_i64x2(r1[2 * j], r1[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {  // chunk c: qword 0 block 8j + c, qword 1 block 8j + 4 + c
      r3[j] = _mm512_max_epu32(_mm512_unpacklo_epi64(r2[2 * j], r2[2 * j + 1]),
                               _mm512_unpackhi_epi64(r2[2 * j], r2[2 * j + 1]));
    }
    const __m512 x = _mm512_castsi512_ps(r3[0]), y = _mm512_castsi512_ps(r3[1]);
    const __m512i m = _mm512_max_epu32(
        _mm512_castps_si512(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0))),
        _mm512_castps_si512(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1))));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(order, m);
  }
  CHORUS_CODEC_INLINE static void store_u32(uint32_t* p, I v) { _mm512_storeu_si512(p, v); }
  // codec::block_scale for FP32 scales, 16 blocks at once: the same divisions (vdivps rounds as
  // divss does) and the same FLT_MIN floor (s is never NaN: non-finite lanes divide zero).
  template <class Fmt>
  CHORUS_CODEC_INLINE static void fp32_scales(I amax, uint32_t* bits, float* inv) {
    const __mmask16 finite = _mm512_cmplt_epu32_mask(amax, splat32(0x7f800000u));
    const __m512 a = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(finite, amax));
    const __m512 s = _mm512_max_ps(_mm512_div_ps(a, _mm512_set1_ps(Fmt::kMaxValue)),
                                   _mm512_set1_ps(FLT_MIN));
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), s));
    _mm512_storeu_si512(bits, _mm512_mask_blend_epi32(finite, splat32(codec::kNanScaleBits),
                                                      _mm512_castps_si512(s)));
  }
  CHORUS_CODEC_INLINE static F splat(float f) { return _mm512_set1_ps(f); }
  // GCC writes _mm512_mul_ps and _mm512_add_ps as vector * and +, which it may contract into
  // an FMA (AVX-512F brings FMA; -ffp-contract=fast is GCC's C++ default): the reference rounds
  // the product and the sum separately. The _round_ forms are builtins it never contracts.
  CHORUS_CODEC_INLINE static F mul(F a, F b) {
    return _mm512_mul_round_ps(a, b, _MM_FROUND_CUR_DIRECTION);
  }
  CHORUS_CODEC_INLINE static F add(F a, F b) {
    return _mm512_add_round_ps(a, b, _MM_FROUND_CUR_DIRECTION);
  }
  // vminps/vmaxps return their second operand when either is NaN.
  CHORUS_CODEC_INLINE static F clamp(F v, F hi, F lo) {
    return _mm512_max_ps(lo, _mm512_min_ps(hi, v));
  }
  CHORUS_CODEC_INLINE static F load_f32(const Byte* p) { return _mm512_loadu_ps(p); }
  CHORUS_CODEC_INLINE static void store_f32(Byte* p, F v) { _mm512_storeu_ps(p, v); }

  template <class Fmt>
  CHORUS_CODEC_INLINE static I codes_rne(F q) {
    return f32_to_fp8_rne<Fmt>(q);
  }
  template <class Fmt>
  CHORUS_CODEC_INLINE static I codes_sr(F q, I r) {
    return f32_to_fp8_sr<Fmt>(q, r);
  }
  CHORUS_CODEC_INLINE static void store_codes(Byte* p, I c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(c));
  }
  // 64 codes (each in [0, 255]) in order: the packs work per 128-bit lane, leaving dword
  // 4 * lane + j holding 4 codes of c[j]; the permute restores element order. Four uops where
  // four vpmovdb take eight.
  CHORUS_CODEC_INLINE static void store_codes4(Byte* p, I c0, I c1, I c2, I c3) {
    const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(p, _mm512_permutexvar_epi32(order, bytes));
  }
  // 64 codes, nearest even: 32 at a time in 16-bit lanes when all are normal codes, else one
  // vector at a time. The magnitudes are packed to bytes, and so are the top halves of the
  // floats, by a signed saturating pack that keeps each one's sign in bit 7 (both packs leave 8
  // codes of q0:q1 then 8 of q2:q3 in each 128-bit lane; the qword permute restores element
  // order).
  template <class Fmt>
  CHORUS_CODEC_INLINE static void store_rne4(Byte* p, F q0, F q1, F q2, F q3) {
    __m512i m01, h01, m23, h23;
    const bool normal01 = f32_to_fp8_rne_x32<Fmt>(q0, q1, m01, h01);
    const bool normal23 = f32_to_fp8_rne_x32<Fmt>(q2, q3, m23, h23);
    if (__builtin_expect(normal01 && normal23, 1)) {
      // mag | (sign & 0x80) (vpternlogd: a | b & c).
      const __m512i bytes = _mm512_ternarylogic_epi32(
          _mm512_packus_epi16(m01, m23), _mm512_packs_epi16(h01, h23), words<0x8080>(), 0xf8);
      const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
      _mm512_storeu_si512(p, _mm512_permutexvar_epi64(order, bytes));
      return;
    }
    store_codes4(p, f32_to_fp8_rne<Fmt>(q0), f32_to_fp8_rne<Fmt>(q1), f32_to_fp8_rne<Fmt>(q2),
                 f32_to_fp8_rne<Fmt>(q3));
  }
  CHORUS_CODEC_INLINE static I random_one_key(uint32_t first, uint32_t k0) {
    const __m512i idx = _mm512_add_epi32(
        splat32(first), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return fmix32(_mm512_xor_si512(idx, splat32(k0)));
  }
  CHORUS_CODEC_INLINE static I random(uint32_t first, uint32_t lo, uint32_t k0, uint32_t k1) {
    const __m512i idx = _mm512_add_epi32(
        splat32(first), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __mmask16 wrapped = _mm512_cmplt_epu32_mask(idx, splat32(lo));
    const __m512i key = _mm512_mask_blend_epi32(wrapped, splat32(k0), splat32(k1));
    return fmix32(_mm512_xor_si512(idx, key));
  }

  template <class Fmt>
  CHORUS_CODEC_INLINE static F load_codes(const Byte* p) {
    return _mm512_cvtph_ps(fp8_to_half16<Fmt>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // 64 codes. e4m3: the NaN codes are looked for once in the 64 (rare: only a block holding an
  // Inf or NaN has them), so that the halves of the codes without one take 3 ops per vector.
  template <class Fmt>
  CHORUS_CODEC_INLINE static void load_codes4(const Byte* p, F& v0, F& v1, F& v2, F& v3) {
    if constexpr (!Fmt::kHasInf) {
      const __m512i codes = _mm512_loadu_si512(p);
      const __mmask64 nan = _mm512_cmpeq_epi8_mask(_mm512_or_si512(codes, _mm512_set1_epi8(-128)),
                                                   _mm512_set1_epi8(-1));
      if (nan == 0) {
        v0 = e4m3_plain16(p);
        v1 = e4m3_plain16(p + 16);
        v2 = e4m3_plain16(p + 32);
        v3 = e4m3_plain16(p + 48);
        return;
      }
    }
    v0 = load_codes<Fmt>(p);
    v1 = load_codes<Fmt>(p + 16);
    v2 = load_codes<Fmt>(p + 32);
    v3 = load_codes<Fmt>(p + 48);
  }
  template <DataType S>
  CHORUS_CODEC_INLINE static void store_out(Byte* p, F v) {
    if constexpr (S == DataType::kFloat32) {
      _mm512_storeu_ps(p, v);
    } else if constexpr (S == DataType::kBfloat16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), f32_to_bf16(v));
    } else {
      // vcvtps2ph rounds to nearest even, overflows to inf and keeps NaNs NaN, as float_to_half.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                          _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
};

}  // namespace
}  // namespace chorus::kernels::avx512_codec

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#include "kernels/compress/codec_table.h"

namespace chorus::kernels {
namespace {

CodecTable make_avx512_codecs() {
  CodecTable table{};
  table.isa = "avx512";
  codec::fill_codec_table<avx512_codec::Lanes>(table);
  return table;
}

}  // namespace

const CodecTable& avx512_codecs() {
  static const CodecTable table = make_avx512_codecs();
  return table;
}

}  // namespace chorus::kernels

#endif  // __x86_64__
