// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/kernels_simd_test.cc
// Every SIMD kernel table this CPU supports against the scalar reference, bit for bit (NaN
// results only have to be NaN): all datatypes and operators, awkward counts, unaligned and
// aliased pointers, special values, fp8 exhaustively. ISAs the CPU lacks are skipped with a WARN.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

using Bytes = std::vector<unsigned char>;

constexpr size_t kCounts[] = {0,  1,  2,  3,  7,   15,  16,  17,   31,  32,
                              33, 63, 64, 65, 127, 128, 129, 1000, 4097};
constexpr size_t kOffsets[] = {0, 1, 3};  // elements
constexpr size_t kGuard = 5;              // elements after the range that must stay untouched

std::vector<const KernelTable*> simd_tables() {
  std::vector<const KernelTable*> tables;
  for (const char* isa : {"avx2", "avx512"}) {
    if (const KernelTable* t = kernels_for(isa)) {
      tables.push_back(t);
    } else {
      WARN("skipping the " << isa << " kernels: this CPU does not support them");
    }
  }
  return tables;
}

DataType dtype(int t) { return static_cast<DataType>(t); }
size_t esize(int t) { return datatype_size(dtype(t)); }

template <typename U>
U load_bits(const unsigned char* p) {
  U u;
  std::memcpy(&u, p, sizeof(u));
  return u;
}

bool is_nan(DataType t, const unsigned char* p) {
  switch (t) {
    case DataType::kFloat16:
      return (load_bits<uint16_t>(p) & 0x7fff) > 0x7c00;
    case DataType::kBfloat16:
      return (load_bits<uint16_t>(p) & 0x7fff) > 0x7f80;
    case DataType::kFloat32:
      return (load_bits<uint32_t>(p) & 0x7fffffffu) > 0x7f800000u;
    case DataType::kFloat64:
      return (load_bits<uint64_t>(p) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DataType::kFloat8e4m3:
      return (p[0] & 0x7f) == 0x7f;
    case DataType::kFloat8e5m2:
      return (p[0] & 0x7f) > 0x7c;
    default:
      return false;
  }
}

// Random storage bits for one element of type t. Floats mix moderate values with close exponents
// (so sums round), arbitrary bit patterns (subnormals, huge values that overflow or saturate,
// infinities), zeros and small integers (ties in max/min); NaN only if allow_nan.
void random_element(DataType t, unsigned char* p, std::mt19937_64& rng, bool allow_nan) {
  const size_t es = datatype_size(t);
  do {
    uint64_t r = rng();
    uint64_t bits = rng();
    const unsigned kind = static_cast<unsigned>(r % 8);
    if (datatype_is_float(t)) {
      const int exp_bits = t == DataType::kFloat64      ? 11
                           : t == DataType::kFloat32    ? 8
                           : t == DataType::kBfloat16   ? 8
                           : t == DataType::kFloat16    ? 5
                           : t == DataType::kFloat8e4m3 ? 4
                                                        : 5;
      const int man_bits = static_cast<int>(es * 8) - 1 - exp_bits;
      const uint64_t bias = (1ull << (exp_bits - 1)) - 1;
      const uint64_t man = bits & ((1ull << man_bits) - 1);
      const uint64_t sign = (r >> 8) & 1;
      uint64_t exp = (bits >> man_bits) & ((1ull << exp_bits) - 1);
      if (kind < 3) exp = bias - 2 + (r >> 16) % 5;                 // moderate, nearby exponents
      if (kind == 3) exp = 0;                                       // subnormal or zero
      if (kind == 4) exp = (1ull << exp_bits) - 2 - (r >> 16) % 2;  // the largest binades
      bits = (sign << (es * 8 - 1)) | (exp << man_bits) | man;
      if (kind == 5) bits = sign << (es * 8 - 1);  // signed zero
    } else if (kind < 2) {
      // Extremes and small values make equal operands, wrap-around and sign edges likely.
      const uint64_t picks[] = {0, 1, ~0ull, 2, 1ull << (es * 8 - 1), (1ull << (es * 8 - 1)) - 1};
      bits = picks[(r >> 8) % 6];
    }
    std::memcpy(p, &bits, es);  // little-endian: the low bytes
  } while (!allow_nan && is_nan(t, p));
}

Bytes random_buffer(int t, size_t n, std::mt19937_64& rng, bool allow_nan) {
  Bytes b(n * esize(t));
  for (size_t i = 0; i < n; ++i) random_element(dtype(t), b.data() + i * esize(t), rng, allow_nan);
  return b;
}

// Empty if equal (NaN matching any NaN), else a description of the first difference.
std::string compare(int t, const Bytes& got, const Bytes& want) {
  const size_t es = esize(t);
  for (size_t i = 0; i < want.size() / es; ++i) {
    const unsigned char* g = got.data() + i * es;
    const unsigned char* w = want.data() + i * es;
    if (is_nan(dtype(t), w) ? is_nan(dtype(t), g) : std::memcmp(g, w, es) == 0) continue;
    uint64_t gv = 0, wv = 0;
    std::memcpy(&gv, g, es);
    std::memcpy(&wv, w, es);
    std::ostringstream out;
    out << "element " << i << ": got 0x" << std::hex << gv << ", want 0x" << wv;
    return out.str();
  }
  return {};
}

struct Case {
  int type;
  int op;
  size_t count;
  size_t offset;
};

// Runs reduce (out of place, in place on a, in place on b) and reduce_copy for one case.
void check_reduce(const KernelTable& simd, const Case& c, std::mt19937_64& rng, bool allow_nan) {
  const KernelTable& ref = scalar_kernels();
  const size_t es = esize(c.type), n = c.offset + c.count + kGuard, off = c.offset * es;
  const Bytes a = random_buffer(c.type, n, rng, allow_nan);
  const Bytes b = random_buffer(c.type, n, rng, allow_nan);
  const Bytes fill = random_buffer(c.type, n, rng, false);
  Bytes want = fill;
  ref.reduce[c.type][c.op](want.data() + off, a.data() + off, b.data() + off, c.count);
  INFO(simd.isa << " " << datatype_name(dtype(c.type)) << " op " << c.op << " count " << c.count
                << " offset " << c.offset << (allow_nan ? " with NaN" : ""));
  // The plain kernel and its streaming-store variant, which must give the same bits.
  for (ReduceFn fn : {simd.reduce[c.type][c.op], simd.reduce_stream[c.type][c.op]}) {
    INFO((fn == simd.reduce[c.type][c.op] ? "reduce" : "reduce_stream"));
    Bytes got = fill;
    fn(got.data() + off, a.data() + off, b.data() + off, c.count);
    REQUIRE(compare(c.type, got, want) == "");
    got = a;  // in place on the first operand (the guard elements keep a's values)
    fn(got.data() + off, got.data() + off, b.data() + off, c.count);
    Bytes want_a = a;
    std::memcpy(want_a.data() + off, want.data() + off, c.count * es);
    REQUIRE(compare(c.type, got, want_a) == "");
    got = b;  // in place on the second operand
    fn(got.data() + off, a.data() + off, got.data() + off, c.count);
    Bytes want_b = b;
    std::memcpy(want_b.data() + off, want.data() + off, c.count * es);
    REQUIRE(compare(c.type, got, want_b) == "");
  }
  Bytes want_a = a;
  std::memcpy(want_a.data() + off, want.data() + off, c.count * es);
  Bytes got1 = fill, got2 = fill;  // fused reduce + copy, both destinations
  simd.reduce_copy[c.type][c.op](got1.data() + off, got2.data() + off, a.data() + off,
                                 b.data() + off, c.count);
  REQUIRE(compare(c.type, got1, want) == "");
  REQUIRE(compare(c.type, got2, want) == "");
  got1 = a;  // reduce_copy in place on a
  simd.reduce_copy[c.type][c.op](got1.data() + off, got2.data() + off, got1.data() + off,
                                 b.data() + off, c.count);
  REQUIRE(compare(c.type, got1, want_a) == "");
  REQUIRE(compare(c.type, got2, want) == "");
}

TEST_CASE("SIMD reduce, reduce_stream and reduce_copy match the scalar reference", "[unit][kernels]") {
  std::mt19937_64 rng(1234);
  for (const KernelTable* simd : simd_tables()) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      for (int op = 0; op < kNumReduceOps; ++op) {
        for (size_t count : kCounts) {
          for (size_t offset : kOffsets) check_reduce(*simd, {t, op, count, offset}, rng, false);
        }
      }
    }
  }
}

TEST_CASE("SIMD reductions turn NaN inputs into NaN where the reference does", "[unit][kernels]") {
  std::mt19937_64 rng(99);
  for (const KernelTable* simd : simd_tables()) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      if (!datatype_is_float(dtype(t))) continue;
      for (int op = 0; op < kNumReduceOps; ++op) {
        for (size_t count : {1, 17, 64, 1000}) check_reduce(*simd, {t, op, count, 1}, rng, true);
      }
    }
  }
}

TEST_CASE("SIMD fp8 reductions match on every pair of codes", "[unit][kernels]") {
  const KernelTable& ref = scalar_kernels();
  for (const KernelTable* simd : simd_tables()) {
    for (DataType type : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
      const int t = static_cast<int>(type);
      Bytes a(65536), b(65536), want(65536), got(65536);
      for (size_t i = 0; i < 65536; ++i) {
        a[i] = static_cast<unsigned char>(i);
        b[i] = static_cast<unsigned char>(i >> 8);
      }
      INFO(simd->isa << " " << datatype_name(type));
      for (int op = 0; op < kNumReduceOps; ++op) {
        ref.reduce[t][op](want.data(), a.data(), b.data(), a.size());
        simd->reduce[t][op](got.data(), a.data(), b.data(), a.size());
        INFO("op " << op);
        REQUIRE(compare(t, got, want) == "");
      }
      for (unsigned factor = 0; factor < 256; ++factor) {  // scale: every code by every code
        const unsigned char f = static_cast<unsigned char>(factor);
        ref.scale[t](want.data(), a.data(), 256, &f);
        simd->scale[t](got.data(), a.data(), 256, &f);
        INFO("scale by code " << factor);
        REQUIRE(compare(t, Bytes(got.begin(), got.begin() + 256),
                        Bytes(want.begin(), want.begin() + 256)) == "");
      }
    }
  }
}

TEST_CASE("SIMD scale and divide match the scalar reference", "[unit][kernels]") {
  const KernelTable& ref = scalar_kernels();
  std::mt19937_64 rng(5);
  // Divisors are rank counts, used as they are: 200, 256 and 65537 must not wrap to 8 bits,
  // nor 3e9 to a negative int32.
  const uint32_t divisors[] = {1, 2, 3, 7, 100, 127, 200, 256, 1000, 65537, 3000000000u};
  for (const KernelTable* simd : simd_tables()) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      const size_t es = esize(t);
      for (size_t count : kCounts) {
        for (size_t offset : kOffsets) {
          INFO(simd->isa << " " << datatype_name(dtype(t)) << " count " << count << " offset "
                         << offset);
          const size_t n = offset + count + kGuard, off = offset * es;
          const bool nan = datatype_is_float(dtype(t)) && count == 1000;
          const Bytes src = random_buffer(t, n, rng, nan);
          const Bytes scalar = random_buffer(t, 1, rng, nan);
          Bytes want = random_buffer(t, n, rng, false), got = want;
          ref.scale[t](want.data() + off, src.data() + off, count, scalar.data());
          simd->scale[t](got.data() + off, src.data() + off, count, scalar.data());
          REQUIRE(compare(t, got, want) == "");
          got = src;  // in place
          simd->scale[t](got.data() + off, got.data() + off, count, scalar.data());
          Bytes want_in = src;
          std::memcpy(want_in.data() + off, want.data() + off, count * es);
          REQUIRE(compare(t, got, want_in) == "");
          for (uint32_t d : divisors) {
            INFO("divisor " << d);
            want = src;
            got = src;
            ref.divide[t](want.data() + off, count, d);
            simd->divide[t](got.data() + off, count, d);
            REQUIRE(compare(t, got, want) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("SIMD copy and streaming copy are memcpy", "[unit][kernels]") {
  std::mt19937_64 rng(3);
  for (const KernelTable* simd : simd_tables()) {
    for (auto [name, copy] : {std::pair{"copy", simd->copy}, {"stream_copy", simd->stream_copy}}) {
      // Sizes around the 128-byte step and the 32-byte alignment head; offsets misalign the
      // destination and the source differently.
      for (size_t bytes : {0, 1, 31, 32, 64, 100, 127, 128, 129, 4097, 1 << 20, (1 << 22) + 3}) {
        for (size_t offset : {0, 1, 3, 17, 32}) {
          Bytes src(bytes + offset + 64), dst(src.size(), 0xa5), want(src.size(), 0xa5);
          for (auto& c : src) c = static_cast<unsigned char>(rng());
          std::memcpy(want.data() + offset, src.data() + 3 + offset % 5, bytes);
          copy(dst.data() + offset, src.data() + 3 + offset % 5, bytes);
          INFO(simd->isa << " " << name << " bytes " << bytes << " offset " << offset);
          REQUIRE(dst == want);
        }
      }
    }
  }
}

// Floats that stress from_float: every sign and exponent, with mantissas at and around every
// rounding position, plus random ones and random bit patterns.
std::vector<float> conversion_inputs() {
  std::mt19937_64 rng(11);
  std::vector<uint32_t> bits;
  for (uint32_t sign_exp = 0; sign_exp < 512; ++sign_exp) {
    const uint32_t high = (sign_exp >> 8) << 31 | (sign_exp & 0xff) << 23;
    for (uint32_t k = 0; k < 24; ++k) {
      for (uint32_t m : {1u << k, (1u << k) - 1, (1u << k) + 1, (3u << k) >> 1, 0x7fffffu >> k}) {
        bits.push_back(high | (m & 0x7fffffu));
      }
    }
    for (int i = 0; i < 64; ++i) bits.push_back(high | (static_cast<uint32_t>(rng()) & 0x7fffffu));
  }
  for (int i = 0; i < (1 << 20); ++i) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
  return out;
}

TEST_CASE("SIMD conversions match the scalar ones bit for bit", "[unit][kernels]") {
  const KernelTable& ref = scalar_kernels();
  const std::vector<float> floats = conversion_inputs();
  for (const KernelTable* simd : simd_tables()) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      REQUIRE((ref.to_float[t] == nullptr) == (simd->to_float[t] == nullptr));
      if (ref.to_float[t] == nullptr) continue;
      INFO(simd->isa << " " << datatype_name(dtype(t)));
      const size_t es = esize(t), codes = size_t{1} << (8 * es);
      Bytes all(codes * es);
      for (size_t c = 0; c < codes; ++c) std::memcpy(all.data() + c * es, &c, es);
      std::vector<uint32_t> want(codes), got(codes);  // to_float: every code, NaNs included
      ref.to_float[t](want.data(), all.data(), codes);
      simd->to_float[t](got.data(), all.data(), codes);
      for (size_t c = 0; c < codes; ++c) {
        INFO("code " << c);
        if ((want[c] & 0x7fffffffu) > 0x7f800000u) {  // NaN: same sign (F16C quiets sNaN)
          REQUIRE((got[c] & 0x7fffffffu) > 0x7f800000u);
          REQUIRE((got[c] >> 31) == (want[c] >> 31));
        } else {
          REQUIRE(got[c] == want[c]);
        }
      }
      Bytes want_bits(floats.size() * es), got_bits(floats.size() * es);  // from_float
      ref.from_float[t](want_bits.data(), floats.data(), floats.size());
      simd->from_float[t](got_bits.data(), floats.data(), floats.size());
      for (size_t i = 0; i < floats.size(); ++i) {
        if (std::memcmp(&got_bits[i * es], &want_bits[i * es], es) == 0) continue;
        uint32_t f;
        std::memcpy(&f, &floats[i], 4);
        FAIL("from_float of bits 0x" << std::hex << f);
      }
    }
  }
}

TEST_CASE("kernel tables are complete and chosen by name", "[unit][kernels]") {
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    const KernelTable* t = kernels_for(isa);
    if (t == nullptr) continue;
    REQUIRE(std::string(t->isa) == isa);
    REQUIRE(t->copy != nullptr);
    REQUIRE(t->stream_copy != nullptr);
    for (int d = 0; d < kNumDataTypes; ++d) {
      for (int op = 0; op < kNumReduceOps; ++op) {
        REQUIRE(t->reduce[d][op] != nullptr);
        REQUIRE(t->reduce_stream[d][op] != nullptr);
        REQUIRE(t->reduce_copy[d][op] != nullptr);
      }
      REQUIRE(t->scale[d] != nullptr);
      REQUIRE(t->divide[d] != nullptr);
    }
  }
  REQUIRE(kernels_for("SCALAR") == &scalar_kernels());
  REQUIRE(kernels_for("sse9") == nullptr);
  const KernelTable* best = kernels_for("avx512") ? kernels_for("avx512")
                            : kernels_for("avx2") ? kernels_for("avx2")
                                                  : &scalar_kernels();
  REQUIRE(&select_kernels("AUTO") == best);
  REQUIRE(&select_kernels("") == best);
  REQUIRE(&select_kernels("SCALAR") == &scalar_kernels());
  // An ISA the CPU lacks falls back to the best available one.
  REQUIRE(&select_kernels("AVX512") == best);
  REQUIRE(&select_kernels("AVX2") == (kernels_for("avx2") ? kernels_for("avx2") : best));
}

TEST_CASE("large reductions into an output stream their stores", "[unit][kernels]") {
  const uint64_t threshold = stream_copy_min_bytes();
  REQUIRE(threshold > 0);
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (int op = 0; op < kNumReduceOps; ++op) {
      ReduceFn fn = kernels().reduce[t][op];
      REQUIRE(reduce_for_output(fn, 0) == fn);
      if (threshold > 1) REQUIRE(reduce_for_output(fn, threshold - 1) == fn);
      if (threshold != UINT64_MAX) {
        REQUIRE(reduce_for_output(fn, threshold) == kernels().reduce_stream[t][op]);
      }
    }
  }
}

// All 2^32 floats through every from_float, in two threads (a few minutes; hidden, run it with
// `chorus_unit_tests "[exhaustive]"`). The default tests cover the same rounding positions.
TEST_CASE("SIMD from_float matches on every float", "[.][slow][exhaustive]") {
  const KernelTable& ref = scalar_kernels();
  const std::vector<const KernelTable*> tables = simd_tables();
  std::vector<std::string> failures(2);
  auto worker = [&](uint32_t part) {
    constexpr size_t kChunk = size_t{1} << 20;
    std::vector<uint32_t> in(kChunk);
    Bytes want(kChunk * 2), got(kChunk * 2);
    for (uint64_t base = uint64_t{part} << 31; base < (uint64_t{part} + 1) << 31; base += kChunk) {
      for (size_t i = 0; i < kChunk; ++i) in[i] = static_cast<uint32_t>(base + i);
      for (int t = 0; t < kNumDataTypes && failures[part].empty(); ++t) {
        if (ref.from_float[t] == nullptr) continue;
        ref.from_float[t](want.data(), in.data(), kChunk);
        for (const KernelTable* simd : tables) {
          simd->from_float[t](got.data(), in.data(), kChunk);
          if (std::memcmp(got.data(), want.data(), kChunk * esize(t)) != 0) {
            failures[part] = std::string(simd->isa) + " " + std::string(datatype_name(dtype(t))) +
                             " near " + std::to_string(base);
          }
        }
      }
    }
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
  REQUIRE(failures[0] == "");
  REQUIRE(failures[1] == "");
}

}  // namespace
}  // namespace chorus::kernels
