// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/codec_driver.h
// The block loops shared by the SIMD codec tables. A kernel walks a block kWidth elements at a
// time (4 * kWidth where it can) and runs the block's tail through zero-padded bounce buffers
// (zeros do not change the amax), so every element takes the same vector path. Blocks go in
// groups of kWidth, so that the per-block work (amax reduction, scale) is done for a whole
// group with vector operations, off the element loops; what is not (UE8M0 exponents, random
// stream keys, the rare decode blocks that need a second multiply or the saturation) is the
// scalar code of codec_common.h. Include it only inside an ISA's target region, after every
// standard header (see codec_avx2.cc).
//
// An ISA provides a struct V (all members static):
//   kWidth; F (kWidth fp32 lanes), I (kWidth uint32 lanes)
//   F load<S>(const Byte*)                 kWidth source elements, widened exactly
//   I max_abs(I, F), I max_u32(I, I), I zero()   running max of |x|'s bits
//   I hmax_each(const I acc[kWidth])      lane j: the largest lane of acc[j]
//   void store_u32(uint32_t*, I)
//   fp32_scales<Fmt>(I amax, uint32_t bits[kWidth], float inv[kWidth])   block_scale's FP32
//       scales (bits) and multipliers (inv) of kWidth blocks; a non-finite block's inv is unused
//   F splat(float), F mul(F, F), F add(F, F) (each rounded on its own: never fused into an FMA),
//   F load_f32(const Byte*), store_f32(Byte*, F)
//   F clamp(F v, F hi, F lo)                max(lo, min(hi, v)), a NaN v passing through
//   I codes_rne<Fmt>(F q), I codes_sr<Fmt>(F q, I r)   codes (with sign) in uint32 lanes
//   store_codes(Byte*, I), store_codes4(Byte*, I, I, I, I)   kWidth or 4 * kWidth codes
//   store_rne4<Fmt>(Byte*, F, F, F, F)      the 4 * kWidth codes_rne of four vectors, stored
//   I random(uint32_t first, uint32_t lo, uint32_t k0, uint32_t k1)  the random words of the
//       indices whose low halves are idx = first + lane (mod 2^32): fmix32(idx ^ (idx < lo ?
//       k1 : k0)), lo being the block's first index (see random_word())
//   I random_one_key(uint32_t first, uint32_t k0)    the same when no index wraps: fmix32(idx ^ k0)
//   F load_codes<Fmt>(const Byte*)          kWidth codes' values (e4m3: divided by 256)
//   void load_codes4<Fmt>(const Byte*, F&, F&, F&, F&)   the same for 4 * kWidth codes
//   void store_out<S>(Byte*, F)             kWidth elements rounded to S as the reference
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/compress/codec_common.h"

#define CHORUS_CODEC_INLINE inline __attribute__((always_inline))
#define CHORUS_CODEC_INLINE_LAMBDA __attribute__((always_inline))

namespace chorus::kernels::codec {

template <size_t kBytes>
struct CodecBounce {
  alignas(64) Byte bytes[kBytes] = {};
};

// The running max of |x|'s bits over the n elements at x (a vector: V::hmax_each reduces it).
template <class V, DataType S>
CHORUS_CODEC_INLINE typename V::I block_amax(const Byte* x, size_t n) {
  constexpr size_t kW = V::kWidth, kEs = source_bytes(S);
  const size_t full = n - n % kW;
  auto amax = V::zero(), amax1 = V::zero();  // two chains: half the loop steps and latency
  size_t i = 0;
#pragma GCC unroll 8
  for (; i + 2 * kW <= full; i += 2 * kW) {
    amax = V::max_abs(amax, V::template load<S>(x + i * kEs));
    amax1 = V::max_abs(amax1, V::template load<S>(x + (i + kW) * kEs));
  }
  amax = V::max_u32(amax, amax1);
  if (i != full) amax = V::max_abs(amax, V::template load<S>(x + i * kEs));
  if (full != n) {
    CodecBounce<kW * kEs> tail;
    std::memcpy(tail.bytes, x + full * kEs, (n - full) * kEs);
    amax = V::max_abs(amax, V::template load<S>(tail.bytes));
  }
  return amax;
}

// The amaxes of blocks [g, g + kWidth) and their stored scales (bits) and multipliers (inv); a
// non-finite block's inv is unused. The blocks' running maxima are reduced together by one
// transposition (V::hmax_each: about 3 ops a block where a reduction of its own takes 8, and no
// vector-to-scalar move), and FP32 scales are computed for the whole group with vector divisions.
template <size_t kW>
struct GroupScales {
  alignas(64) uint32_t amax[kW];
  alignas(64) uint32_t bits[kW];
  alignas(64) float inv[kW];
};
template <class V, DataType S, class Fmt, ScaleKind K, size_t kBlock>
CHORUS_CODEC_INLINE void group_scales(const Byte* in, size_t count, size_t block, size_t g,
                                      size_t nb, GroupScales<V::kWidth>& out) {
  constexpr size_t kW = V::kWidth, kEs = source_bytes(S);
  const size_t blocks = nb - g < kW ? nb - g : kW;
  typename V::I acc[kW];
#pragma GCC unroll 16
  for (size_t j = 0; j < kW; ++j) {
    const size_t begin = (g + j) * block;
    const size_t n = kBlock != 0 ? kBlock : count - begin < block ? count - begin : block;
    acc[j] = j < blocks ? block_amax<V, S>(in + begin * kEs, n) : V::zero();
  }
  const auto group_amax = V::hmax_each(acc);
  V::store_u32(out.amax, group_amax);
  if constexpr (K == ScaleKind::kFloat32) {
    V::template fp32_scales<Fmt>(group_amax, out.bits, out.inv);
  } else {
    for (size_t j = 0; j < blocks; ++j) {
      const BlockScale scale = block_scale<Fmt, K>(out.amax[j]);
      out.bits[j] = scale.bits;
      out.inv[j] = scale.inv;
    }
  }
}

// Blocks are encoded in groups of kWidth, software-pipelined: the scales of the next group are
// computed before the current group is encoded, so that the latency of their reduction and
// divisions (tens of cycles, which every encoding instruction of a group depends on) overlaps
// the current group's encoding instead of stalling it. The next group's elements are read
// kWidth blocks ahead of their encoding (8 KiB for FP32, AVX-512): they are still in L1 then.
// kBlock != 0: every block has kBlock elements (block == kBlock, count a multiple of it), so the
// element loops have constant trip counts and no tails.
template <class V, DataType S, class Fmt, ScaleKind K, Rounding R, size_t kBlock>
void encode_blocks(Byte* scales, Byte* codes, const Byte* in, size_t count, size_t block,
                   RandomStream rng) {
  constexpr size_t kW = V::kWidth, kEs = source_bytes(S);
  if (kBlock != 0) block = kBlock;
  const size_t nb = num_blocks(count, static_cast<uint32_t>(block));
  GroupScales<kW> group[2];
  if (nb != 0) group_scales<V, S, Fmt, K, kBlock>(in, count, block, 0, nb, group[0]);
  for (size_t g = 0, cur = 0; g < nb; g += kW, cur ^= 1) {
    if (g + kW < nb) {
      group_scales<V, S, Fmt, K, kBlock>(in, count, block, g + kW, nb, group[cur ^ 1]);
    }
    const GroupScales<kW>& sc = group[cur];
    const size_t blocks = nb - g < kW ? nb - g : kW;
    for (size_t j = 0; j < blocks; ++j) {
      const size_t b = g + j;
      const size_t begin = b * block;
      const size_t n = kBlock != 0 ? kBlock : count - begin < block ? count - begin : block;
      const Byte* x = in + begin * kEs;
      Byte* c = codes + begin;
      store_scale<K>(scales, b, sc.bits[j]);
      if (sc.amax[j] >= 0x7f800000u) {  // an Inf or NaN in the block (block_scale's test)
        std::memset(c, static_cast<int>(Fmt::kNanCode), n);
        continue;
      }
      const auto inv = V::splat(sc.inv[j]);
      uint32_t lo = 0, k0 = 0, k1 = 0;
      bool wraps = false;  // the block's indices cross a multiple of 2^32: two keys
      if constexpr (R == Rounding::kStochastic) {
        const uint64_t base = rng.counter + begin;
        lo = static_cast<uint32_t>(base);
        k0 = stream_key(rng.seed, static_cast<uint32_t>(base >> 32));
        k1 = stream_key(rng.seed, static_cast<uint32_t>(base >> 32) + 1);
        wraps = static_cast<uint32_t>(lo + (n - 1)) < lo;
      }
      auto scaled = [&](const Byte* p) CHORUS_CODEC_INLINE_LAMBDA {
        return V::mul(V::template load<S>(p), inv);
      };
      // The codes of the kWidth elements at p, element i of the block first.
      auto codes_at = [&](const Byte* p, size_t i) CHORUS_CODEC_INLINE_LAMBDA {
        const auto q = scaled(p);
        if constexpr (R == Rounding::kNearestEven) {
          return V::template codes_rne<Fmt>(q);
        } else {
          const auto first = lo + static_cast<uint32_t>(i);
          return V::template codes_sr<Fmt>(
              q, wraps ? V::random(first, lo, k0, k1) : V::random_one_key(first, k0));
        }
      };
      const size_t full = n - n % kW;
      size_t i = 0;
#pragma GCC unroll 4
      for (; i + 4 * kW <= full; i += 4 * kW) {
        if constexpr (R == Rounding::kNearestEven) {
          V::template store_rne4<Fmt>(c + i, scaled(x + i * kEs), scaled(x + (i + kW) * kEs),
                                      scaled(x + (i + 2 * kW) * kEs),
                                      scaled(x + (i + 3 * kW) * kEs));
        } else {
          V::store_codes4(c + i, codes_at(x + i * kEs, i), codes_at(x + (i + kW) * kEs, i + kW),
                          codes_at(x + (i + 2 * kW) * kEs, i + 2 * kW),
                          codes_at(x + (i + 3 * kW) * kEs, i + 3 * kW));
        }
      }
      for (; i < full; i += kW) V::store_codes(c + i, codes_at(x + i * kEs, i));
      if (full != n) {
        CodecBounce<kW * kEs> tail;
        CodecBounce<kW> out;
        std::memcpy(tail.bytes, x + full * kEs, (n - full) * kEs);
        V::store_codes(out.bytes, codes_at(tail.bytes, full));
        std::memcpy(c + full, out.bytes, n - full);
      }
    }
  }
}

// Blocks of 128 elements (the default, DeepEP's) take encode_blocks<..., 128>; a short last
// block, and other block sizes, the general loops.
template <class V, DataType S, class Fmt, ScaleKind K, Rounding R>
void encode_kernel(void* dst, const void* src, size_t count, uint32_t block, RandomStream rng) {
  constexpr size_t kEs = source_bytes(S), kFixed = 128;
  const size_t nb = num_blocks(count, block);
  auto* scales = static_cast<Byte*>(dst);
  Byte* codes = scales + nb * scale_bytes(K);
  const auto* in = static_cast<const Byte*>(src);
  if (block != kFixed) {
    encode_blocks<V, S, Fmt, K, R, 0>(scales, codes, in, count, block, rng);
    return;
  }
  const size_t full = count - count % kFixed;
  encode_blocks<V, S, Fmt, K, R, kFixed>(scales, codes, in, full, kFixed, rng);
  if (full == count) return;
  encode_blocks<V, S, Fmt, K, R, 0>(scales + full / kFixed * scale_bytes(K), codes + full,
                                    in + full * kEs, count - full, kFixed,
                                    RandomStream{rng.seed, rng.counter + full});
}

// Multipliers of a block's load_codes() values: e4m3 folds its 2^8 into the scale when that is
// exact (s * 256 finite, or NaN); otherwise the value is multiplied by 256 first, then by s.
// Either way each element is fp8_value * s rounded once, as in the reference.
template <class Fmt>
struct DecodeScale {
  float first;
  float second;
  bool twice;
};
template <class Fmt, ScaleKind K>
DecodeScale<Fmt> decode_scale(const Byte* scales, size_t b) {
  const float s = load_scale<K>(scales, b);
  if constexpr (Fmt::kHasInf) {
    return {s, 1.0f, false};
  } else {
    const float folded = s * 256.0f;
    if (folded - folded == 0.0f || s != s) return {folded, 1.0f, false};
    return {256.0f, s, true};
  }
}

// The saturation is skipped for a block whose largest finite code times s cannot exceed the
// output's maximum (rounding is monotonic) and whose format has no infinity code: then it would
// change nothing. A NaN scale fails the test and takes the full path.
template <class V, class Fmt>
struct DecodeLanes {
  typename V::F first, second, hi, lo;
  bool twice, clamp;
  template <DataType S, ScaleKind K>
  static DecodeLanes make(const Byte* scales, size_t b) {
    const DecodeScale<Fmt> ds = decode_scale<Fmt, K>(scales, b);
    const float s = load_scale<K>(scales, b);
    const bool bounded = !Fmt::kHasInf && Fmt::kMaxValue * s <= kOutputMax<S> &&
                         -Fmt::kMaxValue * s >= -kOutputMax<S>;
    return {V::splat(ds.first), V::splat(ds.second), V::splat(kOutputMax<S>),
            V::splat(-kOutputMax<S>), ds.twice, !bounded};
  }
  // load_codes() values v: v * s, saturated (see saturate()). kPlain: neither a second
  // multiplication nor the saturation (the common case, taken with those tests out of the loop).
  template <bool kPlain>
  CHORUS_CODEC_INLINE typename V::F scale(typename V::F v) const {
    v = V::mul(v, first);
    if (kPlain) return v;
    if (twice) v = V::mul(v, second);
    return clamp ? V::clamp(v, hi, lo) : v;
  }
};

// Calls out(i, values) for the kWidth decoded values of the codes at c + i, for every i < full
// (a multiple of kWidth), 4 * kWidth codes at a time while it can (V::load_codes4).
template <class V, class Fmt, bool kPlain, class Out>
CHORUS_CODEC_INLINE void decode_run(const DecodeLanes<V, Fmt>& lanes, const Byte* c, size_t full,
                                    Out&& out) {
  constexpr size_t kW = V::kWidth;
  size_t i = 0;
  for (; i + 4 * kW <= full; i += 4 * kW) {
    typename V::F v0, v1, v2, v3;
    V::template load_codes4<Fmt>(c + i, v0, v1, v2, v3);
    out(i, lanes.template scale<kPlain>(v0));
    out(i + kW, lanes.template scale<kPlain>(v1));
    out(i + 2 * kW, lanes.template scale<kPlain>(v2));
    out(i + 3 * kW, lanes.template scale<kPlain>(v3));
  }
  for (; i < full; i += kW) out(i, lanes.template scale<kPlain>(V::template load_codes<Fmt>(c + i)));
}

// The blocks of a decode: out(i, values) for the kWidth values of the codes from element i of
// the tensor; a block's short tail goes through a zero-padded bounce buffer, to
// tail_out(i, n, values) (values past the n elements of the tail are to be dropped).
// Blocks go in groups of kWidth: first a light pass over the group's scales finds the blocks
// that take the plain path (one multiplication by s * 256, exact, no saturation: see
// DecodeLanes), then those are decoded with only a broadcast of their multiplier; the others
// build their DecodeLanes as before.
template <class V, DataType S, class Fmt, ScaleKind K, class Out, class Tail>
CHORUS_CODEC_INLINE void decode_blocks(const void* src, size_t count, uint32_t block, Out&& out,
                                       Tail&& tail_out) {
  constexpr size_t kW = V::kWidth;
  const size_t nb = num_blocks(count, block);
  const auto* scales = static_cast<const Byte*>(src);
  const Byte* codes = scales + nb * scale_bytes(K);
  alignas(64) float first[kW];
  for (size_t g = 0; g < nb; g += kW) {
    const size_t blocks = nb - g < kW ? nb - g : kW;
    uint32_t plain = 0;  // bit j: block g + j takes the plain path
    if constexpr (!Fmt::kHasInf) {
      for (size_t j = 0; j < blocks; ++j) {
        const float s = load_scale<K>(scales, g + j);
        // |fmax * s| <= the output's maximum (false for a NaN s): no saturation, and s * 256
        // is finite (the fold of decode_scale).
        const float top = Fmt::kMaxValue * s;
        first[j] = s * 256.0f;
        plain |= static_cast<uint32_t>(top <= kOutputMax<S> && top >= -kOutputMax<S>) << j;
      }
    }
    for (size_t j = 0; j < blocks; ++j) {
      const size_t b = g + j;
      const size_t begin = b * block;
      const size_t n = count - begin < block ? count - begin : block;
      const Byte* c = codes + begin;
      const size_t full = n - n % kW;
      auto at = [&](size_t i, typename V::F v) CHORUS_CODEC_INLINE_LAMBDA { out(begin + i, v); };
      if (plain >> j & 1) {
        DecodeLanes<V, Fmt> lanes;
        lanes.first = V::splat(first[j]);
        decode_run<V, Fmt, true>(lanes, c, full, at);
        if (full == n) continue;
        CodecBounce<kW> tail;
        std::memcpy(tail.bytes, c + full, n - full);
        tail_out(begin + full, n - full,
                 lanes.template scale<true>(V::template load_codes<Fmt>(tail.bytes)));
        continue;
      }
      const auto lanes = DecodeLanes<V, Fmt>::template make<S, K>(scales, b);
      decode_run<V, Fmt, false>(lanes, c, full, at);
      if (full == n) continue;
      CodecBounce<kW> tail;
      std::memcpy(tail.bytes, c + full, n - full);
      tail_out(begin + full, n - full,
               lanes.template scale<false>(V::template load_codes<Fmt>(tail.bytes)));
    }
  }
}

template <class V, DataType S, class Fmt, ScaleKind K>
void decode_kernel(void* dst, const void* src, size_t count, uint32_t block) {
  constexpr size_t kW = V::kWidth, kEs = source_bytes(S);
  auto* out = static_cast<Byte*>(dst);
  using Result = CodecBounce<kW * kEs>;  // named out here: GCC 12 fails on it inside the lambda
  decode_blocks<V, S, Fmt, K>(
      src, count, block,
      [&](size_t i, typename V::F v) CHORUS_CODEC_INLINE_LAMBDA {
        V::template store_out<S>(out + i * kEs, v);
      },
      [&](size_t i, size_t n, typename V::F v) {
        Result result;
        V::template store_out<S>(result.bytes, v);
        std::memcpy(out + i * kEs, result.bytes, n * kEs);
      });
}

template <class V, class Fmt, ScaleKind K>
void accumulate_kernel(float* acc, const void* src, size_t count, uint32_t block) {
  constexpr size_t kW = V::kWidth;
  auto* a = reinterpret_cast<Byte*>(acc);
  using Sum = CodecBounce<kW * 4>;
  decode_blocks<V, DataType::kFloat32, Fmt, K>(
      src, count, block,
      [&](size_t i, typename V::F v) CHORUS_CODEC_INLINE_LAMBDA {
        V::store_f32(a + i * 4, V::add(V::load_f32(a + i * 4), v));
      },
      [&](size_t i, size_t n, typename V::F v) {
        Sum sum;
        std::memcpy(sum.bytes, a + i * 4, n * 4);
        V::store_f32(sum.bytes, V::add(V::load_f32(sum.bytes), v));
        std::memcpy(a + i * 4, sum.bytes, n * 4);
      });
}

}  // namespace chorus::kernels::codec
