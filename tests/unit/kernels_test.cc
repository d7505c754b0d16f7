// SPDX-License-Identifier: Apache-2.0
// Kernels: floating-point conversions (exhaustively where the format is small) and every
// reduction operator of every datatype against an independent reference computed in double.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

// Reference decoder written from the format definitions, independent of convert.h.
double ref_decode_float(uint32_t bits, int exp_bits, int man_bits, bool has_inf) {
  int bias = (1 << (exp_bits - 1)) - 1;
  uint32_t sign = bits >> (exp_bits + man_bits);
  uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  uint32_t man = bits & ((1u << man_bits) - 1);
  double s = sign ? -1.0 : 1.0;
  uint32_t max_exp = (1u << exp_bits) - 1;
  if (has_inf && exp == max_exp) return man ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (!has_inf && exp == max_exp && man == (1u << man_bits) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return s * std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  return s * std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -man_bits), static_cast<int>(exp) - bias);
}

TEST_CASE("fp8 e4m3 decodes every code as the format defines", "[unit][kernels]") {
  for (uint32_t c = 0; c < 256; ++c) {
    double want = ref_decode_float(c, 4, 3, false);
    float got = fp8e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(got == want);
      REQUIRE(float_to_fp8e4m3(got) == c);  // exact round trip (-0 keeps its sign)
    }
  }
  REQUIRE(fp8e4m3_to_float(0x7e) == 448.0f);
}

TEST_CASE("fp8 e5m2 decodes every code as the format defines", "[unit][kernels]") {
  for (uint32_t c = 0; c < 256; ++c) {
    double want = ref_decode_float(c, 5, 2, true);
    float got = fp8e5m2_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(got == want);
      if (!std::isinf(want)) REQUIRE(float_to_fp8e5m2(got) == c);
    }
  }
  REQUIRE(fp8e5m2_to_float(0x7b) == 57344.0f);
}

TEST_CASE("fp8 encoding rounds to nearest even and saturates", "[unit][kernels]") {
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(1.0625f)) == 1.0f);    // tie -> even mantissa
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(1.1875f)) == 1.25f);   // tie -> even (up)
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(1.07f)) == 1.125f);    // above the tie
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(1e6f)) == 448.0f);     // saturate
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(-INFINITY)) == -448.0f);
  REQUIRE(std::isnan(fp8e4m3_to_float(float_to_fp8e4m3(NAN))));
  REQUIRE(fp8e5m2_to_float(float_to_fp8e5m2(1e9f)) == 57344.0f);
  // Smallest subnormals and underflow.
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(std::ldexp(1.0f, -9))) == std::ldexp(1.0f, -9));
  REQUIRE(fp8e4m3_to_float(float_to_fp8e4m3(std::ldexp(1.0f, -11))) == 0.0f);
  REQUIRE(fp8e5m2_to_float(float_to_fp8e5m2(std::ldexp(1.0f, -16))) == std::ldexp(1.0f, -16));
  // Random values round to the nearest representable value (compared with all 256 codes).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-500.0f, 500.0f);
  for (int i = 0; i < 2000; ++i) {
    float x = dist(rng);
    float y = fp8e4m3_to_float(float_to_fp8e4m3(x));
    float clamped = std::fmax(std::fmin(x, 448.0f), -448.0f);
    for (uint32_t c = 0; c < 256; ++c) {
      float v = fp8e4m3_to_float(static_cast<uint8_t>(c));
      if (!std::isnan(v)) REQUIRE(std::fabs(v - clamped) >= std::fabs(y - clamped));
    }
  }
}

TEST_CASE("half conversion is exact on every code and rounds to nearest even", "[unit][kernels]") {
  for (uint32_t c = 0; c < 65536; ++c) {
    double want = ref_decode_float(c, 5, 10, true);
    float got = half_to_float(static_cast<uint16_t>(c));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(got == want);
      REQUIRE(float_to_half(got) == c);
    }
  }
  REQUIRE(half_to_float(float_to_half(2049.0f)) == 2048.0f);  // tie -> even
  REQUIRE(half_to_float(float_to_half(2051.0f)) == 2052.0f);
  REQUIRE(std::isinf(half_to_float(float_to_half(65520.0f))));
  REQUIRE(half_to_float(float_to_half(65519.0f)) == 65504.0f);
  REQUIRE(half_to_float(float_to_half(std::ldexp(1.0f, -25))) == 0.0f);  // tie -> even (zero)
  REQUIRE(half_to_float(float_to_half(std::ldexp(1.5f, -25))) == std::ldexp(1.0f, -24));
}

TEST_CASE("bfloat16 conversion is exact on every code and rounds to nearest even", "[unit][kernels]") {
  for (uint32_t c = 0; c < 65536; ++c) {
    double want = ref_decode_float(c, 8, 7, true);
    float got = bf16_to_float(static_cast<uint16_t>(c));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(got == want);
      REQUIRE(float_to_bf16(got) == c);
    }
  }
  REQUIRE(bf16_to_float(float_to_bf16(257.0f)) == 256.0f);  // tie -> even
  REQUIRE(bf16_to_float(float_to_bf16(259.0f)) == 260.0f);
}

// ---- Reductions ----

double load(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kUint8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kUint32: return static_cast<const uint32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUint64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DataType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kBfloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat8e4m3: return fp8e4m3_to_float(static_cast<const uint8_t*>(p)[i]);
    case DataType::kFloat8e5m2: return fp8e5m2_to_float(static_cast<const uint8_t*>(p)[i]);
  }
  return 0;
}

// Stores v rounded as the library must: integers wrap, the reduced float types go through fp32
// (they accumulate in fp32) and round to nearest even.
void store(DataType t, void* p, size_t i, double v) {
  auto wrap = [](double x) { return static_cast<uint64_t>(static_cast<int64_t>(x)); };
  switch (t) {
    case DataType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(wrap(v)); break;
    case DataType::kUint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(wrap(v)); break;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(wrap(v)); break;
    case DataType::kUint32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(wrap(v)); break;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DataType::kUint64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); break;
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kBfloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DataType::kFloat8e4m3: static_cast<uint8_t*>(p)[i] = float_to_fp8e4m3(static_cast<float>(v)); break;
    case DataType::kFloat8e5m2: static_cast<uint8_t*>(p)[i] = float_to_fp8e5m2(static_cast<float>(v)); break;
  }
}

double apply(ReduceOp op, double a, double b, bool fp32) {
  double r = 0;
  switch (op) {
    case ReduceOp::kSum: r = a + b; break;
    case ReduceOp::kProd: r = a * b; break;
    case ReduceOp::kMax: r = std::max(a, b); break;
    case ReduceOp::kMin: r = std::min(a, b); break;
  }
  return fp32 ? static_cast<float>(r) : r;
}

struct TypeRange {
  DataType type;
  double lo, hi;
};

TEST_CASE("every reduction kernel matches the reference for every datatype", "[unit][kernels]") {
  const std::vector<TypeRange> types = {
      {DataType::kInt8, -11, 11},        {DataType::kUint8, 0, 15},        {DataType::kInt32, -1000, 1000},
      {DataType::kUint32, 0, 60000},     {DataType::kInt64, -1e6, 1e6},    {DataType::kUint64, 0, 1e6},
      {DataType::kFloat16, -60, 60},     {DataType::kFloat32, -1e3, 1e3},  {DataType::kFloat64, -1e3, 1e3},
      {DataType::kBfloat16, -60, 60},    {DataType::kFloat8e4m3, -20, 20}, {DataType::kFloat8e5m2, -20, 20}};
  std::mt19937 rng(42);
  for (const auto& ti : types) {
    const size_t es = datatype_size(ti.type);
    const bool is_float = datatype_is_float(ti.type);
    const bool fp32 = is_float && ti.type != DataType::kFloat64;
    for (int op_i = 0; op_i < kNumReduceOps; ++op_i) {
      auto op = static_cast<ReduceOp>(op_i);
      for (size_t count : {0, 1, 7, 31, 64, 1000, 4099}) {
        std::vector<unsigned char> a(count * es + 16), b(count * es + 16), d(count * es + 16), w(count * es + 16);
        std::uniform_real_distribution<double> dist(ti.lo, ti.hi);
        for (size_t i = 0; i < count; ++i) {
          double x = dist(rng), y = dist(rng);
          if (!is_float) {
            x = std::round(x);
            y = std::round(y);
          }
          store(ti.type, a.data(), i, x);
          store(ti.type, b.data(), i, y);
        }
        for (size_t i = 0; i < count; ++i)
          store(ti.type, w.data(), i, apply(op, load(ti.type, a.data(), i), load(ti.type, b.data(), i), fp32));
        INFO(datatype_name(ti.type) << " op " << op_i << " count " << count);
        reduce_fn(ti.type, op)(d.data(), a.data(), b.data(), count);
        REQUIRE(std::memcmp(d.data(), w.data(), count * es) == 0);
        std::vector<unsigned char> a2 = a;  // in place on the first operand
        reduce_fn(ti.type, op)(a2.data(), a2.data(), b.data(), count);
        REQUIRE(std::memcmp(a2.data(), w.data(), count * es) == 0);
        std::vector<unsigned char> b2 = b;  // in place on the second operand
        reduce_fn(ti.type, op)(b2.data(), a.data(), b2.data(), count);
        REQUIRE(std::memcmp(b2.data(), w.data(), count * es) == 0);
        if (count > 1) {  // unaligned pointers
          reduce_fn(ti.type, op)(d.data() + es, a.data() + es, b.data() + es, count - 1);
          REQUIRE(std::memcmp(d.data() + es, w.data() + es, (count - 1) * es) == 0);
        }
      }
    }
  }
}

TEST_CASE("scale and divide kernels match the reference", "[unit][kernels]") {
  for (int t = 0; t < kNumDataTypes; ++t) {
    auto type = static_cast<DataType>(t);
    const size_t es = datatype_size(type);
    const size_t count = 257;
    std::vector<unsigned char> src(count * es), dst(count * es), want(count * es), scalar(8);
    for (size_t i = 0; i < count; ++i) store(type, src.data(), i, static_cast<double>(i % 8));
    store(type, scalar.data(), 0, 2.0);
    for (size_t i = 0; i < count; ++i) store(type, want.data(), i, (i % 8) * 2.0);
    scale_fn(type)(dst.data(), src.data(), count, scalar.data());
    INFO(datatype_name(type));
    REQUIRE(std::memcmp(dst.data(), want.data(), count * es) == 0);
    // Divide by 3: integers truncate, floats divide in fp32 (fp64 for double) and round once.
    for (size_t i = 0; i < count; ++i) {
      double v = (i % 8) * 2.0;
      double q = !datatype_is_float(type)     ? std::trunc(v / 3)
                 : type == DataType::kFloat64 ? v / 3
                                              : static_cast<double>(static_cast<float>(v) / 3.0f);
      store(type, want.data(), i, q);
    }
    divide_fn(type)(dst.data(), count, 3);
    REQUIRE(std::memcmp(dst.data(), want.data(), count * es) == 0);
  }
}

TEST_CASE("integer averages divide by the rank count itself, never wrapped", "[unit][kernels]") {
  int8_t s8[4] = {127, -128, 100, -5};
  divide_fn(DataType::kInt8)(s8, 4, 200);  // 200 wrapped to int8 would be -56
  CHECK((s8[0] == 0 && s8[1] == 0 && s8[2] == 0 && s8[3] == 0));
  uint8_t u8[2] = {255, 17};
  divide_fn(DataType::kUint8)(u8, 2, 256);  // 256 wrapped to uint8 would divide by zero
  CHECK((u8[0] == 0 && u8[1] == 0));
  int32_t s32[2] = {-7, 2000000000};
  divide_fn(DataType::kInt32)(s32, 2, 3000000000u);
  CHECK((s32[0] == 0 && s32[1] == 0));
  int8_t exact[2] = {-100, 99};
  divide_fn(DataType::kInt8)(exact, 2, 3);
  CHECK((exact[0] == -33 && exact[1] == 33));
}

}  // namespace
}  // namespace chorus::kernels
