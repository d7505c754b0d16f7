// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/approx.cc
// The error bound of the compressed collectives and the check against it.
//
// One quantization. A block of at most B consecutive elements with largest magnitude A gets a
// scale s (fp32: A / FP8_MAX; UE8M0: the power of two at or above it, so s <= 2 A / FP8_MAX)
// and every x of the block becomes s * q, q the FP8 value nearest to x / s (|x / s| <= FP8_MAX,
// so nothing saturates). With m mantissa bits (E4M3: 3, E5M2: 2) a normal q is within half an
// ulp, 2^-(m+1) |x / s|, of x / s; a subnormal one within half the subnormal spacing (E4M3
// 2^-10, E5M2 2^-17), i.e. within 2^-10 s <= 2^-10 * 2 A / 448 < 2^-(m+1) A. Either way
//     |s q - x| <= u A,   u = 2^-(m+1)   (stochastic rounding: within one ulp, u = 2^-m).
// The bound uses A, not |x|: small elements of a block with a large one lose their low bits.
//
// (This is the codec of kernels/compress: fp32 s = max(amax / FP8_MAX, FLT_MIN), UE8M0 the
// smallest power of two with amax <= FP8_MAX * s, a saturating nearest-even encoder.)
// Where the blocks start is the library's business (per shard, per pipeline chunk...), but a
// block holding element e lies within [e - B + 1, e + B - 1]. So with G_r(e), the largest
// |input of rank r| within 2B - 2 of e, every block of either stage below that touches e has
// inputs bounded by G_r(e) (a stage-2 block element k is within B - 1 of e, and its stage-1
// blocks within B - 1 of k).
//
// AllReduce (compress.h: the owner j of a shard adds the n - 1 quantized shards of the other
// ranks to its exact own shard, quantizes the sum once, every rank decodes that):
//   stage 1: the sum S'(k) = S(k) + sum_{r != j} d_r(k), |d_r(k)| <= u G_r(e), so
//            |S'(k) - S(k)| <= u sum_r G_r(e) and |S'(k)| <= (1 + u) sum_r G_r(e);
//   stage 2: |Q(S'(e)) - S'(e)| <= u max_block |S'| <= u (1 + u) sum_r G_r(e);
//   total:   |result - S| <= (2u + u^2) sum_r G_r(e).
// Max and Min move by at most the largest stage-1 error, and sum_r G_r bounds that as well.
// ReduceScatter is stage 1 alone: u sum_r G_r(e). AllGather quantizes each block of its owner
// o once: u G_o(e). Avg divides every term by n.
// fp32 arithmetic: kernels/compress/README.md bounds one encode + decode by
// (u + 2^-20) |x| + 2^(-bias-m) s + 2^-149 (the roundings of 1/s, x * (1/s) and s * q, and
// the subnormal step), i.e. within u A + 2^-16 A for either scale kind (s <= 2 A / FP8_MAX);
// the n - 1 fp32 additions and Avg's division add a few ulps of partial sums <= (1 + u)
// sum_r G_r. So 2^-16 per stage plus (n + 8) 2^-23, times sum_r G_r, covers the arithmetic. A bf16 or
// fp16 result is rounded once more (and the exact Avg reference once): half an ulp, 2^-8
// (bf16) or 2^-11 (fp16) of the magnitude, on each side.
// With error feedback the residual is zeroed before every checked call (the runner resets the
// compressor), so the checked call quantizes its input alone and the same bound holds.
//
// Sharp for the generated inputs: the integers 0..15 (sum) put 15 in nearly every block, so
// G_r = 15; E4M3 over 2 ranks allows |error| <= 0.129 * 30 = 3.9 on sums of 0..30.
#include "bench/coll/approx.h"

#include <fmt/format.h>

#include <strings.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace chorus::bench {

namespace {

constexpr size_t kPiece = size_t{1} << 16;  // elements generated at a time
// Chunks of the magnitude table: at least the block, and at least this many elements, so
// that a block of 1 does not make the table as large as the input. A window of 2B - 2 either
// side of e stays within chunks c - 2 .. c + 2 of element e's chunk c when chunk >= B.
constexpr size_t kMinChunk = 256;

}  // namespace

double ApproxChecker::unit_error(const CompressOptions& c) {
  const int mantissa = c.format == chorusFp8E4M3 ? 3 : 2;
  const int exponent = c.rounding == chorusRoundStochastic ? mantissa : mantissa + 1;
  return std::ldexp(1.0, -exponent);
}

ApproxChecker::ApproxChecker(const verify::Verifier& v, const CompressOptions& c)
    : v_(v), block_(std::max<size_t>(c.block, kMinChunk)) {
  const verify::CallShape& s = v.shape();
  const double u = unit_error(c);
  const int stages = s.coll == verify::Coll::kAllReduce ? 2 : 1;
  const double codec = stages == 2 ? 2 * u + u * u : u;
  stage_factor_ = codec + stages * std::ldexp(1.0, -16) + (s.nranks + 8) * std::ldexp(1.0, -23);
  if (s.op == ncclAvg && s.coll != verify::Coll::kAllGather) stage_factor_ /= s.nranks;
  out_rel_ = s.dtype == ncclBfloat16  ? std::ldexp(1.0, -8)
             : s.dtype == ncclFloat16 ? std::ldexp(1.0, -11)
                                      : std::ldexp(1.0, -24);
  std::vector<unsigned char> piece(kPiece * v.element_bytes());
  chunk_max_.resize(static_cast<size_t>(s.nranks));
  for (int r = 0; r < s.nranks; ++r) {
    const size_t n = v.input_count(r);
    std::vector<double>& m = chunk_max_[static_cast<size_t>(r)];
    m.assign((n + block_ - 1) / block_, 0.0);
    for (size_t first = 0; first < n; first += kPiece) {
      const size_t len = std::min(kPiece, n - first);
      v.fill_input(r, piece.data(), first, len);
      for (size_t k = 0; k < len; ++k) {
        double a = std::fabs(v.decode(piece.data() + k * v.element_bytes()));
        double& slot = m[(first + k) / block_];
        if (!(a <= slot)) slot = a;  // NaN, should an input hold one, poisons the bound
      }
    }
  }
}

double ApproxChecker::window_max(int r, size_t e) const {
  const std::vector<double>& m = chunk_max_[static_cast<size_t>(r)];
  if (m.empty()) return 0.0;
  const size_t c = e / block_;
  const size_t lo = c >= 2 ? c - 2 : 0;
  const size_t hi = std::min(c + 2, m.size() - 1);
  double best = 0.0;
  for (size_t k = lo; k <= hi; ++k) best = std::max(best, m[k]);
  return best;
}

double ApproxChecker::tolerance(int rank, size_t o, double exact) const {
  const verify::CallShape& s = v_.shape();
  double sum_g = 0.0;
  switch (s.coll) {
    case verify::Coll::kAllGather: {
      const size_t count = std::max<size_t>(s.count, 1);
      sum_g = window_max(static_cast<int>(o / count), o % count);
      break;
    }
    case verify::Coll::kReduceScatter: {
      const size_t e = static_cast<size_t>(rank) * s.count + o;
      for (int r = 0; r < s.nranks; ++r) sum_g += window_max(r, e);
      break;
    }
    default:
      for (int r = 0; r < s.nranks; ++r) sum_g += window_max(r, o);
      break;
  }
  const double b = stage_factor_ * sum_g;
  // The output's own rounding on both sides, plus fp16's subnormal spacing.
  return b + out_rel_ * (2 * std::fabs(exact) + b) + std::ldexp(1.0, -24);
}

verify::Mismatch ApproxChecker::check(int rank, const void* got, int max_reported) const {
  verify::Mismatch m;
  const size_t n = v_.output_count(rank);
  const size_t eb = v_.element_bytes();
  const unsigned char* g = static_cast<const unsigned char*>(got);
  std::vector<unsigned char> want(kPiece * eb);
  int reported = 0;
  for (size_t first = 0; first < n; first += kPiece) {
    const size_t len = std::min(kPiece, n - first);
    v_.fill_expected(rank, want.data(), first, len);
    for (size_t k = 0; k < len; ++k) {
      const double w = v_.decode(want.data() + k * eb);
      const double x = v_.decode(g + (first + k) * eb);
      const double tol = tolerance(rank, first + k, w);
      if (std::fabs(x - w) <= tol) continue;  // false for NaN
      ++m.wrong;
      if (reported++ < max_reported)
        m.first += fmt::format(" [{}]: got {} want {} +- {:.4g};", first + k, x, w, tol);
    }
  }
  return m;
}

CompressOptions transparent_compression(verify::Coll coll) {
  CompressOptions c;
  if (coll != verify::Coll::kAllReduce && coll != verify::Coll::kReduceScatter) return c;
  const char* format = std::getenv("CHORUS_COMPRESS");
  if (format == nullptr) return c;
  if (strcasecmp(format, "FP8_E4M3") == 0) {
    c.format = chorusFp8E4M3;
  } else if (strcasecmp(format, "FP8_E5M2") == 0) {
    c.format = chorusFp8E5M2;
  } else {
    return c;
  }
  c.enabled = true;
  c.policy = chorusCompressAuto;
  if (const char* block = std::getenv("CHORUS_COMPRESS_BLOCK")) {
    char* end = nullptr;
    long b = std::strtol(block, &end, 10);
    if (end != block && *end == '\0' && b >= 1 && b <= 65536) c.block = static_cast<unsigned>(b);
  }
  const char* scale = std::getenv("CHORUS_COMPRESS_SCALE");
  if (scale != nullptr && strcasecmp(scale, "UE8M0") == 0) c.scale = chorusScaleUe8m0;
  return c;
}

bool compressible(ncclDataType_t dtype, int op) {
  return (dtype == ncclFloat32 || dtype == ncclBfloat16 || dtype == ncclFloat16) &&
         (op == ncclSum || op == ncclAvg || op == ncclMax || op == ncclMin);
}

uint64_t hash_bytes(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x243F6A8885A308D3ull ^ n;
  auto mix = [&h](uint64_t w) {
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    mix(w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  mix(tail);
  return h;
}

}  // namespace chorus::bench
