// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/codec_scalar.cc
// The reference block codecs: one element at a time, straight from the rules of
// codec_common.h and the scalar conversions of kernels/fp8/convert.h. The SIMD tables are
// tested against this one bit for bit.
#include <cstring>

#include "kernels/compress/block_codec.h"
#include "kernels/compress/codec_common.h"
#include "kernels/fp8/convert.h"

namespace chorus::kernels {
namespace {

using codec::Byte;

template <DataType S>
float load_source(const Byte* p) {
  if constexpr (S == DataType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return S == DataType::kBfloat16 ? bf16_to_float(h) : half_to_float(h);
  }
}

template <DataType S>
void store_source(Byte* p, float f) {
  if constexpr (S == DataType::kFloat32) {
    std::memcpy(p, &f, 4);
  } else {
    const uint16_t h = S == DataType::kBfloat16 ? float_to_bf16(f) : float_to_half(f);
    std::memcpy(p, &h, 2);
  }
}

template <DataType S, class Fmt, ScaleKind K, Rounding R>
void encode_ref(void* dst, const void* src, size_t count, uint32_t block, RandomStream rng) {
  constexpr size_t kEs = codec::source_bytes(S);
  const size_t nb = codec::num_blocks(count, block);
  auto* scales = static_cast<Byte*>(dst);
  Byte* codes = scales + nb * codec::scale_bytes(K);
  const auto* in = static_cast<const Byte*>(src);
  for (size_t b = 0; b < nb; ++b) {
    const size_t begin = b * block;
    const size_t n = count - begin < block ? count - begin : block;
    uint32_t amax = 0;
    for (size_t i = begin; i < begin + n; ++i) {
      const uint32_t abs = float_bits(load_source<S>(in + i * kEs)) & 0x7fffffffu;
      if (abs > amax) amax = abs;
    }
    const codec::BlockScale scale = codec::block_scale<Fmt, K>(amax);
    codec::store_scale<K>(scales, b, scale.bits);
    for (size_t i = begin; i < begin + n; ++i) {
      if (!scale.finite) {
        codes[i] = static_cast<Byte>(Fmt::kNanCode);
        continue;
      }
      const float q = load_source<S>(in + i * kEs) * scale.inv;
      if constexpr (R == Rounding::kNearestEven) {
        codes[i] = Fmt::Scalar::encode(q);
      } else {
        codes[i] = codec::encode_stochastic<Fmt>(q, codec::random_word(rng.seed, rng.counter + i));
      }
    }
  }
}

template <DataType S, class Fmt, ScaleKind K>
void decode_ref(void* dst, const void* src, size_t count, uint32_t block) {
  const size_t nb = codec::num_blocks(count, block);
  const auto* scales = static_cast<const Byte*>(src);
  const Byte* codes = scales + nb * codec::scale_bytes(K);
  auto* out = static_cast<Byte*>(dst);
  for (size_t i = 0; i < count; ++i) {
    const float s = codec::load_scale<K>(scales, i / block);
    store_source<S>(out + i * codec::source_bytes(S),
                    codec::saturate<S>(Fmt::Scalar::decode(codes[i]) * s));
  }
}

template <class Fmt, ScaleKind K>
void accumulate_ref(float* acc, const void* src, size_t count, uint32_t block) {
  const size_t nb = codec::num_blocks(count, block);
  const auto* scales = static_cast<const Byte*>(src);
  const Byte* codes = scales + nb * codec::scale_bytes(K);
  for (size_t i = 0; i < count; ++i) {
    const float s = codec::load_scale<K>(scales, i / block);
    acc[i] = acc[i] + codec::saturate<DataType::kFloat32>(Fmt::Scalar::decode(codes[i]) * s);
  }
}

template <DataType S, class Fmt, ScaleKind K>
void fill_scale_kind(CodecTable& t, int si, int fi) {
  const int ki = static_cast<int>(K);
  t.encode[si][fi][ki][0] = encode_ref<S, Fmt, K, Rounding::kNearestEven>;
  t.encode[si][fi][ki][1] = encode_ref<S, Fmt, K, Rounding::kStochastic>;
  t.decode[si][fi][ki] = decode_ref<S, Fmt, K>;
  t.accumulate[fi][ki] = accumulate_ref<Fmt, K>;
}

template <DataType S>
void fill_source(CodecTable& t) {
  const int si = codec_source_index(S);
  fill_scale_kind<S, codec::E4m3, ScaleKind::kFloat32>(t, si, 0);
  fill_scale_kind<S, codec::E4m3, ScaleKind::kUe8m0>(t, si, 0);
  fill_scale_kind<S, codec::E5m2, ScaleKind::kFloat32>(t, si, 1);
  fill_scale_kind<S, codec::E5m2, ScaleKind::kUe8m0>(t, si, 1);
}

CodecTable make_scalar_table() {
  CodecTable table{};
  table.isa = "scalar";
  fill_source<DataType::kFloat32>(table);
  fill_source<DataType::kBfloat16>(table);
  fill_source<DataType::kFloat16>(table);
  return table;
}

}  // namespace

const CodecTable& scalar_codecs() {
  static const CodecTable table = make_scalar_table();
  return table;
}

}  // namespace chorus::kernels
