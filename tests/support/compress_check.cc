// SPDX-License-Identifier: Apache-2.0
// File: tests/support/compress_check.cc
//
// The error bound. One quantization of x in a block whose largest magnitude is A, to a format
// with m mantissa bits, is off by at most |x| * u + A * e: u = 2^-(m+1) (half a code step,
// relative; a whole step, 2^-m, with stochastic rounding) for values in the normal range, and
// e = 2^-14 covers the subnormal codes' absolute step (at most 2^-9 * scale for e4m3, the scale
// at most 2A/448, so A * 2^-16.8; e5m2 smaller). The fp32 arithmetic of the scales adds relative
// errors of order 2^-23, covered by a 1 % slack on u.
//   AllReduce:     b1 = sum over ranks p of (|x_p| u + A_p e), one per contribution (the owner's
//                  own is exact, counted anyway); the sum is quantized once more:
//                  b2 = (|ref| + b1) u + (A_ref + max b1 of the block) e; Avg divides b1 by n.
//   ReduceScatter: b1.
//   AllGather:     |x_p| u + A_p e for the block's owner p.
// Plus the output's rounding to its datatype: (|ref| + bound) * 2^-8 (bf16), 2^-11 (fp16).
#include "support/compress_check.h"

#include <chorus/compress.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/fp8/convert.h"
#include "support/coll_check.h"
#include "support/test_hosts.h"

namespace chorus::test {
namespace {

using kernels::bf16_to_float;
using kernels::float_to_bf16;
using kernels::float_to_half;
using kernels::half_to_float;

size_t dtype_bytes(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }
const char* dtype_label(ncclDataType_t t) {
  return t == ncclFloat32 ? "float32" : t == ncclBfloat16 ? "bfloat16" : "float16";
}
double out_rounding(ncclDataType_t t) {
  return t == ncclFloat32 ? 0x1p-24 : t == ncclBfloat16 ? 0x1p-8 : 0x1p-11;
}

// Rounds v to the datatype and stores it at element i.
void store(ncclDataType_t t, void* p, size_t i, double v) {
  float f = static_cast<float>(v);
  if (t == ncclFloat32) static_cast<float*>(p)[i] = f;
  else if (t == ncclBfloat16) static_cast<uint16_t*>(p)[i] = float_to_bf16(f);
  else static_cast<uint16_t*>(p)[i] = float_to_half(f);
}
double load(ncclDataType_t t, const void* p, size_t i) {
  if (t == ncclFloat32) return static_cast<const float*>(p)[i];
  if (t == ncclBfloat16) return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  return half_to_float(static_cast<const uint16_t*>(p)[i]);
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of rank p's input, representable in t: sign, mantissa in [1, 2), and a magnitude
// that changes every 100 elements (so blocks have different scales) and by element, from 2^-6
// to 2^5; a few exact zeros.
double input_value(uint64_t seed, int p, size_t i, ncclDataType_t t) {
  uint64_t h = mix(seed ^ mix(static_cast<uint64_t>(p) << 40 ^ i));
  if (h % 97 == 0) return 0.0;
  double m = 1.0 + static_cast<double>(h >> 11 & 0xfffff) / 1048576.0;
  int k = static_cast<int>(mix(seed + i / 100) % 8) - 6 + static_cast<int>(h >> 8 & 3);
  double v = std::ldexp((h & 1) ? -m : m, k);
  std::vector<unsigned char> tmp(4);
  store(t, tmp.data(), 0, v);
  return load(t, tmp.data(), 0);
}

struct CodecCase {
  chorusCompressFormat_t format;
  chorusScaleKind_t scale;
  unsigned block;
  chorusRounding_t rounding;
  std::string name() const {
    return fmt::format("{} {} block {} {}", format == chorusFp8E4M3 ? "e4m3" : "e5m2",
                       scale == chorusScaleFloat32 ? "fp32-scale" : "ue8m0",
                       block, rounding == chorusRoundNearestEven ? "rne" : "stochastic");
  }
  double u() const {
    double half = format == chorusFp8E4M3 ? 0x1p-4 : 0x1p-3;
    return (rounding == chorusRoundStochastic ? 2 * half : half) * 1.01;
  }
};
constexpr double kSubnormal = 0x1p-14;

enum class Kind { kAllReduce, kReduceScatter, kAllGather };
const char* kind_name(Kind k) {
  return k == Kind::kAllReduce ? "AllReduce" : k == Kind::kReduceScatter ? "ReduceScatter"
                                                                          : "AllGather";
}

struct Comm {
  ncclComm_t comm;
  int rank, n;
};

Comm comm_info(ncclComm_t comm) {
  Comm c{comm, 0, 1};
  ncclCommUserRank(comm, &c.rank);
  ncclCommCount(comm, &c.n);
  return c;
}

std::string call_error(const char* what, ncclResult_t r) {
  return fmt::format("{} returned {}: {}\n", what, static_cast<int>(r), ncclGetLastError(nullptr));
}

// Codec blocks of data cut into shards of `len` elements, each cut into blocks of `block` from
// its start: the block of element i, and the largest |x| of every block.
struct Blocks {
  size_t len, block, per_shard;
  Blocks(size_t len_, size_t block_)
      : len(len_), block(block_), per_shard((len_ + block_ - 1) / block_) {}
  size_t of(size_t i) const { return i / len * per_shard + i % len / block; }
  std::vector<double> amax(const std::vector<double>& x) const {
    std::vector<double> a(x.empty() ? 0 : of(x.size() - 1) + 1, 0.0);
    for (size_t i = 0; i < x.size(); ++i) a[of(i)] = std::max(a[of(i)], std::fabs(x[i]));
    return a;
  }
};

// Runs one compressed call on every rank and checks this rank's output. "" or the failure.
std::string run_case(const Comm& c, Kind kind, ncclDataType_t dtype, ncclRedOp_t op,
                     const CodecCase& codec, size_t count, bool in_place, uint64_t seed) {
  const int n = c.n, r = c.rank;
  const size_t esz = dtype_bytes(dtype);
  const size_t in_elems = kind == Kind::kReduceScatter ? count * n : count;
  const size_t out_elems = kind == Kind::kAllGather ? count * n : count;
  // Every rank's input, as the datatype's values.
  std::vector<std::vector<double>> x(n, std::vector<double>(in_elems));
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < in_elems; ++i) x[p][i] = input_value(seed, p, i, dtype);

  std::vector<unsigned char> sendbuf(in_elems * esz), recvbuf(out_elems * esz + 1);
  void* send = sendbuf.data();
  void* recv = recvbuf.data();
  if (in_place) {
    // NCCL's in-place forms: ReduceScatter's output is the rank's block of its input,
    // AllGather's input the rank's block of its output.
    if (kind == Kind::kAllReduce) send = recv;
    if (kind == Kind::kReduceScatter) {
      recvbuf.assign(in_elems * esz, 0);
      send = recvbuf.data();
      recv = recvbuf.data() + r * count * esz;
    }
    if (kind == Kind::kAllGather) send = recvbuf.data() + r * count * esz;
  }
  for (size_t i = 0; i < in_elems; ++i) store(dtype, send, i, x[r][i]);

  chorusCompressConfig_t cfg = CHORUS_COMPRESS_CONFIG_INIT;
  cfg.format = codec.format;
  cfg.scaleKind = codec.scale;
  cfg.blockSize = codec.block;
  cfg.rounding = codec.rounding;
  cfg.seed = seed;
  chorusCompressor_t comp = nullptr;
  ncclResult_t res = chorusCompressorCreate(&cfg, &comp);
  if (res != ncclSuccess) return call_error("chorusCompressorCreate", res);
  switch (kind) {
    case Kind::kAllReduce:
      res = chorusAllReduceCompressed(send, recv, count, dtype, op, comp, c.comm, nullptr);
      break;
    case Kind::kReduceScatter:
      res = chorusReduceScatterCompressed(send, recv, count, dtype, op, comp, c.comm, nullptr);
      break;
    case Kind::kAllGather:
      res = chorusAllGatherCompressed(send, recv, count, dtype, comp, c.comm, nullptr);
      break;
  }
  chorusCompressorDestroy(comp);
  const std::string what = fmt::format("{} {} {} {} count {}{}", kind_name(kind),
                                       dtype_label(dtype), static_cast<int>(op), codec.name(),
                                       count, in_place ? " in place" : "");
  if (res != ncclSuccess) return what + ": " + call_error("the call", res);

  const double u = codec.u(), e = kSubnormal;
  // AllReduce's blocks run over the whole buffer; ReduceScatter's input and AllGather's output
  // are cut into shards of `count` first.
  const Blocks blocks(kind == Kind::kAllReduce ? std::max<size_t>(count, 1) : count, codec.block);
  std::vector<std::vector<double>> amax(n);
  for (int p = 0; p < n; ++p) amax[p] = blocks.amax(x[p]);
  const bool is_max = op == ncclMax, is_min = op == ncclMin, is_avg = op == ncclAvg;
  std::string failures;
  int bad = 0;
  // Block amax of the result, for the second quantization of AllReduce.
  std::vector<double> ref(out_elems), b1(out_elems);
  for (size_t o = 0; o < out_elems; ++o) {
    if (kind == Kind::kAllGather) {
      const int p = static_cast<int>(o / count);
      const size_t i = o % count;
      ref[o] = x[p][i];
      b1[o] = std::fabs(x[p][i]) * u + amax[p][blocks.of(i)] * e;
      continue;
    }
    const size_t i = kind == Kind::kReduceScatter ? r * count + o : o;
    double acc = is_max ? -INFINITY : is_min ? INFINITY : 0, bound = 0;
    for (int p = 0; p < n; ++p) {
      double v = x[p][i];
      acc = is_max ? std::max(acc, v) : is_min ? std::min(acc, v) : acc + v;
      bound += std::fabs(v) * u + amax[p][blocks.of(i)] * e;
    }
    if (is_avg) {
      acc /= n;
      bound /= n;
    }
    ref[o] = acc;
    b1[o] = bound;
  }
  // The second quantization of AllReduce: the block's largest result and first-step bound.
  std::vector<double> ref_amax, b1_max;
  if (kind == Kind::kAllReduce) {
    ref_amax = blocks.amax(ref);
    b1_max = blocks.amax(b1);
  }
  for (size_t o = 0; o < out_elems; ++o) {
    double b = b1[o];
    if (kind == Kind::kAllReduce) {
      const size_t k = blocks.of(o);
      b += (std::fabs(ref[o]) + b1[o]) * u + (ref_amax[k] + b1_max[k]) * e;
    }
    b += (std::fabs(ref[o]) + b) * out_rounding(dtype) + 1e-30;
    double got = load(dtype, recv, o);
    if (!(std::fabs(got - ref[o]) <= b)) {
      if (++bad <= 3)
        failures += fmt::format("{}: element {} is {:.9g}, reference {:.9g}, bound {:.3g}\n",
                                what, o, got, ref[o], b);
    }
  }
  if (bad > 3) failures += fmt::format("{}: {} elements out of bound\n", what, bad);

  // AllReduce and AllGather: every rank holds the same bytes.
  if (kind != Kind::kReduceScatter && out_elems > 0) {
    const size_t bytes = out_elems * esz;
    std::vector<unsigned char> all(bytes * n);
    res = ncclAllGather(recv, all.data(), bytes, ncclUint8, c.comm, nullptr);
    if (res != ncclSuccess) return failures + what + ": " + call_error("ncclAllGather", res);
    for (int p = 0; p < n; ++p) {
      if (std::memcmp(all.data() + p * bytes, recv, bytes) != 0) {
        failures += fmt::format("{}: rank {}'s result differs from rank {}'s\n", what, p, r);
        break;
      }
    }
  }
  return failures;
}

}  // namespace

std::string check_compressed_matrix(ncclComm_t comm, uint64_t seed, bool large) {
  const Comm c = comm_info(comm);
  const CodecCase codecs[] = {
      {chorusFp8E4M3, chorusScaleFloat32, 128, chorusRoundNearestEven},
      {chorusFp8E5M2, chorusScaleFloat32, 128, chorusRoundNearestEven},
      {chorusFp8E4M3, chorusScaleUe8m0, 128, chorusRoundNearestEven},
      {chorusFp8E4M3, chorusScaleFloat32, 32, chorusRoundStochastic},
      {chorusFp8E5M2, chorusScaleUe8m0, 1, chorusRoundStochastic},
  };
  // The compressible datatypes, narrowed by CHORUS_TEST_DATATYPES as the other matrices are
  // (float is always kept: the sanitizer runs name few datatypes).
  std::vector<ncclDataType_t> dtypes;
  for (ncclDataType_t t : all_datatypes())
    if (t == ncclFloat32 || t == ncclBfloat16 || t == ncclFloat16) dtypes.push_back(t);
  if (std::find(dtypes.begin(), dtypes.end(), ncclFloat32) == dtypes.end())
    dtypes.push_back(ncclFloat32);
  const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMax, ncclMin};
  const size_t counts[] = {1, 127, 1000, 4099};
  std::string failures;
  for (const CodecCase& codec : codecs) {
    for (Kind kind : {Kind::kAllReduce, Kind::kReduceScatter, Kind::kAllGather}) {
      for (ncclDataType_t dtype : dtypes) {
        for (ncclRedOp_t op : ops) {
          if (kind == Kind::kAllGather && op != ncclSum) continue;
          for (size_t ci = 0; ci < std::size(counts); ++ci) {
            failures += run_case(c, kind, dtype, op, codec, counts[ci], ci % 2 == 1,
                                 seed + ci * 7 + static_cast<uint64_t>(op));
            if (failures.size() > 4000) return failures;
          }
        }
      }
    }
  }
  if (large) {
    // Several pipelined pieces per shard (a piece is 64 Ki elements), a short last block.
    for (Kind kind : {Kind::kAllReduce, Kind::kReduceScatter, Kind::kAllGather}) {
      const size_t count = kind == Kind::kAllReduce ? 150001 * c.n : 140003;
      failures += run_case(c, kind, ncclFloat32, ncclSum, codecs[0], count, false, seed);
      failures += run_case(c, kind, ncclBfloat16, ncclAvg, codecs[3], count, true, seed + 1);
    }
  }
  return failures;
}

namespace {

// The host of every rank when the test simulates hosts (support/test_hosts.h), else empty (one
// host).
std::vector<std::string> test_hosts(int n) {
  std::vector<std::string> hosts = test_host_of();
  if (static_cast<int>(hosts.size()) != n) hosts.clear();
  return hosts;
}

// Whether AllReduce runs hierarchically: several hosts with as many ranks each, two at least.
bool hierarchical(const std::vector<std::string>& hosts) {
  std::map<std::string, int> per_host;
  for (const std::string& h : hosts) ++per_host[h];
  if (per_host.size() < 2) return false;
  for (const auto& [name, ranks] : per_host)
    if (ranks != per_host.begin()->second || ranks < 2) return false;
  return true;
}

}  // namespace

std::string check_compressed_volume(ncclComm_t comm) {
  const Comm c = comm_info(comm);
  std::string failures;
  // On several hosts a compressed AllReduce compresses only what crosses hosts (the
  // hierarchical AllReduce's cross-host stage): a peer on this host gets exact bytes; of the
  // others, some get none (they are not this rank's cross-host peers).
  const std::vector<std::string> hosts = test_hosts(c.n);
  const bool hier = hierarchical(hosts);
  const size_t count = 128 * 1024 * c.n;  // whole blocks in every shard
  std::vector<float> in(count * c.n, 0.5f), out(count * c.n);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 1000) * 0.001f - 0.37f;
  struct Limit {
    chorusScaleKind_t scale;
    double max_ratio;
  };
  for (Limit lim : {Limit{chorusScaleFloat32, 0.26}, Limit{chorusScaleUe8m0, 0.252}}) {
    chorusCompressConfig_t cfg = CHORUS_COMPRESS_CONFIG_INIT;
    cfg.scaleKind = lim.scale;
    chorusCompressor_t comp = nullptr;
    if (chorusCompressorCreate(&cfg, &comp) != ncclSuccess)
      return "chorusCompressorCreate failed\n";
    for (Kind kind : {Kind::kAllReduce, Kind::kReduceScatter, Kind::kAllGather}) {
      // A rank's counters count what it posts: its calls on the NULL stream are over.
      chorusCommResetByteCounters(comm);
      ncclResult_t res = ncclSuccess;
      if (kind == Kind::kAllReduce)
        res = chorusAllReduceCompressed(in.data(), out.data(), count, ncclFloat32, ncclSum, comp,
                                        comm, nullptr);
      if (kind == Kind::kReduceScatter)
        res = chorusReduceScatterCompressed(in.data(), out.data(), count / c.n, ncclFloat32,
                                            ncclSum, comp, comm, nullptr);
      if (kind == Kind::kAllGather)
        res = chorusAllGatherCompressed(in.data(), out.data(), count / c.n, ncclFloat32, comp,
                                        comm, nullptr);
      if (res != ncclSuccess) return failures + call_error(kind_name(kind), res);
      int compressed_peers = 0;
      for (int peer = 0; peer < c.n; ++peer) {
        if (peer == c.rank) continue;
        chorusByteCounters_t b{};
        if (chorusCommGetByteCounters(comm, peer, &b) != ncclSuccess)
          return failures + "chorusCommGetByteCounters failed\n";
        if (hier && kind == Kind::kAllReduce) {
          const bool same_host = hosts[peer] == hosts[c.rank];
          if (same_host && (b.wireBytesSent != b.dataBytesSent || b.dataBytesSent == 0))
            failures += fmt::format("AllReduce: peer {} on this host: wire {} / data {} bytes "
                                    "sent; expected exact data\n", peer, b.wireBytesSent,
                                    b.dataBytesSent);
          if (same_host || b.dataBytesSent == 0) continue;
          ++compressed_peers;
        }
        double sent = static_cast<double>(b.wireBytesSent) / b.dataBytesSent;
        double received = static_cast<double>(b.wireBytesReceived) / b.dataBytesReceived;
        if (b.dataBytesSent == 0 || b.dataBytesReceived == 0 || !(sent <= lim.max_ratio) ||
            !(received <= lim.max_ratio) || sent < 0.2 || received < 0.2)
          failures += fmt::format(
              "{} {}: to/from peer {}: wire {} / data {} sent ({:.4f}), wire {} / data {} "
              "received ({:.4f}); expected at most {}\n",
              kind_name(kind), lim.scale == chorusScaleFloat32 ? "fp32 scales" : "ue8m0 scales",
              peer, b.wireBytesSent, b.dataBytesSent, sent, b.wireBytesReceived,
              b.dataBytesReceived, received, lim.max_ratio);
      }
      if (hier && kind == Kind::kAllReduce && compressed_peers == 0)
        failures += "AllReduce: no peer on another host got compressed data\n";
    }
    chorusCompressorDestroy(comp);
  }
  // Plain calls: wire == data.
  chorusCommResetByteCounters(comm);
  ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr);
  chorusByteCounters_t all{};
  chorusCommGetByteCounters(comm, -1, &all);
  if (all.wireBytesSent != all.dataBytesSent || all.wireBytesSent == 0)
    failures += fmt::format("plain AllReduce: wire {} data {} bytes sent\n", all.wireBytesSent,
                            all.dataBytesSent);
  return failures;
}

std::string check_compressed_nonfinite(ncclComm_t comm) {
  const Comm c = comm_info(comm);
  const size_t count = 1000;
  std::vector<float> buf(count);
  chorusCompressor_t comp = nullptr;
  if (chorusCompressorCreate(nullptr, &comp) != ncclSuccess)
    return "chorusCompressorCreate failed\n";
  std::string failures;
  for (float bad : {INFINITY, NAN}) {
    for (size_t i = 0; i < count; ++i) buf[i] = 0.25f * static_cast<float>(i % 7) - 0.6f;
    if (c.rank == c.n - 1) buf[300] = bad;  // block 2 (elements 256..383)
    ncclResult_t res = chorusAllReduceCompressed(buf.data(), buf.data(), count, ncclFloat32,
                                                 ncclSum, comp, comm, nullptr);
    if (res != ncclSuccess) return call_error("chorusAllReduceCompressed", res);
    for (size_t i = 0; i < count; ++i) {
      bool in_block = i >= 256 && i < 384;
      if (in_block != std::isnan(buf[i])) {
        failures += fmt::format("with {} at element 300 of rank {}: element {} is {}\n", bad,
                                c.n - 1, i, buf[i]);
        break;
      }
    }
  }
  chorusCompressorDestroy(comp);
  return failures;
}

std::string check_error_feedback(ncclComm_t comm) {
  const Comm c = comm_info(comm);
  const size_t count = 4096;
  const int steps = 32;
  std::vector<float> grad(count), out(count);
  std::vector<double> exact(count, 0.0);
  for (int p = 0; p < c.n; ++p)
    for (size_t i = 0; i < count; ++i)
      exact[i] += static_cast<float>(input_value(99, p, i, ncclFloat32));
  for (size_t i = 0; i < count; ++i)
    grad[i] = static_cast<float>(input_value(99, c.rank, i, ncclFloat32));
  double err[2];
  std::string failures;
  for (int feedback = 0; feedback < 2; ++feedback) {
    chorusCompressConfig_t cfg = CHORUS_COMPRESS_CONFIG_INIT;
    cfg.errorFeedback = feedback;
    chorusCompressor_t comp = nullptr;
    if (chorusCompressorCreate(&cfg, &comp) != ncclSuccess)
      return "chorusCompressorCreate failed\n";
    std::vector<double> mean(count, 0.0);
    for (int s = 0; s < steps; ++s) {
      ncclResult_t res = chorusAllReduceCompressed(grad.data(), out.data(), count, ncclFloat32,
                                                   ncclSum, comp, comm, nullptr);
      if (res != ncclSuccess) return call_error("chorusAllReduceCompressed", res);
      for (size_t i = 0; i < count; ++i) mean[i] += out[i] / steps;
    }
    double e = 0, norm = 0;
    for (size_t i = 0; i < count; ++i) {
      e += std::fabs(mean[i] - exact[i]);
      norm += std::fabs(exact[i]);
    }
    err[feedback] = e / norm;
    if (feedback == 1) {
      // Bound to 4096 elements of AllReduce: another count is refused, until a reset.
      ncclResult_t res = chorusAllReduceCompressed(grad.data(), out.data(), count - 1,
                                                   ncclFloat32, ncclSum, comp, comm, nullptr);
      if (res != ncclInvalidUsage)
        failures += fmt::format("a call of another count on a bound compressor returned {}\n",
                                static_cast<int>(res));
      if (chorusCompressorReset(comp) != ncclSuccess) failures += "chorusCompressorReset failed\n";
      res = chorusAllReduceCompressed(grad.data(), out.data(), count - 1, ncclFloat32, ncclSum,
                                      comp, comm, nullptr);
      if (res != ncclSuccess) failures += call_error("after reset, chorusAllReduceCompressed", res);
    }
    chorusCompressorDestroy(comp);
  }
  // Without feedback the error of every step is the same (the same input); with it, the
  // residual carries what each step dropped into the next, so the mean converges.
  if (!(err[1] < err[0] / 4))
    failures += fmt::format("mean relative error over {} steps: {:.3g} without error feedback, "
                            "{:.3g} with it (expected at least 4x smaller)\n",
                            steps, err[0], err[1]);
  return failures;
}

}  // namespace chorus::test
