// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/block_codec_test.cc
// The block-scaled FP8 codecs (kernels/compress/block_codec.h): every SIMD table this CPU runs
// against the scalar reference bit for bit (all sources, formats, scale kinds, roundings, block
// sizes, counts with short last blocks, unaligned pointers); the buffer layout and scale rules;
// round-trip error bounds; subnormals, saturation, Inf/NaN blocks; stochastic rounding's
// reproducibility and lack of bias. ISAs the CPU lacks are skipped with a WARN.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "kernels/compress/block_codec.h"
#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

using Bytes = std::vector<unsigned char>;

constexpr DataType kSources[] = {DataType::kFloat32, DataType::kBfloat16, DataType::kFloat16};
constexpr DataType kFormats[] = {DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr ScaleKind kScales[] = {ScaleKind::kFloat32, ScaleKind::kUe8m0};
constexpr Rounding kRoundings[] = {Rounding::kNearestEven, Rounding::kStochastic};
constexpr size_t kGuard = 7;  // bytes after every output that must stay untouched

std::vector<const CodecTable*> simd_tables() {
  std::vector<const CodecTable*> tables;
  for (const char* isa : {"avx2", "avx512"}) {
    if (const CodecTable* t = codecs_for(isa)) {
      tables.push_back(t);
    } else {
      WARN("skipping the " << isa << " codecs: this CPU does not support them");
    }
  }
  return tables;
}

size_t source_size(DataType s) { return s == DataType::kFloat32 ? 4 : 2; }

// The source element i of `src` widened to float (exactly).
float source_value(DataType s, const Bytes& src, size_t i) {
  if (s == DataType::kFloat32) {
    float f;
    std::memcpy(&f, src.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, src.data() + 2 * i, 2);
  return s == DataType::kBfloat16 ? bf16_to_float(h) : half_to_float(h);
}

void store_source(DataType s, Bytes& dst, size_t i, float f) {
  if (s == DataType::kFloat32) {
    std::memcpy(dst.data() + 4 * i, &f, 4);
  } else {
    const uint16_t h = s == DataType::kBfloat16 ? float_to_bf16(f) : float_to_half(f);
    std::memcpy(dst.data() + 2 * i, &h, 2);
  }
}

// Random inputs in runs of 1..300 elements of one kind: moderate values of one magnitude, wide
// ranges (fp8 subnormals after scaling), values with few mantissa bits (exact codes and ties),
// float or half subnormals, zeros, the largest finite values, and (with nonfinite) runs holding
// one Inf or NaN. Exponents stay within the source type's range.
Bytes random_source(DataType s, size_t count, std::mt19937_64& rng, bool nonfinite) {
  Bytes out(count * source_size(s) + kGuard);
  const int max_exp = s == DataType::kFloat16 ? 15 : 127;
  const int min_exp = s == DataType::kFloat16 ? -24 : s == DataType::kBfloat16 ? -133 : -149;
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  size_t i = 0;
  while (i < count) {
    const size_t run = std::min<size_t>(count - i, 1 + rng() % 300);
    const unsigned kind = static_cast<unsigned>(rng() % (nonfinite ? 9 : 8));
    const int top = static_cast<int>(rng() % 61) - 30;
    for (size_t k = 0; k < run; ++k, ++i) {
      const float sign = (rng() & 1) ? -1.0f : 1.0f;
      float v = 0.0f;
      switch (kind) {
        case 0:
        case 1: v = std::ldexp(unit(rng), top - static_cast<int>(rng() % 4)); break;
        case 2: v = std::ldexp(unit(rng), top - static_cast<int>(rng() % 24)); break;
        case 3: v = std::ldexp(static_cast<float>(16 + rng() % 16), top - static_cast<int>(rng() % 8)); break;
        case 4: v = std::ldexp(unit(rng), min_exp + static_cast<int>(rng() % 8)); break;
        case 5: v = (rng() % 4 == 0) ? std::ldexp(unit(rng), top) : 0.0f; break;
        case 6: v = std::ldexp(unit(rng), max_exp - static_cast<int>(rng() % 3)) * 0.999f; break;
        case 7: v = std::ldexp(unit(rng), top) * static_cast<float>(rng() % 3); break;
        default: v = std::ldexp(unit(rng), top); break;
      }
      v *= sign;
      if (!std::isfinite(v)) v = sign * (s == DataType::kFloat16 ? 65504.0f : FLT_MAX);
      store_source(s, out, i, v);
    }
    if (kind == 8) {  // one non-finite element somewhere in the run
      const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
      const size_t at = i - 1 - rng() % run;
      store_source(s, out, at, bad[rng() % 4]);
    }
  }
  for (size_t g = 0; g < kGuard; ++g) out[count * source_size(s) + g] = static_cast<unsigned char>(rng());
  return out;
}

bool nan_bits(DataType s, const unsigned char* p) {
  if (s == DataType::kFloat32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return s == DataType::kBfloat16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

// Empty when equal bit for bit (a NaN matching any NaN), else the first difference.
std::string compare_elements(DataType s, const Bytes& got, const Bytes& want, size_t count) {
  const size_t es = source_size(s);
  for (size_t i = 0; i < count; ++i) {
    const unsigned char* g = got.data() + i * es;
    const unsigned char* w = want.data() + i * es;
    if (nan_bits(s, w) ? nan_bits(s, g) : std::memcmp(g, w, es) == 0) continue;
    uint32_t gv = 0, wv = 0;
    std::memcpy(&gv, g, es);
    std::memcpy(&wv, w, es);
    std::ostringstream out;
    out << "element " << i << ": got 0x" << std::hex << gv << ", want 0x" << wv;
    return out.str();
  }
  for (size_t i = count * es; i < want.size(); ++i) {
    if (got[i] != want[i]) return "guard byte " + std::to_string(i - count * es) + " overwritten";
  }
  return {};
}

std::string describe(const BlockCodec& c) {
  std::ostringstream out;
  out << datatype_name(c.source) << "->" << datatype_name(c.format)
      << (c.scale == ScaleKind::kFloat32 ? " fp32-scale" : " ue8m0")
      << (c.rounding == Rounding::kNearestEven ? " rne" : " stochastic") << " block " << c.block;
  return out.str();
}

template <typename F>
void for_each_codec(uint32_t block, F&& fn) {
  for (DataType s : kSources) {
    for (DataType f : kFormats) {
      for (ScaleKind k : kScales) {
        for (Rounding r : kRoundings) fn(BlockCodec{s, f, k, r, block});
      }
    }
  }
}

// Encodes with `table` and the reference at byte offset `offset`; requires equal buffers, then
// decodes and accumulates the reference's buffer with both and requires equal results.
void check_against_reference(const CodecTable& table, const BlockCodec& codec, const Bytes& src,
                             size_t count, size_t offset, RandomStream rng,
                             std::mt19937_64& gen) {
  const CodecTable& ref = scalar_codecs();
  const size_t bytes = compressed_bytes(codec, count);
  Bytes want(offset + bytes + kGuard, 0x5a), got = want;
  Bytes in(offset + src.size());
  std::memcpy(in.data() + offset, src.data(), src.size());
  codec_encode_fn(ref, codec)(want.data() + offset, in.data() + offset, count, codec.block, rng);
  codec_encode_fn(table, codec)(got.data() + offset, in.data() + offset, count, codec.block, rng);
  REQUIRE(got == want);

  const size_t es = source_size(codec.source);
  Bytes want_out(offset + count * es + kGuard, 0xa5), got_out = want_out;
  codec_decode_fn(ref, codec)(want_out.data() + offset, want.data() + offset, count, codec.block);
  codec_decode_fn(table, codec)(got_out.data() + offset, want.data() + offset, count, codec.block);
  REQUIRE(compare_elements(codec.source, Bytes(got_out.begin() + offset, got_out.end()),
                           Bytes(want_out.begin() + offset, want_out.end()), count) == "");

  std::vector<float> acc(count + 2);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (float& a : acc) a = dist(gen);
  std::vector<float> acc_ref = acc;
  codec_accumulate_fn(ref, codec)(acc_ref.data() + 1, want.data() + offset, count, codec.block);
  codec_accumulate_fn(table, codec)(acc.data() + 1, want.data() + offset, count, codec.block);
  Bytes acc_bytes(acc.size() * 4), acc_ref_bytes(acc.size() * 4);
  std::memcpy(acc_bytes.data(), acc.data() + 1, (acc.size() - 1) * 4);
  std::memcpy(acc_ref_bytes.data(), acc_ref.data() + 1, (acc.size() - 1) * 4);
  REQUIRE(compare_elements(DataType::kFloat32, acc_bytes, acc_ref_bytes, count + 1) == "");
  REQUIRE(acc[0] == acc_ref[0]);
}

TEST_CASE("SIMD block codecs match the scalar reference bit for bit", "[unit][kernels][codec]") {
  const size_t counts[] = {0, 1, 7, 16, 31, 128, 129, 1000, 2053};
  const uint32_t blocks[] = {1, 8, 16, 33, 128, 256};
  std::mt19937_64 gen(2024);
  for (const CodecTable* table : simd_tables()) {
    for (size_t count : counts) {
      Bytes src[3];
      for (int s = 0; s < 3; ++s) src[s] = random_source(kSources[s], count, gen, true);
      for (uint32_t block : blocks) {
        for_each_codec(block, [&](const BlockCodec& codec) {
          const Bytes& in = src[codec_source_index(codec.source)];
          for (size_t offset : {0, 1}) {
            // Counters that cross 2^32 inside the call test the stream's high half.
            const RandomStream rng{gen(), offset == 0 ? gen() % 100000 : 0xffffffffull - 300};
            INFO(table->isa << " " << describe(codec) << " count " << count << " offset " << offset
                            << " counter " << rng.counter);
            check_against_reference(*table, codec, in, count, offset, rng, gen);
          }
        });
      }
    }
  }
}

TEST_CASE("SIMD decoders match the reference on arbitrary bytes", "[unit][kernels][codec]") {
  std::mt19937_64 gen(77);
  for (const CodecTable* table : simd_tables()) {
    for (uint32_t block : {16u, 100u, 128u}) {
      for_each_codec(block, [&](const BlockCodec& codec) {
        if (codec.rounding == Rounding::kStochastic) return;
        const size_t count = 3000;
        Bytes buf(compressed_bytes(codec, count));
        for (auto& b : buf) b = static_cast<unsigned char>(gen());
        if (codec.scale == ScaleKind::kFloat32) {
          // Scales across the whole range, large ones included (e4m3 cannot fold 2^8 into them).
          for (size_t b = 0; b < codec_num_blocks(codec, count); ++b) {
            const float s = std::ldexp(1.0f + static_cast<float>(gen() % 1000) / 1000.0f,
                                       static_cast<int>(gen() % 280) - 150);
            std::memcpy(buf.data() + 4 * b, &s, 4);
          }
        }
        INFO(table->isa << " " << describe(codec));
        const CodecTable& ref = scalar_codecs();
        const size_t es = source_size(codec.source);
        Bytes want(count * es + kGuard), got = want;
        codec_decode_fn(ref, codec)(want.data(), buf.data(), count, block);
        codec_decode_fn(*table, codec)(got.data(), buf.data(), count, block);
        REQUIRE(compare_elements(codec.source, got, want, count) == "");
        std::vector<float> acc(count, 1.0f), acc_ref(count, 1.0f);
        codec_accumulate_fn(ref, codec)(acc_ref.data(), buf.data(), count, block);
        codec_accumulate_fn(*table, codec)(acc.data(), buf.data(), count, block);
        Bytes a(count * 4), b(count * 4);
        std::memcpy(a.data(), acc.data(), count * 4);
        std::memcpy(b.data(), acc_ref.data(), count * 4);
        REQUIRE(compare_elements(DataType::kFloat32, a, b, count) == "");
      });
    }
  }
}

TEST_CASE("compressed sizes follow the layout", "[unit][kernels][codec]") {
  BlockCodec fp32{DataType::kFloat32, DataType::kFloat8e4m3, ScaleKind::kFloat32};
  BlockCodec ue8m0{DataType::kFloat32, DataType::kFloat8e4m3, ScaleKind::kUe8m0};
  REQUIRE(compressed_bytes(fp32, 0) == 0);
  REQUIRE(compressed_bytes(fp32, 1) == 5);
  REQUIRE(compressed_bytes(fp32, 128) == 132);
  REQUIRE(compressed_bytes(fp32, 129) == 137);
  REQUIRE(compressed_bytes(ue8m0, 129) == 131);
  // 25.78 % and 25.20 % of fp32.
  REQUIRE(compressed_bytes(fp32, 128000) == 132000);
  REQUIRE(compressed_bytes(ue8m0, 128000) == 129000);
  fp32.block = 7;
  REQUIRE(codec_num_blocks(fp32, 15) == 3);
  REQUIRE(compressed_bytes(fp32, 15) == 27);
  REQUIRE(block_codec_valid(fp32));
  fp32.block = 0;
  REQUIRE_FALSE(block_codec_valid(fp32));
  REQUIRE_FALSE(block_codec_valid(BlockCodec{DataType::kFloat64}));
  REQUIRE_FALSE(block_codec_valid(BlockCodec{DataType::kFloat32, DataType::kInt8}));
}

TEST_CASE("codec tables are complete and follow the kernel selection", "[unit][kernels][codec]") {
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    const CodecTable* t = codecs_for(isa);
    if (t == nullptr) continue;
    REQUIRE(std::string(t->isa) == isa);
    for (int s = 0; s < kNumCodecSources; ++s) {
      for (int f = 0; f < kNumFp8Formats; ++f) {
        for (int k = 0; k < kNumScaleKinds; ++k) {
          REQUIRE(t->decode[s][f][k] != nullptr);
          REQUIRE(t->accumulate[f][k] != nullptr);
          for (int r = 0; r < kNumRoundings; ++r) REQUIRE(t->encode[s][f][k][r] != nullptr);
        }
      }
    }
  }
  REQUIRE(codecs_for("SCALAR") == &scalar_codecs());
  REQUIRE(codecs_for("sse9") == nullptr);
  REQUIRE(std::string(codecs().isa) == kernels().isa);
}

struct Format {
  int man, bias;
  float max;
};
Format format_of(DataType f) {
  return f == DataType::kFloat8e4m3 ? Format{3, 7, 448.0f} : Format{2, 15, 57344.0f};
}

float block_scale_of(const BlockCodec& codec, const Bytes& buf, size_t b) {
  if (codec.scale == ScaleKind::kFloat32) {
    float s;
    std::memcpy(&s, buf.data() + 4 * b, 4);
    return s;
  }
  return buf[b] == 0xff ? NAN : std::ldexp(1.0f, static_cast<int>(buf[b]) - 127);
}

// Round trip through codecs(): the stored scale follows the documented rule, Inf/NaN blocks
// decode to NaN, and every other element is within the bound derived in README.md:
//   nearest even  |x' - x| <= (2^-(m+1) + 2^-20) |x| + 2^(-bias-m) s + 2^-149
//   stochastic    |x' - x| <= (2^-m + 2^-20) |x| + 2^(1-bias-m) s + 2^-149
// (m mantissa bits; s the block's scale; 2^-20 covers the roundings of 1/s, x/s and code * s,
// 2^-149 a float subnormal result). Decoding to the source type is that float rounded once.
TEST_CASE("round trips stay within the format's error bound", "[unit][kernels][codec]") {
  std::mt19937_64 gen(8);
  for (uint32_t block : {1u, 32u, 128u, 200u}) {
    for_each_codec(block, [&](const BlockCodec& codec) {
      INFO(describe(codec));
      const size_t count = 4000;
      const Bytes src = random_source(codec.source, count, gen, true);
      Bytes buf(compressed_bytes(codec, count));
      encode(codec, buf.data(), src.data(), count, RandomStream{gen(), 0});
      std::vector<float> back(count, 0.0f);
      decode_accumulate(codec, back.data(), buf.data(), count);
      Bytes out(count * source_size(codec.source));
      decode(codec, out.data(), buf.data(), count);
      const Format fmt = format_of(codec.format);
      const bool sr = codec.rounding == Rounding::kStochastic;
      const double rel = std::ldexp(1.0, sr ? -fmt.man : -fmt.man - 1) + std::ldexp(1.0, -20);
      const double abs_units = std::ldexp(1.0, sr ? 1 - fmt.bias - fmt.man : -fmt.bias - fmt.man);
      for (size_t b = 0; b < codec_num_blocks(codec, count); ++b) {
        const size_t begin = b * block, end = std::min<size_t>(count, begin + block);
        float amax = 0.0f;
        bool finite = true;
        for (size_t i = begin; i < end; ++i) {
          const float x = source_value(codec.source, src, i);
          finite = finite && std::isfinite(x);
          if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
        }
        const float s = block_scale_of(codec, buf, b);
        INFO("block " << b << " amax " << amax << " scale " << s);
        if (!finite) {
          REQUIRE(std::isnan(s));
          for (size_t i = begin; i < end; ++i) {
            if (std::isnan(back[i]) && std::isnan(source_value(codec.source, out, i))) continue;
            FAIL("element " << i << " of a non-finite block decodes to " << back[i]);
          }
          continue;
        }
        if (codec.scale == ScaleKind::kFloat32) {
          REQUIRE(s == std::max(amax / fmt.max, FLT_MIN));
        } else {
          // The smallest power of two (>= 2^-127) that keeps amax / s within fmax.
          REQUIRE(amax <= static_cast<double>(fmt.max) * s);
          REQUIRE((s == std::ldexp(1.0f, -127) || amax > static_cast<double>(fmt.max) * s / 2));
        }
        for (size_t i = begin; i < end; ++i) {
          const double x = source_value(codec.source, src, i);
          const double bound = rel * std::fabs(x) + abs_units * s + std::ldexp(1.0, -149);
          if (!(std::fabs(back[i] - x) <= bound)) {
            FAIL("element " << i << " x " << x << " decoded " << back[i] << " bound " << bound);
          }
          const float typed = source_value(codec.source, out, i);
          // The fp32 result saturated at the source type's largest value, then rounded to it.
          const float top = codec.source == DataType::kFloat32    ? FLT_MAX
                            : codec.source == DataType::kBfloat16 ? 0x1.fep127f
                                                                  : 65504.0f;
          Bytes one(4);
          store_source(codec.source, one, 0, std::max(-top, std::min(top, back[i])));
          if (typed != source_value(codec.source, one, 0)) {
            FAIL("element " << i << " decodes to " << typed << ", its fp32 decoding to "
                            << back[i]);
          }
        }
      }
    });
  }
}

TEST_CASE("codes saturate at fmax, UE8M0 scales never need to", "[unit][kernels][codec]") {
  for (DataType f : kFormats) {
    const Format fmt = format_of(f);
    const uint8_t max_code = f == DataType::kFloat8e4m3 ? 0x7e : 0x7b;
    for (ScaleKind k : kScales) {
      BlockCodec codec{DataType::kFloat32, f, k, Rounding::kNearestEven, 16};
      INFO(describe(codec));
      // Block amaxes at, just above and just below fmax * 2^j, and the largest float.
      std::vector<float> src;
      for (int j : {-130, -20, 0, 7, 100}) {
        for (float m : {1.0f, 1.0f + FLT_EPSILON, 1.0f - FLT_EPSILON / 2}) {
          const float amax = std::ldexp(fmt.max * m, j);
          if (!std::isfinite(amax) || amax == 0.0f) continue;
          for (int i = 0; i < 16; ++i) src.push_back(i == 5 ? -amax : amax * static_cast<float>(i) / 16);
        }
      }
      for (int i = 0; i < 16; ++i) src.push_back(i % 2 ? FLT_MAX : -FLT_MAX);
      for (const CodecTable* table : {&scalar_codecs(), codecs_for("avx2"), codecs_for("avx512")}) {
        if (table == nullptr) continue;
        Bytes buf(compressed_bytes(codec, src.size()));
        codec_encode_fn(*table, codec)(buf.data(), src.data(), src.size(), 16, {});
        const unsigned char* codes = buf.data() + codec_num_blocks(codec, src.size()) * codec_scale_bytes(codec);
        std::vector<float> back(src.size(), 0.0f);
        codec_accumulate_fn(*table, codec)(back.data(), buf.data(), src.size(), 16);
        for (size_t i = 0; i < src.size(); ++i) {
          INFO(table->isa << " element " << i << " x " << src[i] << " code " << int(codes[i]));
          REQUIRE((codes[i] & 0x7f) <= max_code);  // never NaN (or e5m2 Inf)
          REQUIRE(std::isfinite(back[i]));
          if (i % 16 == 5 && k == ScaleKind::kFloat32 && std::fabs(src[i]) >= FLT_MIN * fmt.max) {
            REQUIRE((codes[i] & 0x7f) == max_code);  // the block's amax lands on fmax
          }
          REQUIRE(std::fabs(back[i] - src[i]) <= std::fabs(src[i]) / (1 << (fmt.man + 1)) * 1.0001 + 1e-38);
        }
      }
    }
  }
}

TEST_CASE("FP8 subnormal codes are exact and ties round to even", "[unit][kernels][codec]") {
  for (DataType f : kFormats) {
    const Format fmt = format_of(f);
    const float min_sub = std::ldexp(1.0f, 1 - fmt.bias - fmt.man);
    for (ScaleKind k : kScales) {
      // amax = fmax gives the scale 1 either way, so elements are encoded as they are.
      BlockCodec codec{DataType::kFloat32, f, k, Rounding::kNearestEven, 64};
      std::vector<float> src(64, 0.0f), want(64, 0.0f);
      src[0] = want[0] = fmt.max;
      const int steps = 1 << fmt.man;
      for (int q = 0; q < steps; ++q) {
        src[1 + q] = want[1 + q] = q * min_sub;                  // every subnormal code
        src[20 + q] = -(q + 0.5f) * min_sub;                     // ties: to the even code
        want[20 + q] = -static_cast<float>(q + (q & 1)) * min_sub;
        src[40 + q] = (q + 0.25f) * min_sub;                     // below the tie: down
        want[40 + q] = q * min_sub;
      }
      for (const CodecTable* table : {&scalar_codecs(), codecs_for("avx2"), codecs_for("avx512")}) {
        if (table == nullptr) continue;
        INFO(table->isa << " " << describe(codec));
        Bytes buf(compressed_bytes(codec, 64));
        codec_encode_fn(*table, codec)(buf.data(), src.data(), 64, 64, {});
        REQUIRE(block_scale_of(codec, buf, 0) == 1.0f);
        std::vector<float> back(64);
        codec_decode_fn(*table, codec)(back.data(), buf.data(), 64, 64);
        for (int i = 0; i < 64; ++i) {
          INFO("element " << i << " x " << src[i]);
          REQUIRE(back[i] == want[i]);
        }
      }
    }
  }
}

TEST_CASE("a block holding Inf or NaN decodes to NaN, its neighbours do not", "[unit][kernels][codec]") {
  std::mt19937_64 gen(31);
  for (const CodecTable* table : {&scalar_codecs(), codecs_for("avx2"), codecs_for("avx512")}) {
    if (table == nullptr) continue;
    for_each_codec(128, [&](const BlockCodec& codec) {
      const size_t count = 1000;  // 8 blocks, the last one 104 elements
      Bytes src(count * source_size(codec.source));
      for (size_t i = 0; i < count; ++i) {
        store_source(codec.source, src, i, static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 64);
      }
      const std::pair<size_t, float> bad[] = {{3 * 128 + 77, INFINITY}, {5 * 128, NAN},
                                              {999, -INFINITY}};
      for (auto [i, v] : bad) store_source(codec.source, src, i, v);
      Bytes buf(compressed_bytes(codec, count));
      codec_encode_fn(*table, codec)(buf.data(), src.data(), count, 128, {1, 2});
      std::vector<float> back(count, 0.0f);
      codec_accumulate_fn(*table, codec)(back.data(), buf.data(), count, 128);
      Bytes out(src.size());
      codec_decode_fn(*table, codec)(out.data(), buf.data(), count, 128);
      INFO(table->isa << " " << describe(codec));
      for (size_t i = 0; i < count; ++i) {
        const size_t b = i / 128;
        const bool poisoned = b == 3 || b == 5 || b == 7;
        INFO("element " << i);
        REQUIRE(std::isnan(back[i]) == poisoned);
        REQUIRE(std::isnan(source_value(codec.source, out, i)) == poisoned);
        const float x = source_value(codec.source, src, i);
        if (!poisoned) REQUIRE(std::fabs(back[i] - x) <= std::fabs(x) / 4 + 0.01f);
      }
    });
  }
}

// Stochastic rounding of values a fraction f of a code step above a code: the mean of many
// decoded copies must be the value itself (|error| < 5 standard deviations of the mean), where
// rounding to nearest is off by min(f, 1 - f) steps (checked too, so the test can tell them
// apart). Normal codes (1 + f * 2^-m) and subnormal codes (f * smallest subnormal).
TEST_CASE("stochastic rounding is unbiased", "[unit][kernels][codec]") {
  constexpr size_t kBlocks = 512, kBlock = 128;
  for (DataType f : kFormats) {
    const Format fmt = format_of(f);
    for (ScaleKind k : kScales) {
      for (bool subnormal : {false, true}) {
        const float step = subnormal ? std::ldexp(1.0f, 1 - fmt.bias - fmt.man) : std::ldexp(1.0f, -fmt.man);
        const float low = subnormal ? 0.0f : 1.0f;
        for (float frac : {0.1f, 0.3f, 0.5f, 0.77f}) {
          const float x = low + frac * step;
          std::vector<float> src(kBlocks * kBlock, x);
          for (size_t b = 0; b < kBlocks; ++b) src[b * kBlock] = fmt.max;  // scale 1
          for (const CodecTable* table : {&scalar_codecs(), codecs_for("avx2"), codecs_for("avx512")}) {
            if (table == nullptr) continue;
            for (Rounding r : kRoundings) {
              BlockCodec codec{DataType::kFloat32, f, k, r, kBlock};
              INFO(table->isa << " " << describe(codec) << " x " << x << (subnormal ? " subnormal" : ""));
              Bytes buf(compressed_bytes(codec, src.size()));
              codec_encode_fn(*table, codec)(buf.data(), src.data(), src.size(), kBlock, {12345, 0});
              std::vector<float> back(src.size(), 0.0f);
              codec_accumulate_fn(*table, codec)(back.data(), buf.data(), src.size(), kBlock);
              double sum = 0.0;
              size_t n = 0, up = 0;
              for (size_t i = 0; i < src.size(); ++i) {
                if (i % kBlock == 0) continue;
                if (back[i] != low && back[i] != low + step) FAIL("decoded " << back[i]);
                sum += back[i];
                up += back[i] != low;
                ++n;
              }
              const double mean_error = sum / static_cast<double>(n) - x;
              const double sd = step * std::sqrt(frac * (1 - frac) / static_cast<double>(n));
              INFO("mean error " << mean_error << " sd " << sd << " rounded up " << up << " of " << n);
              if (r == Rounding::kStochastic) {
                REQUIRE(std::fabs(mean_error) < 5 * sd);
              } else {
                REQUIRE(std::fabs(mean_error) >= std::min(frac, 1 - frac) * step * 0.99);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("stochastic rounding is reproducible and independent of the split", "[unit][kernels][codec]") {
  std::mt19937_64 gen(5);
  const size_t count = 1024 + 77;
  const Bytes src = random_source(DataType::kFloat32, count, gen, false);
  for (DataType f : kFormats) {
    BlockCodec codec{DataType::kFloat32, f, ScaleKind::kFloat32, Rounding::kStochastic, 128};
    const size_t nb = codec_num_blocks(codec, count);
    for (const CodecTable* table : {&scalar_codecs(), codecs_for("avx2"), codecs_for("avx512")}) {
      if (table == nullptr) continue;
      INFO(table->isa << " " << describe(codec));
      const CodecEncodeFn enc = codec_encode_fn(*table, codec);
      Bytes a(compressed_bytes(codec, count)), b(a.size()), c(a.size());
      enc(a.data(), src.data(), count, 128, {42, 1000});
      enc(b.data(), src.data(), count, 128, {42, 1000});
      REQUIRE(a == b);
      enc(c.data(), src.data(), count, 128, {43, 1000});
      REQUIRE(a != c);
      enc(c.data(), src.data(), count, 128, {42, 1001});
      REQUIRE(a != c);
      // Blocks [0, 3) and [3, nb) encoded separately, the second with counter + 3 * 128.
      const size_t k = 3 * 128;
      Bytes head(compressed_bytes(codec, k)), tail(compressed_bytes(codec, count - k));
      enc(head.data(), src.data(), k, 128, {42, 1000});
      enc(tail.data(), src.data() + 4 * k, count - k, 128, {42, 1000 + k});
      REQUIRE(std::memcmp(head.data(), a.data(), 3 * 4) == 0);
      REQUIRE(std::memcmp(tail.data(), a.data() + 3 * 4, (nb - 3) * 4) == 0);
      REQUIRE(std::memcmp(head.data() + 12, a.data() + nb * 4, k) == 0);
      REQUIRE(std::memcmp(tail.data() + (nb - 3) * 4, a.data() + nb * 4 + k, count - k) == 0);
    }
  }
}

}  // namespace
}  // namespace chorus::kernels
