// SPDX-License-Identifier: Apache-2.0
// File: bench/common/verifiable.cc
// The generator behind Verifier: a 64 Ki-entry table of hashed small integers per pattern,
// encoded exactly in each datatype, and the per-collective map from output to input elements.
#include "bench/common/verifiable.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/fp8/convert.h"

namespace chorus::verify {

namespace {

// Storage type, exact encoding and decoding of each datatype.
template <ncclDataType_t kType>
struct Traits;
#define CHORUS_INT_TRAITS(T, S)                                                   \
  template <>                                                                     \
  struct Traits<T> {                                                              \
    using Storage = S;                                                            \
    [[maybe_unused]] static constexpr bool kFloat = false;                        \
    static S encode(double v) { return static_cast<S>(static_cast<int64_t>(v)); } \
    static double decode(S v) { return static_cast<double>(v); }                  \
  };
CHORUS_INT_TRAITS(ncclInt8, int8_t)
CHORUS_INT_TRAITS(ncclUint8, uint8_t)
CHORUS_INT_TRAITS(ncclInt32, int32_t)
CHORUS_INT_TRAITS(ncclUint32, uint32_t)
CHORUS_INT_TRAITS(ncclInt64, int64_t)
CHORUS_INT_TRAITS(ncclUint64, uint64_t)
#undef CHORUS_INT_TRAITS
#define CHORUS_FLOAT_TRAITS(T, S, ENC, DEC)               \
  template <>                                             \
  struct Traits<T> {                                      \
    using Storage = S;                                    \
    [[maybe_unused]] static constexpr bool kFloat = true; \
    static S encode(double v) { return ENC; }             \
    static double decode(S v) { return DEC; }             \
  };
CHORUS_FLOAT_TRAITS(ncclFloat16, uint16_t, kernels::float_to_half(static_cast<float>(v)),
                    kernels::half_to_float(v))
CHORUS_FLOAT_TRAITS(ncclFloat32, float, static_cast<float>(v), v)
CHORUS_FLOAT_TRAITS(ncclFloat64, double, v, v)
CHORUS_FLOAT_TRAITS(ncclBfloat16, uint16_t, kernels::float_to_bf16(static_cast<float>(v)),
                    kernels::bf16_to_float(v))
CHORUS_FLOAT_TRAITS(ncclFloat8e4m3, uint8_t, kernels::float_to_fp8e4m3(static_cast<float>(v)),
                    kernels::fp8e4m3_to_float(v))
CHORUS_FLOAT_TRAITS(ncclFloat8e5m2, uint8_t, kernels::float_to_fp8e5m2(static_cast<float>(v)),
                    kernels::fp8e5m2_to_float(v))
#undef CHORUS_FLOAT_TRAITS

enum class Pattern { kSum, kProd, kMinMax, kMove };

Pattern pattern_of(const CallShape& s) {
  if (!coll_reduces(s.coll)) return Pattern::kMove;
  switch (s.op) {
    case ncclProd: return Pattern::kProd;
    case ncclMax:
    case ncclMin: return Pattern::kMinMax;
    default: return Pattern::kSum;
  }
}

uint32_t mix(int rank, size_t i) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u + static_cast<uint32_t>(rank) * 0x85EBCA77u +
               static_cast<uint32_t>(i >> 32);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  return x ^ (x >> 12);
}

// The values a pattern draws from: 0..range-1 (1..2 for products); with stride > 1, rank r
// contributes to element i only when (i + r) % stride == 0, and 0 elsewhere.
struct Spread {
  uint32_t range;
  uint32_t stride;
};

// Up to 8 ranks (times a PreMulSum scalar of 2) every partial result stays exact.
Spread spread_up_to_8_ranks(ncclDataType_t t, Pattern p) {
  switch (p) {
    case Pattern::kProd: return {2, 1};  // values 1, 2: products are powers of two
    case Pattern::kSum:
      switch (t) {
        case ncclInt8: return {8, 1};
        case ncclFloat8e4m3: return {2, 1};
        case ncclFloat8e5m2: return {2, 4};  // at most two contributors per element
        default: return {16, 1};
      }
    case Pattern::kMinMax: return {(t == ncclFloat8e4m3 || t == ncclFloat8e5m2) ? 9u : 16u, 1};
    case Pattern::kMove:
      switch (t) {
        case ncclInt8: return {120, 1};
        case ncclUint8: return {250, 1};
        case ncclFloat16: return {2048, 1};
        case ncclBfloat16: return {256, 1};
        case ncclFloat8e4m3: return {17, 1};
        case ncclFloat8e5m2: return {9, 1};
        default: return {1u << 20, 1};
      }
  }
  return {2, 1};
}

// Every integer in [0, limit] is exact in t; 0 for integer types, whose sums wrap exactly.
int64_t exact_integer_limit(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return 2048;
    case ncclBfloat16: return 256;
    case ncclFloat8e4m3: return 16;
    case ncclFloat8e5m2: return 8;
    case ncclFloat32: return int64_t{1} << 24;
    case ncclFloat64: return int64_t{1} << 53;
    default: return 0;
  }
}

// More than 8 ranks: sums shrink the range, then thin out the contributors, so that a sum of
// every contribution (times 2) stays within the exact integers of the type.
Spread spread_of(ncclDataType_t t, Pattern p, int nranks) {
  Spread s = spread_up_to_8_ranks(t, p);
  int64_t limit = exact_integer_limit(t);
  if (nranks <= 8 || p != Pattern::kSum || limit == 0) return s;
  int64_t per_rank = limit / (2 * int64_t{nranks});
  if (per_rank >= 1) {
    s.range = static_cast<uint32_t>(std::min<int64_t>(s.range, per_rank + 1));
    s.stride = 1;
  } else {
    int64_t contributors = limit / 2;
    s.range = 2;
    s.stride = static_cast<uint32_t>((nranks + contributors - 1) / contributors);
  }
  return s;
}

// Input element i of rank r: a small integer drawn from a 64 Ki-entry table of hashed values.
// The index mixes in i >> 16 so that offsets by a multiple of the table size (chunk or block
// boundaries) still read different values.
class Generator {
 public:
  Generator(Pattern pattern, Spread spread) : spread_(spread), table_(1 << 16) {
    for (uint32_t k = 0; k < table_.size(); ++k)
      table_[k] = pattern == Pattern::kProd ? 1 + (mix(0, k) & 1) : mix(0, k) % spread_.range;
  }
  int64_t value(int rank, size_t i) const {
    if (spread_.stride > 1 && (i + static_cast<size_t>(rank)) % spread_.stride != 0) return 0;
    uint32_t k = static_cast<uint32_t>(i) + static_cast<uint32_t>(rank) * 40503u +
                 static_cast<uint32_t>(i >> 16) * 7919u;
    return table_[k & 0xffff];
  }
  uint32_t range() const { return spread_.range; }

 private:
  Spread spread_;
  std::vector<uint32_t> table_;
};

template <ncclDataType_t kType>
class TypedVerifier final : public Verifier {
 public:
  using S = typename Traits<kType>::Storage;

  explicit TypedVerifier(const CallShape& shape)
      : Verifier(shape, sizeof(S)),
        pattern_(pattern_of(shape)),
        gen_(pattern_, spread_of(kType, pattern_, shape.nranks)) {
    // Every result is a small integer (a power of two for products): encode each once.
    int64_t bound = int64_t{gen_.range()} * 2 * shape.nranks + 1;
    if (pattern_ == Pattern::kProd) bound = int64_t{1} << std::min(shape.nranks, 16);
    if (pattern_ == Pattern::kMove) bound = gen_.range();
    table_.resize(static_cast<size_t>(std::min<int64_t>(bound, 1 << 21)) + 1);
    for (size_t k = 0; k < table_.size(); ++k)
      table_[k] = Traits<kType>::encode(static_cast<double>(k));
  }

  void fill_input(int rank, void* buf, size_t first, size_t n) const override {
    S* out = static_cast<S*>(buf);
    for (size_t k = 0; k < n; ++k) out[k] = encode(gen_.value(rank, first + k));
  }

  void fill_expected(int rank, void* buf, size_t first, size_t n) const override;

  void encode_scalar(int rank, void* out) const override {
    S s = Traits<kType>::encode(static_cast<double>(premul_scalar(rank)));
    std::memcpy(out, &s, sizeof(S));
  }

  double decode(const void* element) const override {
    S v;
    std::memcpy(&v, element, sizeof(S));
    return Traits<kType>::decode(v);
  }

 private:
  S encode(int64_t v) const {
    return v >= 0 && static_cast<size_t>(v) < table_.size()
               ? table_[static_cast<size_t>(v)]
               : Traits<kType>::encode(static_cast<double>(v));
  }
  S moved(int rank, size_t e) const { return encode(gen_.value(rank, e)); }
  S reduced(size_t e) const;

  Pattern pattern_;
  Generator gen_;
  std::vector<S> table_;
};

// The reduction over all ranks of input element e, as the library computes it.
template <ncclDataType_t kType>
typename TypedVerifier<kType>::S TypedVerifier<kType>::reduced(size_t e) const {
  const int op = shape().op;
  const int n = shape().nranks;
  int64_t acc = 0;
  for (int r = 0; r < n; ++r) {
    int64_t v = gen_.value(r, e);
    if (op == kPreMulSum) v *= premul_scalar(r);
    if (r == 0) {
      acc = v;
    } else if (op == ncclProd) {
      acc *= v;
    } else if (op == ncclMax) {
      acc = std::max(acc, v);
    } else if (op == ncclMin) {
      acc = std::min(acc, v);
    } else {
      acc += v;
    }
  }
  if (op != ncclAvg) return encode(acc);
  if constexpr (kType == ncclFloat64) {
    return static_cast<double>(acc) / n;
  } else if constexpr (Traits<kType>::kFloat) {
    return Traits<kType>::encode(static_cast<float>(acc) / static_cast<float>(n));
  } else {
    // Integer average: the (wrapped) sum in the type, divided in the type.
    return static_cast<S>(encode(acc) / static_cast<S>(n));
  }
}

template <ncclDataType_t kType>
void TypedVerifier<kType>::fill_expected(int rank, void* buf, size_t first, size_t n) const {
  S* out = static_cast<S*>(buf);
  const CallShape& s = shape();
  const size_t count = std::max<size_t>(s.count, 1);
  const size_t block = static_cast<size_t>(rank) * s.count;  // this rank's block of a vector
  switch (s.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
      for (size_t k = 0; k < n; ++k) out[k] = reduced(first + k);
      break;
    case Coll::kReduceScatter:
      for (size_t k = 0; k < n; ++k) out[k] = reduced(block + first + k);
      break;
    case Coll::kBroadcast:
      for (size_t k = 0; k < n; ++k) out[k] = moved(s.root, first + k);
      break;
    case Coll::kAllGather:
    case Coll::kGather:
      for (size_t o = first; o < first + n; ++o)
        out[o - first] = moved(static_cast<int>(o / count), o % count);
      break;
    case Coll::kAlltoAll:
      for (size_t o = first; o < first + n; ++o)
        out[o - first] = moved(static_cast<int>(o / count), block + o % count);
      break;
    case Coll::kScatter:
      for (size_t k = 0; k < n; ++k) out[k] = moved(s.root, block + first + k);
      break;
    case Coll::kSendRecv: {
      int prev = (rank + s.nranks - 1) % s.nranks;
      for (size_t k = 0; k < n; ++k) out[k] = moved(prev, first + k);
      break;
    }
  }
}

template <ncclDataType_t kType>
std::unique_ptr<Verifier> make(const CallShape& shape) {
  return std::make_unique<TypedVerifier<kType>>(shape);
}

}  // namespace

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "AllReduce";
    case Coll::kReduceScatter: return "ReduceScatter";
    case Coll::kAllGather: return "AllGather";
    case Coll::kBroadcast: return "Broadcast";
    case Coll::kReduce: return "Reduce";
    case Coll::kAlltoAll: return "AlltoAll";
    case Coll::kGather: return "Gather";
    case Coll::kScatter: return "Scatter";
    case Coll::kSendRecv: return "SendRecv";
  }
  return "?";
}

bool coll_reduces(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce;
}

bool coll_rooted(Coll c) {
  return c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter;
}

int premul_scalar(int rank) { return rank % 2 == 0 ? 1 : 2; }

size_t datatype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

std::unique_ptr<Verifier> Verifier::create(const CallShape& shape) {
  if (shape.nranks < 1) return nullptr;
  switch (shape.dtype) {
    case ncclInt8: return make<ncclInt8>(shape);
    case ncclUint8: return make<ncclUint8>(shape);
    case ncclInt32: return make<ncclInt32>(shape);
    case ncclUint32: return make<ncclUint32>(shape);
    case ncclInt64: return make<ncclInt64>(shape);
    case ncclUint64: return make<ncclUint64>(shape);
    case ncclFloat16: return make<ncclFloat16>(shape);
    case ncclFloat32: return make<ncclFloat32>(shape);
    case ncclFloat64: return make<ncclFloat64>(shape);
    case ncclBfloat16: return make<ncclBfloat16>(shape);
    case ncclFloat8e4m3: return make<ncclFloat8e4m3>(shape);
    case ncclFloat8e5m2: return make<ncclFloat8e5m2>(shape);
    default: return nullptr;
  }
}

size_t Verifier::input_count(int rank) const {
  const size_t all = shape_.count * static_cast<size_t>(shape_.nranks);
  switch (shape_.coll) {
    case Coll::kReduceScatter:
    case Coll::kAlltoAll: return all;
    case Coll::kScatter: return rank == shape_.root ? all : 0;
    default: return shape_.count;
  }
}

size_t Verifier::output_count(int rank) const {
  const size_t all = shape_.count * static_cast<size_t>(shape_.nranks);
  switch (shape_.coll) {
    case Coll::kAllGather:
    case Coll::kAlltoAll: return all;
    case Coll::kGather: return rank == shape_.root ? all : 0;
    case Coll::kReduce: return rank == shape_.root ? shape_.count : 0;
    default: return shape_.count;
  }
}

Mismatch Verifier::check(int rank, const void* got, int max_reported) const {
  Mismatch m;
  const size_t total = output_count(rank);
  const size_t chunk = std::min<size_t>(total, 16384);
  std::vector<unsigned char> want(chunk * element_bytes_);
  const auto* bytes = static_cast<const unsigned char*>(got);
  for (size_t first = 0; first < total; first += chunk) {
    const size_t n = std::min(chunk, total - first);
    const unsigned char* g = bytes + first * element_bytes_;
    fill_expected(rank, want.data(), first, n);
    if (std::memcmp(g, want.data(), n * element_bytes_) == 0) continue;
    for (size_t k = 0; k < n; ++k) {
      const unsigned char* w = want.data() + k * element_bytes_;
      if (std::memcmp(g + k * element_bytes_, w, element_bytes_) == 0) continue;
      if (m.wrong < static_cast<size_t>(max_reported)) {
        m.first += fmt::format(" [{}]: got {} want {};", first + k, decode(g + k * element_bytes_),
                               decode(w));
      }
      ++m.wrong;
    }
  }
  return m;
}

}  // namespace chorus::verify
