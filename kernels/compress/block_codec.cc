// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/block_codec.cc
// Sizes of the compressed layout, and the choice of codec table: the ISA of the reduction
// kernels' table (kernels/reduce/dispatch.cc), so CHORUS_KERNELS selects both.
#include "kernels/compress/block_codec.h"

#include <cstring>

#include "kernels/compress/codec_common.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {

bool block_codec_valid(const BlockCodec& codec) {
  const bool source_ok = codec.source == DataType::kFloat32 ||
                         codec.source == DataType::kBfloat16 ||
                         codec.source == DataType::kFloat16;
  const bool format_ok =
      codec.format == DataType::kFloat8e4m3 || codec.format == DataType::kFloat8e5m2;
  const bool scale_ok = codec.scale == ScaleKind::kFloat32 || codec.scale == ScaleKind::kUe8m0;
  const bool rounding_ok =
      codec.rounding == Rounding::kNearestEven || codec.rounding == Rounding::kStochastic;
  return source_ok && format_ok && scale_ok && rounding_ok && codec.block >= 1;
}

size_t codec_num_blocks(const BlockCodec& codec, size_t count) {
  return codec::num_blocks(count, codec.block);
}

size_t codec_scale_bytes(const BlockCodec& codec) { return codec::scale_bytes(codec.scale); }

size_t compressed_bytes(const BlockCodec& codec, size_t count) {
  return codec_num_blocks(codec, count) * codec_scale_bytes(codec) + count;
}

int codec_source_index(DataType source) {
  return source == DataType::kFloat32 ? 0 : source == DataType::kBfloat16 ? 1 : 2;
}

int codec_format_index(DataType format) { return format == DataType::kFloat8e4m3 ? 0 : 1; }

CodecEncodeFn codec_encode_fn(const CodecTable& table, const BlockCodec& codec) {
  return table.encode[codec_source_index(codec.source)][codec_format_index(codec.format)]
                     [static_cast<int>(codec.scale)][static_cast<int>(codec.rounding)];
}

CodecDecodeFn codec_decode_fn(const CodecTable& table, const BlockCodec& codec) {
  return table.decode[codec_source_index(codec.source)][codec_format_index(codec.format)]
                     [static_cast<int>(codec.scale)];
}

CodecAccumulateFn codec_accumulate_fn(const CodecTable& table, const BlockCodec& codec) {
  return table.accumulate[codec_format_index(codec.format)][static_cast<int>(codec.scale)];
}

const CodecTable* codecs_for(const char* isa) {
  const KernelTable* kernels = kernels_for(isa);
  if (kernels == nullptr) return nullptr;
#if defined(__x86_64__)
  if (std::strcmp(kernels->isa, "avx2") == 0) return &avx2_codecs();
  if (std::strcmp(kernels->isa, "avx512") == 0) return &avx512_codecs();
#endif
  return &scalar_codecs();
}

const CodecTable& codecs() {
  static const CodecTable& table = *codecs_for(kernels().isa);
  return table;
}

void encode(const BlockCodec& codec, void* dst, const void* src, size_t count, RandomStream rng) {
  codec_encode_fn(codecs(), codec)(dst, src, count, codec.block, rng);
}

void decode(const BlockCodec& codec, void* dst, const void* src, size_t count) {
  codec_decode_fn(codecs(), codec)(dst, src, count, codec.block);
}

void decode_accumulate(const BlockCodec& codec, float* acc, const void* src, size_t count) {
  codec_accumulate_fn(codecs(), codec)(acc, src, count, codec.block);
}

}  // namespace chorus::kernels
