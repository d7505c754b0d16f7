// SPDX-License-Identifier: Apache-2.0
// File: tests/support/identical_check.cc
// See identical_check.h. Every rank generates every rank's input (a hash of seed, case, rank
// and index), so each can compute the fp64 reference on its own; the outputs are compared
// across ranks through an AllGather of the raw bytes.
#include "support/identical_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/fp8/convert.h"
#include "support/coll_check.h"

namespace chorus::test {

namespace {

constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
constexpr int kNumOps = 6;
constexpr int kPreMul = 5;

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return "half";
    case ncclFloat32: return "float";
    case ncclFloat64: return "double";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat8e4m3: return "f8e4m3";
    case ncclFloat8e5m2: return "f8e5m2";
    default: return "?";
  }
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat64: return 8;
    case ncclFloat32: return 4;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    default: return 1;
  }
}

// What a datatype can hold, for the generator and the tolerance.
struct TypeInfo {
  int kmin, kmax;      // x = m * 10^k, k in [kmin, kmax]
  double mmax;         // m in [1, mmax)
  double unit;         // unit roundoff
  double tiny;         // spacing of the subnormals (absolute error floor)
};

TypeInfo type_info(ncclDataType_t t) {
  // Ranges keep a sum of 8 scaled values clear of the largest finite value (fp8 e4m3
  // saturates at 448, e5m2 and fp16 overflow near 57344 and 65504).
  switch (t) {
    case ncclFloat64: return {-3, 3, 10, std::ldexp(1.0, -53), 5e-324};
    case ncclFloat32: return {-3, 3, 10, std::ldexp(1.0, -24), std::ldexp(1.0, -149)};
    case ncclBfloat16: return {-3, 3, 10, std::ldexp(1.0, -8), std::ldexp(1.0, -133)};
    case ncclFloat16: return {-3, 2, 10, std::ldexp(1.0, -11), std::ldexp(1.0, -24)};
    case ncclFloat8e5m2: return {-3, 2, 10, std::ldexp(1.0, -3), std::ldexp(1.0, -16)};
    default: return {-2, 1, 4.5, std::ldexp(1.0, -4), std::ldexp(1.0, -9)};  // e4m3
  }
}

// Rounds `v` to the datatype and stores it at `p`.
void encode(ncclDataType_t t, double v, unsigned char* p) {
  float f = static_cast<float>(v);
  switch (t) {
    case ncclFloat64: std::memcpy(p, &v, 8); return;
    case ncclFloat32: std::memcpy(p, &f, 4); return;
    case ncclFloat16: {
      uint16_t h = kernels::float_to_half(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case ncclBfloat16: {
      uint16_t h = kernels::float_to_bf16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case ncclFloat8e4m3: *p = kernels::float_to_fp8e4m3(f); return;
    default: *p = kernels::float_to_fp8e5m2(f); return;
  }
}

double decode(ncclDataType_t t, const unsigned char* p) {
  switch (t) {
    case ncclFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case ncclFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case ncclFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return kernels::half_to_float(h);
    }
    case ncclBfloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return kernels::bf16_to_float(h);
    }
    case ncclFloat8e4m3: return kernels::fp8e4m3_to_float(*p);
    default: return kernels::fp8e5m2_to_float(*p);
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of `rank`'s input, before rounding to the datatype.
double generate(uint64_t key, int rank, size_t i, int op, const TypeInfo& info) {
  uint64_t h = mix(key ^ mix((static_cast<uint64_t>(rank) << 40) ^ i));
  double sign = (h >> 7) & 1 ? -1.0 : 1.0;
  if ((h & 15) == 0) return sign * 0.0;  // signed zeros: min/max must agree on them too
  double u = static_cast<double>((h >> 11) & 0xffffff) / 16777216.0;
  if (op == ncclProd) return sign * (0.7 + 0.7 * u);  // products of 8 stay in range
  uint64_t exponents = static_cast<uint64_t>(info.kmax - info.kmin + 1);
  int k = info.kmin + static_cast<int>((h >> 40) % exponents);
  return sign * (1.0 + (info.mmax - 1.0) * u) * std::pow(10.0, k);
}

// The PreMulSum scalar of `rank`: non-integer, different on every rank.
double premul_scalar(int rank) { return 0.553 + 0.09 * rank; }

std::string call_failed(const char* what, ncclResult_t r) {
  return fmt::format("{} returned {} ({}): {}", what, static_cast<int>(r), ncclGetErrorString(r),
                     ncclGetLastError(nullptr));
}

std::string hex(const unsigned char* p, size_t n) {
  std::string s = "0x";
  for (size_t b = n; b-- > 0;) s += fmt::format("{:02x}", p[b]);  // little endian
  return s;
}

// One AllReduce case on this rank; appends what is wrong to `out`. Returns false if the comm
// can no longer be trusted (a call failed).
bool run_one(ncclComm_t comm, int rank, int nranks, uint64_t seed, ncclDataType_t dtype, int op,
             size_t count, bool in_place, std::string* out) {
  const size_t es = type_size(dtype), bytes = count * es;
  const TypeInfo info = type_info(dtype);
  const uint64_t key = mix(seed ^ mix(static_cast<uint64_t>(dtype) * 131 + op) ^ mix(count));
  auto describe = [&] {
    return fmt::format("AllReduce {} {} count={} {} on {} ranks", type_name(dtype), kOpNames[op],
                       count, in_place ? "in-place" : "out-of-place", nranks);
  };

  // Every rank's input, rounded to the datatype (this rank's is the call's input).
  std::vector<unsigned char> inputs(bytes * nranks);
  for (int r = 0; r < nranks; ++r)
    for (size_t i = 0; i < count; ++i)
      encode(dtype, generate(key, r, i, op, info), &inputs[r * bytes + i * es]);
  std::vector<unsigned char> scalars(8 * nranks);
  for (int r = 0; r < nranks; ++r) encode(dtype, premul_scalar(r), &scalars[8 * r]);

  std::vector<unsigned char> send(in_place ? 0 : bytes), recv(std::max<size_t>(bytes, 1));
  unsigned char* sendbuf = in_place ? recv.data() : send.data();
  std::memcpy(sendbuf, &inputs[rank * bytes], bytes);
  ncclRedOp_t redop = static_cast<ncclRedOp_t>(op);
  if (op == kPreMul) {
    ncclResult_t r = ncclRedOpCreatePreMulSum(&redop, &scalars[8 * rank], dtype,
                                              ncclScalarHostImmediate, comm);
    if (r != ncclSuccess) {
      *out += describe() + ": " + call_failed("ncclRedOpCreatePreMulSum", r) + "\n";
      return false;
    }
  }
  ncclResult_t r = ncclAllReduce(sendbuf, recv.data(), count, dtype, redop, comm, nullptr);
  if (op == kPreMul) ncclRedOpDestroy(redop, comm);
  if (r != ncclSuccess) {
    *out += describe() + ": " + call_failed("ncclAllReduce", r) + "\n";
    return false;
  }

  // Bit-identical on every rank: everyone's output, here, byte for byte.
  std::vector<unsigned char> all(std::max<size_t>(bytes * nranks, 1));
  r = ncclAllGather(recv.data(), all.data(), bytes, ncclUint8, comm, nullptr);
  if (r != ncclSuccess) {
    *out += describe() + ": " + call_failed("ncclAllGather", r) + "\n";
    return false;
  }
  for (int p = 0; p < nranks; ++p) {
    const unsigned char* theirs = &all[p * bytes];
    if (std::memcmp(theirs, recv.data(), bytes) == 0) continue;
    size_t i = 0, differ = 0;
    for (size_t j = 0; j < count; ++j) {
      if (std::memcmp(theirs + j * es, recv.data() + j * es, es) == 0) continue;
      if (differ++ == 0) i = j;
    }
    *out += fmt::format("{}: rank {} and rank {} differ in {} of {} elements; first [{}]: "
                        "{} ({:.17g}) here, {} ({:.17g}) there\n",
                        describe(), rank, p, differ, count, i, hex(recv.data() + i * es, es),
                        decode(dtype, recv.data() + i * es), hex(theirs + i * es, es),
                        decode(dtype, theirs + i * es));
    break;  // one difference per case is enough
  }

  // Right, to within the datatype's rounding, against fp64.
  size_t wrong = 0, first = 0;
  double first_ref = 0, first_tol = 0;
  for (size_t i = 0; i < count; ++i) {
    double ref = 0, mag = 0;
    for (int q = 0; q < nranks; ++q) {
      double x = decode(dtype, &inputs[q * bytes + i * es]);
      switch (op) {
        case ncclSum:
        case ncclAvg: ref += x; mag += std::fabs(x); break;
        case ncclProd: ref = q == 0 ? x : ref * x; break;
        case ncclMax: ref = q == 0 ? x : std::max(ref, x); break;
        case ncclMin: ref = q == 0 ? x : std::min(ref, x); break;
        default: {
          double s = decode(dtype, &scalars[8 * q]);
          ref += s * x;
          mag += std::fabs(s * x);
        }
      }
    }
    if (op == ncclAvg) {
      ref /= nranks;
      mag /= nranks;
    }
    if (op == ncclProd) mag = std::fabs(ref);
    double tol = (op == ncclMax || op == ncclMin)
                     ? 0.0
                     : 2.0 * (nranks + 2) * (info.unit * mag + info.tiny);
    double got = decode(dtype, recv.data() + i * es);
    if (!(std::fabs(got - ref) <= tol)) {
      if (wrong++ == 0) {
        first = i;
        first_ref = ref;
        first_tol = tol;
      }
    }
  }
  if (wrong > 0) {
    *out += fmt::format("{}: rank {}: {} of {} elements wrong; first [{}]: {:.17g}, fp64 reference "
                        "{:.17g} (tolerance {:.3g})\n",
                        describe(), rank, wrong, count, first,
                        decode(dtype, recv.data() + first * es), first_ref, first_tol);
  }
  return true;
}

}  // namespace

std::vector<ncclDataType_t> float_datatypes() {
  std::vector<ncclDataType_t> v;
  for (ncclDataType_t t : all_datatypes()) {
    if (t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
        t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
      v.push_back(t);
  }
  return v;
}

const std::vector<std::string>& allreduce_algorithm_specs() {
  static const std::vector<std::string> kSpecs = {
      "auto",           "allreduce:ring",     "allreduce:rd",  "allreduce:rhd",
      "allreduce:oneshot", "allreduce:twoshot", "allreduce:tree", "allreduce:hier",
      "allreduce:box"};
  return kSpecs;
}

std::string check_allreduce_identical(ncclComm_t comm, uint64_t seed,
                                      const std::vector<size_t>& counts) {
  int rank = 0, nranks = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &nranks);
  // CHORUS_TEST_SEED varies the data from run to run (soak runs); the same on every rank.
  if (const char* extra = std::getenv("CHORUS_TEST_SEED"))
    seed ^= mix(std::strtoull(extra, nullptr, 0));
  std::string out;
  int failed_cases = 0;
  for (ncclDataType_t dtype : float_datatypes()) {
    for (int op = 0; op < kNumOps; ++op) {
      for (size_t c = 0; c < counts.size(); ++c) {
        std::string failure;
        bool usable = run_one(comm, rank, nranks, seed, dtype, op, counts[c], c == 0, &failure);
        if (!failure.empty() && ++failed_cases <= 6) out += failure;
        if (!usable) return out;
      }
    }
  }
  if (failed_cases > 6) out += fmt::format("... {} failing cases in all\n", failed_cases);
  return out;
}

}  // namespace chorus::test
