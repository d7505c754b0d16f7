// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/codec_common.h
// The per-block and per-element rules of the block codecs (block_codec.h), as plain scalar code:
// the reference kernels are built from them, and the SIMD kernels call the per-block ones (scale,
// random stream key) directly, so those are the same code on every ISA. Include it before an
// ISA's target pragma: its inline functions must keep the generic x86-64 body.
#pragma once

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/compress/block_codec.h"
#include "kernels/fp8/convert.h"

namespace chorus::kernels::codec {

using Byte = unsigned char;

// The FP8 formats: fmax = 1.75 * 2^kMaxExp is the largest finite value (mantissa bits 0x600000).
struct E4m3 {
  using Scalar = Fp8E4M3;
  static constexpr int kMan = 3;
  static constexpr int kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7e;
  static constexpr uint32_t kNanCode = 0x7f;
  static constexpr int kMaxExp = 8;
  static constexpr float kMaxValue = 448.0f;
  static constexpr bool kHasInf = false;
};
struct E5m2 {
  using Scalar = Fp8E5M2;
  static constexpr int kMan = 2;
  static constexpr int kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7b;
  static constexpr uint32_t kNanCode = 0x7f;
  static constexpr int kMaxExp = 15;
  static constexpr float kMaxValue = 57344.0f;
  static constexpr bool kHasInf = true;
};

constexpr size_t source_bytes(DataType s) { return s == DataType::kFloat32 ? 4 : 2; }
constexpr size_t scale_bytes(ScaleKind k) { return k == ScaleKind::kFloat32 ? 4 : 1; }
inline size_t num_blocks(size_t count, uint32_t block) { return (count + block - 1) / block; }

constexpr uint32_t kNanScaleBits = 0x7fc00000u;
constexpr uint8_t kNanScaleByte = 0xff;

// 2^e for e in [-127, 127] (2^-127 is a float subnormal).
inline float exp2_int(int e) {
  return e >= -126 ? bits_float(static_cast<uint32_t>(e + 127) << 23) : bits_float(0x00400000u);
}

// The smallest e with amax <= fmax * 2^e, clamped to [-127, 127]; amax_bits finite.
template <class Fmt>
int ue8m0_exponent(uint32_t amax_bits) {
  if (amax_bits < 0x00800000u) return -127;  // zero or float subnormal: below fmax * 2^-127
  const int exp = static_cast<int>(amax_bits >> 23) - 127;
  int e = exp - Fmt::kMaxExp + ((amax_bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return e;
}

struct BlockScale {
  bool finite;    // false: the block holds an Inf or NaN
  float inv;      // elements are encoded as code(x * inv)
  uint32_t bits;  // the stored scale: fp32 bits, or the UE8M0 byte
};

// The scale of a block whose largest |x| has the bits amax_bits (sign cleared; NaN compares
// above every infinity).
template <class Fmt, ScaleKind K>
BlockScale block_scale(uint32_t amax_bits) {
  if (amax_bits >= 0x7f800000u) {
    return {false, 0.0f, K == ScaleKind::kFloat32 ? kNanScaleBits : kNanScaleByte};
  }
  if constexpr (K == ScaleKind::kFloat32) {
    float s = bits_float(amax_bits) / Fmt::kMaxValue;
    if (s < FLT_MIN) s = FLT_MIN;  // an all-zero block, or one too small for a normal scale
    return {true, 1.0f / s, float_bits(s)};
  } else {
    const int e = ue8m0_exponent<Fmt>(amax_bits);
    return {true, exp2_int(-e), static_cast<uint32_t>(e + 127)};
  }
}

template <ScaleKind K>
void store_scale(Byte* scales, size_t b, uint32_t bits) {
  if constexpr (K == ScaleKind::kFloat32) {
    std::memcpy(scales + 4 * b, &bits, 4);
  } else {
    scales[b] = static_cast<Byte>(bits);
  }
}

// The multiplier of block b's codes (NaN for a non-finite block).
template <ScaleKind K>
float load_scale(const Byte* scales, size_t b) {
  if constexpr (K == ScaleKind::kFloat32) {
    uint32_t bits;
    std::memcpy(&bits, scales + 4 * b, 4);
    return bits_float(bits);
  } else {
    const Byte e = scales[b];
    if (e == kNanScaleByte) return bits_float(kNanScaleBits);
    return exp2_int(static_cast<int>(e) - 127);
  }
}

// Decoded values saturate at the largest finite value of the output type: a finite block whose
// amax lies within a code step of it may round up past it (FLT_MAX rounds to the code of 2^128
// with a UE8M0 scale), and must not decode to Inf. NaN passes through (see clamp()).
template <DataType S>
constexpr float kOutputMax = S == DataType::kFloat32    ? FLT_MAX
                             : S == DataType::kBfloat16 ? 0x1.fep127f
                                                        : 65504.0f;
template <DataType S>
float saturate(float v) {
  if (v > kOutputMax<S>) return kOutputMax<S>;
  if (v < -kOutputMax<S>) return -kOutputMax<S>;
  return v;
}

// ---- the stochastic rounding stream ---------------------------------------------------------

// MurmurHash3's 32-bit finaliser: a bijection with full avalanche.
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}
// The key of the 2^32 indices whose high half is `hi`.
inline uint32_t stream_key(uint64_t seed, uint32_t hi) {
  const uint32_t mixed = fmix32(static_cast<uint32_t>(seed >> 32) + hi * 0x9e3779b9u + 0x632be5abu);
  return fmix32(static_cast<uint32_t>(seed) ^ mixed);
}
// The random word of element index `index` (counter + i) of the stream `seed`.
inline uint32_t random_word(uint64_t seed, uint64_t index) {
  return fmix32(static_cast<uint32_t>(index) ^ stream_key(seed, static_cast<uint32_t>(index >> 32)));
}

// ---- stochastic rounding of one scaled element -----------------------------------------------

// q (finite, |q| <= about fmax) to an FP8 code, rounding up with probability equal to the
// fraction of a code step past the code below; r is the element's random word.
//   |q| >= 2^(1-bias) (normal codes): add the low 23-kMan bits of r to q's bits and truncate to
//     kMan fraction bits (a carry bumps the exponent, as in round to nearest).
//   float subnormal or zero q: the code is +-0, like the nearest-even encoder.
//   otherwise (subnormal codes): t = |q| * 2^(bias-1+kMan) (exact) + (r >> 8) * 2^-24, rounded
//     to nearest even as one float addition, truncated to an integer.
// Codes past kMaxCode saturate; the sign is copied.
template <class Fmt>
uint8_t encode_stochastic(float q, uint32_t r) {
  constexpr int kShift = 23 - Fmt::kMan;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(128 - Fmt::kBias) << 23;
  const uint32_t u = float_bits(q);
  const uint32_t abs = u & 0x7fffffffu;
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t code;
  if (abs < 0x00800000u) {
    code = 0;
  } else if (abs >= kMinNormal) {
    code = ((abs + (r & ((1u << kShift) - 1))) >> kShift) -
           (static_cast<uint32_t>(127 - Fmt::kBias) << Fmt::kMan);
  } else {
    const float scaled =
        bits_float(abs) * bits_float(static_cast<uint32_t>(127 + Fmt::kBias - 1 + Fmt::kMan) << 23);
    const float t = scaled + static_cast<float>(r >> 8) * 0x1p-24f;
    code = static_cast<uint32_t>(t);
  }
  if (code > Fmt::kMaxCode) code = Fmt::kMaxCode;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace chorus::kernels::codec
