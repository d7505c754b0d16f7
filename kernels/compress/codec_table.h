// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/codec_table.h
// Fills a CodecTable with an ISA's kernels (codec_driver.h). Include it after the ISA's target
// region closes: building a table must itself run on any x86-64 CPU.
#pragma once

#include <type_traits>

#include "kernels/compress/block_codec.h"
#include "kernels/compress/codec_driver.h"

namespace chorus::kernels::codec {

// Fills a table's rows for one source type with V's kernels. Call it outside the target region.
template <class V, DataType S, class Fmt, ScaleKind K>
void fill_codec_kind(CodecTable& t) {
  const int si = codec_source_index(S);
  const int fi = std::is_same_v<Fmt, E4m3> ? 0 : 1;
  const int ki = static_cast<int>(K);
  t.encode[si][fi][ki][0] = encode_kernel<V, S, Fmt, K, Rounding::kNearestEven>;
  t.encode[si][fi][ki][1] = encode_kernel<V, S, Fmt, K, Rounding::kStochastic>;
  t.decode[si][fi][ki] = decode_kernel<V, S, Fmt, K>;
  t.accumulate[fi][ki] = accumulate_kernel<V, Fmt, K>;
}

template <class V, DataType S>
void fill_codec_source(CodecTable& t) {
  fill_codec_kind<V, S, E4m3, ScaleKind::kFloat32>(t);
  fill_codec_kind<V, S, E4m3, ScaleKind::kUe8m0>(t);
  fill_codec_kind<V, S, E5m2, ScaleKind::kFloat32>(t);
  fill_codec_kind<V, S, E5m2, ScaleKind::kUe8m0>(t);
}

template <class V>
void fill_codec_table(CodecTable& t) {
  fill_codec_source<V, DataType::kFloat32>(t);
  fill_codec_source<V, DataType::kBfloat16>(t);
  fill_codec_source<V, DataType::kFloat16>(t);
}

}  // namespace chorus::kernels::codec
