// SPDX-License-Identifier: Apache-2.0
// File: kernels/fp8/convert.h
// Scalar conversions between float and the 16- and 8-bit floating formats, all rounding to
// nearest even. FP8 follows the OCP 8-bit spec as NVIDIA's __nv_fp8 types do with saturation:
// e4m3 (bias 7, max 448, no infinity, 0x7f/0xff = NaN) and e5m2 (bias 15, max 57344). Values
// beyond the largest finite one, infinities included, saturate to it; NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace chorus::kernels {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bfloat16 ----
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- IEEE half ----
inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // Subnormal: value = man * 2^-24.
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}
inline uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): round abs * 2^24 to an integer, ties to even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    uint32_t exp = abs >> 23;
    uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 ... chosen so the result has 10 bits
    uint32_t rounded = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (rounded & 1u))) ++rounded;
    return static_cast<uint16_t>(sign | rounded);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15 and round
  return static_cast<uint16_t>(sign | (r >> 13));
}

// ---- FP8 ----
// A format with kExp exponent and kMan mantissa bits; kMaxCode is the largest finite magnitude.
template <int kExp, int kMan, uint8_t kMaxCode, uint8_t kNanCode>
struct Fp8Format {
  static constexpr int kBias = (1 << (kExp - 1)) - 1;

  static uint8_t encode(float f) {
    uint32_t u = float_bits(f);
    uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | kNanCode);
    if (abs == 0x7f800000u) return static_cast<uint8_t>(sign | kMaxCode);  // saturate infinity
    int exp = static_cast<int>(abs >> 23) - 127;
    uint32_t man = abs & 0x7fffffu;
    if ((abs >> 23) == 0) return sign;  // float subnormals are far below FP8's range
    man |= 0x800000u;                   // explicit leading one: value = man * 2^(exp - 23)
    uint32_t code;
    if (exp >= 1 - kBias) {
      // Normal: keep kMan fraction bits.
      int shift = 23 - kMan;
      uint32_t q = man >> shift;
      uint32_t rem = man & ((1u << shift) - 1);
      uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry to 2^(kMan+1)
      uint32_t biased = static_cast<uint32_t>(exp + kBias);
      if (q >> (kMan + 1)) {
        q >>= 1;
        ++biased;
      }
      if (biased > 255u) return static_cast<uint8_t>(sign | kMaxCode);
      code = (biased << kMan) | (q & ((1u << kMan) - 1));
    } else {
      // Subnormal: value = q * 2^(1 - kBias - kMan).
      int shift = (23 - kMan) + (1 - kBias - exp);
      if (shift > 24) return sign;  // below half the smallest subnormal
      uint32_t q = man >> shift;
      uint32_t rem = man & ((1u << shift) - 1);
      uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1u))) ++q;
      code = q;  // q == 2^kMan lands exactly on the smallest normal's code
    }
    if (code > kMaxCode) code = kMaxCode;
    return static_cast<uint8_t>(sign | code);
  }

  static float decode(uint8_t c) {
    uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
    uint32_t mag = c & 0x7fu;
    uint32_t exp = mag >> kMan;
    uint32_t man = mag & ((1u << kMan) - 1);
    if (kExp == 4 && mag == kNanCode) return bits_float(sign | 0x7fc00000u);
    if (kExp == 5 && exp == 31) return bits_float(sign | (man ? 0x7fc00000u : 0x7f800000u));
    float v;
    if (exp == 0) {
      v = static_cast<float>(man) * bits_float(static_cast<uint32_t>(127 + 1 - kBias - kMan) << 23);
    } else {
      v = bits_float(((exp - kBias + 127) << 23) | (man << (23 - kMan)));
    }
    return sign ? -v : v;
  }
};

using Fp8E4M3 = Fp8Format<4, 3, 0x7e, 0x7f>;
using Fp8E5M2 = Fp8Format<5, 2, 0x7b, 0x7f>;

inline float fp8e4m3_to_float(uint8_t c) { return Fp8E4M3::decode(c); }
inline uint8_t float_to_fp8e4m3(float f) { return Fp8E4M3::encode(f); }
inline float fp8e5m2_to_float(uint8_t c) { return Fp8E5M2::decode(c); }
inline uint8_t float_to_fp8e5m2(float f) { return Fp8E5M2::encode(f); }

}  // namespace chorus::kernels
