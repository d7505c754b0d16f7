// SPDX-License-Identifier: Apache-2.0
#include "support/coll_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

#include "kernels/fp8/convert.h"

namespace chorus::test {

namespace {

using kernels::float_to_bf16;
using kernels::float_to_fp8e4m3;
using kernels::float_to_fp8e5m2;
using kernels::float_to_half;

// Storage type and exact encoding of each datatype.
template <ncclDataType_t kType>
struct Traits;
#define CHORUS_INT_TRAITS(T, S)                                          \
  template <>                                                           \
  struct Traits<T> {                                                    \
    using Storage = S;                                                  \
    static constexpr bool kFloat = false;                               \
    static S encode(double v) { return static_cast<S>(static_cast<int64_t>(v)); } \
  };
CHORUS_INT_TRAITS(ncclInt8, int8_t)
CHORUS_INT_TRAITS(ncclUint8, uint8_t)
CHORUS_INT_TRAITS(ncclInt32, int32_t)
CHORUS_INT_TRAITS(ncclUint32, uint32_t)
CHORUS_INT_TRAITS(ncclInt64, int64_t)
CHORUS_INT_TRAITS(ncclUint64, uint64_t)
#undef CHORUS_INT_TRAITS
#define CHORUS_FLOAT_TRAITS(T, S, ENC)                             \
  template <>                                                     \
  struct Traits<T> {                                              \
    using Storage = S;                                            \
    static constexpr bool kFloat = true;                          \
    static S encode(double v) { return ENC; }                     \
  };
CHORUS_FLOAT_TRAITS(ncclFloat16, uint16_t, float_to_half(static_cast<float>(v)))
CHORUS_FLOAT_TRAITS(ncclFloat32, float, static_cast<float>(v))
CHORUS_FLOAT_TRAITS(ncclFloat64, double, v)
CHORUS_FLOAT_TRAITS(ncclBfloat16, uint16_t, float_to_bf16(static_cast<float>(v)))
CHORUS_FLOAT_TRAITS(ncclFloat8e4m3, uint8_t, float_to_fp8e4m3(static_cast<float>(v)))
CHORUS_FLOAT_TRAITS(ncclFloat8e5m2, uint8_t, float_to_fp8e5m2(static_cast<float>(v)))
#undef CHORUS_FLOAT_TRAITS

enum class Pattern { kSum, kProd, kMinMax, kMove };

Pattern pattern_of(const Case& c) {
  if (!coll_reduces(c.coll)) return Pattern::kMove;
  switch (c.op) {
    case ncclProd: return Pattern::kProd;
    case ncclMax:
    case ncclMin: return Pattern::kMinMax;
    default: return Pattern::kSum;
  }
}

inline uint32_t mix(int rank, size_t i) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u + static_cast<uint32_t>(rank) * 0x85EBCA77u +
               static_cast<uint32_t>(i >> 32);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  return x ^ (x >> 12);
}

// How many distinct small integers a pattern may use so that any partial result of up to 8
// ranks (times a PreMulSum scalar of 2) stays exact in the datatype.
uint32_t range_of(ncclDataType_t t, Pattern p) {
  switch (p) {
    case Pattern::kProd: return 2;  // values 1, 2: products are powers of two <= 256
    case Pattern::kSum:
      switch (t) {
        case ncclInt8: return 8;
        case ncclFloat8e4m3:
        case ncclFloat8e5m2: return 2;
        default: return 16;
      }
    case Pattern::kMinMax:
      return (t == ncclFloat8e4m3 || t == ncclFloat8e5m2) ? 9 : 16;
    case Pattern::kMove:
      switch (t) {
        case ncclInt8: return 120;
        case ncclUint8: return 250;
        case ncclFloat16: return 2048;
        case ncclBfloat16: return 256;
        case ncclFloat8e4m3: return 17;
        case ncclFloat8e5m2: return 9;
        default: return 1u << 20;
      }
  }
  return 2;
}

// Input element i of rank r: a small integer drawn from a 64 Ki-entry table of hashed
// values. The index mixes in i >> 16 so that offsets by a multiple of the table size (chunk or
// block boundaries) still read different values.
struct Gen {
  Pattern pattern;
  uint32_t range;
  bool sparse;  // e5m2 sums: at most two contributors per element
  std::vector<uint32_t> table;

  void build() {
    table.resize(1 << 16);
    for (uint32_t k = 0; k < table.size(); ++k)
      table[k] = pattern == Pattern::kProd ? 1 + (mix(0, k) & 1) : mix(0, k) % range;
  }
  int64_t value(int rank, size_t i) const {
    if (sparse && ((i + static_cast<size_t>(rank)) & 3) != 0) return 0;
    uint32_t k = static_cast<uint32_t>(i) + static_cast<uint32_t>(rank) * 40503u +
                 static_cast<uint32_t>(i >> 16) * 7919u;
    return table[k & 0xffff];
  }
};

int64_t premul_scalar(int rank) { return rank % 2 == 0 ? 1 : 2; }

template <ncclDataType_t kType>
class Checker {
 public:
  using S = typename Traits<kType>::Storage;

  Checker(const Case& c, int nranks)
      : c_(c), n_(nranks), gen_{pattern_of(c), range_of(kType, pattern_of(c)), false, {}} {
    gen_.sparse = kType == ncclFloat8e5m2 && gen_.pattern == Pattern::kSum;
    gen_.build();
    // Every result of a reduction pattern is a small integer: encode each once.
    int64_t bound = gen_.pattern == Pattern::kProd ? 256 : int64_t{gen_.range} * 2 * n_ + 1;
    if (gen_.pattern == Pattern::kMove) bound = gen_.range;
    table_.resize(static_cast<size_t>(std::min<int64_t>(bound, 1 << 21)) + 1);
    for (size_t k = 0; k < table_.size(); ++k) table_[k] = Traits<kType>::encode(static_cast<double>(k));
  }

  S encode(int64_t v) const {
    return v >= 0 && static_cast<size_t>(v) < table_.size() ? table_[v]
                                                             : Traits<kType>::encode(static_cast<double>(v));
  }

  void fill(S* buf, size_t count, int rank, size_t first_index) const {
    for (size_t i = 0; i < count; ++i) buf[i] = encode(gen_.value(rank, first_index + i));
  }

  // The reduction over all ranks of input element e.
  S reduced(size_t e) const {
    int64_t acc = 0;
    for (int r = 0; r < n_; ++r) {
      int64_t v = gen_.value(r, e);
      if (c_.op == kPreMulSum) v *= premul_scalar(r);
      if (r == 0) {
        acc = v;
      } else if (c_.op == ncclProd) {
        acc *= v;
      } else if (c_.op == ncclMax) {
        acc = std::max(acc, v);
      } else if (c_.op == ncclMin) {
        acc = std::min(acc, v);
      } else {
        acc += v;
      }
    }
    if (c_.op != ncclAvg) return encode(acc);
    if constexpr (kType == ncclFloat64) {
      return static_cast<double>(acc) / n_;
    } else if constexpr (Traits<kType>::kFloat) {
      return Traits<kType>::encode(static_cast<float>(acc) / static_cast<float>(n_));
    } else {
      // Integer average: the (wrapped) sum in the type, divided in the type.
      return static_cast<S>(encode(acc) / static_cast<S>(n_));
    }
  }
  S moved(int rank, size_t e) const { return encode(gen_.value(rank, e)); }

 private:
  const Case& c_;
  int n_;
  Gen gen_;
  std::vector<S> table_;
};

// Grows a per-thread buffer without zeroing it (the inputs are written before use).
struct Buffer {
  std::unique_ptr<unsigned char[]> data;
  size_t bytes = 0;
};
thread_local Buffer t_buf_a, t_buf_b;

template <typename S>
S* sized(Buffer& b, size_t elements) {
  size_t bytes = std::max<size_t>(elements * sizeof(S), 64);
  if (b.bytes < bytes) {
    b.data.reset(new unsigned char[bytes]);
    b.bytes = bytes;
  }
  return reinterpret_cast<S*>(b.data.get());
}


std::string call_failed(const char* what, ncclResult_t r) {
  return fmt::format("{} returned {} ({}): {}", what, static_cast<int>(r), ncclGetErrorString(r),
                     ncclGetLastError(nullptr));
}

template <typename S, typename F>
std::string compare(const S* got, size_t count, size_t out_offset, const F& expected) {
  size_t wrong = 0;
  std::string first;
  for (size_t i = 0; i < count; ++i) {
    S want = expected(i);
    if (std::memcmp(&got[i], &want, sizeof(S)) != 0) {
      if (wrong < 3) {
        double g = 0, w = 0;
        if constexpr (std::is_arithmetic_v<S>) {
          g = static_cast<double>(got[i]);
          w = static_cast<double>(want);
        } else {
          g = static_cast<double>(static_cast<uint64_t>(got[i]));
          w = static_cast<double>(static_cast<uint64_t>(want));
        }
        first += fmt::format(" [{}]: got {} want {};", out_offset + i, g, w);
      }
      ++wrong;
    }
  }
  if (wrong == 0) return "";
  return fmt::format("{} of {} elements wrong:{}", wrong, count, first);
}

template <ncclDataType_t kType>
std::string run_typed(ncclComm_t comm, const Case& c) {
  using S = typename Traits<kType>::Storage;
  int rank = 0, n = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  Checker<kType> chk(c, n);
  const size_t count = c.count;
  const bool root = rank == c.root;
  ncclResult_t r = ncclSuccess;
  ncclRedOp_t op = static_cast<ncclRedOp_t>(c.op);
  S scalar = Traits<kType>::encode(static_cast<double>(premul_scalar(rank)));
  if (c.op == kPreMulSum) {
    r = ncclRedOpCreatePreMulSum(&op, &scalar, kType, ncclScalarHostImmediate, comm);
    if (r != ncclSuccess) return call_failed("ncclRedOpCreatePreMulSum", r);
  }
  std::string result;
  S* in = nullptr;
  S* out = nullptr;
  auto sync = [&]() -> ncclResult_t {
    return c.stream ? chorusStreamSynchronize(c.stream) : ncclSuccess;
  };
  switch (c.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kBroadcast: {
      out = sized<S>(t_buf_b, count);
      in = c.in_place ? out : sized<S>(t_buf_a, count);
      if (c.coll != Coll::kBroadcast || root) chk.fill(in, count, rank, 0);
      if (c.coll == Coll::kAllReduce) r = ncclAllReduce(in, out, count, kType, op, comm, c.stream);
      if (c.coll == Coll::kReduce) r = ncclReduce(in, out, count, kType, op, c.root, comm, c.stream);
      if (c.coll == Coll::kBroadcast) r = ncclBroadcast(in, out, count, kType, c.root, comm, c.stream);
      if (r == ncclSuccess) r = sync();
      if (r != ncclSuccess) { result = call_failed(coll_name(c.coll), r); break; }
      if (c.coll == Coll::kBroadcast) {
        result = compare<S>(out, count, 0, [&](size_t i) { return chk.moved(c.root, i); });
      } else if (c.coll == Coll::kAllReduce || root) {
        result = compare<S>(out, count, 0, [&](size_t i) { return chk.reduced(i); });
      }
      break;
    }
    case Coll::kReduceScatter: {
      S* send = sized<S>(t_buf_a, count * n);
      chk.fill(send, count * n, rank, 0);
      in = send;
      out = c.in_place ? send + rank * count : sized<S>(t_buf_b, count);
      r = ncclReduceScatter(in, out, count, kType, op, comm, c.stream);
      if (r == ncclSuccess) r = sync();
      if (r != ncclSuccess) { result = call_failed(coll_name(c.coll), r); break; }
      result = compare<S>(out, count, 0, [&](size_t i) { return chk.reduced(rank * count + i); });
      break;
    }
    case Coll::kAllGather:
    case Coll::kGather: {
      bool has_out = c.coll == Coll::kAllGather || root;
      out = sized<S>(t_buf_b, count * n);
      in = c.in_place && has_out ? out + rank * count : sized<S>(t_buf_a, count);
      chk.fill(in, count, rank, 0);
      r = c.coll == Coll::kAllGather ? ncclAllGather(in, out, count, kType, comm, c.stream)
                                     : ncclGather(in, out, count, kType, c.root, comm, c.stream);
      if (r == ncclSuccess) r = sync();
      if (r != ncclSuccess) { result = call_failed(coll_name(c.coll), r); break; }
      if (has_out) {
        result = compare<S>(out, count * n, 0, [&](size_t i) { return chk.moved(static_cast<int>(i / std::max<size_t>(count, 1)), i % std::max<size_t>(count, 1)); });
      }
      break;
    }
    case Coll::kAlltoAll: {
      out = sized<S>(t_buf_b, count * n);
      in = c.in_place ? out : sized<S>(t_buf_a, count * n);
      chk.fill(in, count * n, rank, 0);
      r = ncclAlltoAll(in, out, count, kType, comm, c.stream);
      if (r == ncclSuccess) r = sync();
      if (r != ncclSuccess) { result = call_failed(coll_name(c.coll), r); break; }
      result = compare<S>(out, count * n, 0, [&](size_t i) {
        size_t from = i / std::max<size_t>(count, 1), k = i % std::max<size_t>(count, 1);
        return chk.moved(static_cast<int>(from), rank * count + k);
      });
      break;
    }
    case Coll::kScatter: {
      S* send = sized<S>(t_buf_a, count * n);
      if (root) chk.fill(send, count * n, rank, 0);
      out = c.in_place && root ? send + rank * count : sized<S>(t_buf_b, count);
      r = ncclScatter(send, out, count, kType, c.root, comm, c.stream);
      if (r == ncclSuccess) r = sync();
      if (r != ncclSuccess) { result = call_failed(coll_name(c.coll), r); break; }
      result = compare<S>(out, count, 0, [&](size_t i) { return chk.moved(c.root, rank * count + i); });
      break;
    }
    case Coll::kSendRecv: {
      int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      in = sized<S>(t_buf_a, count);
      out = sized<S>(t_buf_b, count);
      chk.fill(in, count, rank, 0);
      r = ncclGroupStart();
      // Alternate the order of send and receive across ranks: any order must work in a group.
      if (rank % 2 == 0) {
        if (r == ncclSuccess) r = ncclSend(in, count, kType, next, comm, c.stream);
        if (r == ncclSuccess) r = ncclRecv(out, count, kType, prev, comm, c.stream);
      } else {
        if (r == ncclSuccess) r = ncclRecv(out, count, kType, prev, comm, c.stream);
        if (r == ncclSuccess) r = ncclSend(in, count, kType, next, comm, c.stream);
      }
      ncclResult_t e = ncclGroupEnd();
      if (r == ncclSuccess) r = e;
      if (r == ncclSuccess) r = sync();
      if (r != ncclSuccess) { result = call_failed("send/recv group", r); break; }
      result = compare<S>(out, count, 0, [&](size_t i) { return chk.moved(prev, i); });
      break;
    }
  }
  if (c.op == kPreMulSum) ncclRedOpDestroy(op, comm);
  return result;
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

const char* op_name(int op) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return op >= 0 && op < kNumTestOps ? kNames[op] : "?";
}

std::string Case::describe() const {
  static const char* kTypes[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                 "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  return fmt::format("{} {} {} count={} root={} {}{}", coll_name(coll), kTypes[dtype],
                     coll_reduces(coll) ? op_name(op) : "-", count, root,
                     in_place ? "in-place" : "out-of-place", stream ? " stream" : "");
}

std::string run_case(ncclComm_t comm, const Case& c) {
  switch (c.dtype) {
    case ncclInt8: return run_typed<ncclInt8>(comm, c);
    case ncclUint8: return run_typed<ncclUint8>(comm, c);
    case ncclInt32: return run_typed<ncclInt32>(comm, c);
    case ncclUint32: return run_typed<ncclUint32>(comm, c);
    case ncclInt64: return run_typed<ncclInt64>(comm, c);
    case ncclUint64: return run_typed<ncclUint64>(comm, c);
    case ncclFloat16: return run_typed<ncclFloat16>(comm, c);
    case ncclFloat32: return run_typed<ncclFloat32>(comm, c);
    case ncclFloat64: return run_typed<ncclFloat64>(comm, c);
    case ncclBfloat16: return run_typed<ncclBfloat16>(comm, c);
    case ncclFloat8e4m3: return run_typed<ncclFloat8e4m3>(comm, c);
    case ncclFloat8e5m2: return run_typed<ncclFloat8e5m2>(comm, c);
    default: return "bad datatype";
  }
}

std::vector<ncclDataType_t> all_datatypes() {
  std::vector<ncclDataType_t> v;
  for (int t = 0; t < ncclNumTypes; ++t) v.push_back(static_cast<ncclDataType_t>(t));
  return v;
}

std::vector<size_t> matrix_counts() { return {0, 1, 7, 1023, (size_t{1} << 20) + 3}; }

}  // namespace chorus::test
