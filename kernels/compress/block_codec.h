// SPDX-License-Identifier: Apache-2.0
// File: kernels/compress/block_codec.h
// Block-scaled FP8 codecs for gradient compression: fp32, bf16 or fp16 elements are encoded as
// OCP FP8 (e4m3 or e5m2) codes with one scale per block of B elements (DeepEP's per-128 scaling),
// and decoded back (to the source type, or added into an fp32 accumulator). One kernel table per
// ISA (scalar reference, AVX2 + F16C, AVX-512), bit-identical to the reference, chosen with the
// reduction kernels' table (CHORUS_KERNELS). See README.md for the derivations.
//
// Compressed buffer of `count` elements, nb = ceil(count / B) blocks (no padding anywhere):
//   [ scales: nb x 4 bytes (fp32, little-endian) or nb x 1 byte (UE8M0) ][ codes: count bytes ]
// compressed_bytes() is that size: with B = 128, 25.78 % of the fp32 input (fp32 scales) or
// 25.20 % (UE8M0). Block b covers elements [b*B, min((b+1)*B, count)); the last may be short.
//
// Scale of a block, from amax = max |x| over it (x widened exactly to fp32), fmax = 448 (e4m3)
// or 57344 (e5m2):
//   fp32   s = max(amax / fmax, FLT_MIN), each operation rounded to nearest even; elements are
//          encoded as code(x * (1 / s)) (saturating: the block's amax lands on or next to fmax).
//   ue8m0  s = 2^e, e the smallest integer with amax <= fmax * 2^e, clamped to [-127, 127]
//          (stored as the byte e + 127); x * 2^-e is exact and never exceeds fmax.
// An all-zero block therefore has s = FLT_MIN or 2^-127 and decodes to zeros. A block holding an
// Inf or NaN is never clipped: its scale is NaN (0x7fc00000, or the byte 0xff) and all its codes
// are the NaN code 0x7f, so every element decodes to NaN and a loss scaler sees the overflow.
// Decoding is fp8_value(code) * s, rounded once and saturated at the output type's largest
// finite value (a finite block within a code step of it may round up past it: it must not decode
// to Inf), then rounded to bf16/fp16 for those outputs; decode_accumulate adds the fp32 product
// into the accumulator (a second rounding). Only a NaN scale or code decodes to non-finite.
//
// Rounding of x * (1 / s) to FP8: nearest even (kernels/fp8/convert.h), or stochastic: rounded
// up with probability equal to its distance from the code below, in units of the code step, from
// a counter-based random word of (seed, counter + i) for element i of the call, so a result is
// reproducible, identical on every ISA and independent of how a tensor is split into calls
// (encode elements [k, n) with counter + k to get the same codes). See random_word() below.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace chorus::kernels {

enum class ScaleKind : uint8_t { kFloat32 = 0, kUe8m0 = 1 };
enum class Rounding : uint8_t { kNearestEven = 0, kStochastic = 1 };

struct BlockCodec {
  DataType source = DataType::kFloat32;   // kFloat32, kBfloat16 or kFloat16
  DataType format = DataType::kFloat8e4m3;  // kFloat8e4m3 or kFloat8e5m2
  ScaleKind scale = ScaleKind::kFloat32;
  Rounding rounding = Rounding::kNearestEven;
  uint32_t block = 128;  // elements per scale, >= 1
};

// The stochastic rounding stream: element i of an encode call draws random_word(seed,
// counter + i). Ignored by nearest-even rounding.
struct RandomStream {
  uint64_t seed = 0;
  uint64_t counter = 0;
};

// True when every field of `codec` is one of the values listed above.
bool block_codec_valid(const BlockCodec& codec);
// ceil(count / codec.block).
size_t codec_num_blocks(const BlockCodec& codec, size_t count);
// Bytes of one scale: 4 (fp32) or 1 (UE8M0).
size_t codec_scale_bytes(const BlockCodec& codec);
// Size of the compressed form of `count` elements (layout above).
size_t compressed_bytes(const BlockCodec& codec, size_t count);

// Kernels. None allocates or keeps state (thread-safe); no alignment is required of any pointer;
// count == 0 writes nothing; source and destination must not overlap.
//   encode:     dst (compressed_bytes(count) bytes) <- src (count source elements)
//   decode:     dst (count source-type elements)    <- src (a compressed buffer of count)
//   accumulate: acc[i] += decoded element i (fp32), acc of count floats
using CodecEncodeFn = void (*)(void* dst, const void* src, size_t count, uint32_t block,
                               RandomStream rng);
using CodecDecodeFn = void (*)(void* dst, const void* src, size_t count, uint32_t block);
using CodecAccumulateFn = void (*)(float* acc, const void* src, size_t count, uint32_t block);

inline constexpr int kNumCodecSources = 3;  // fp32, bf16, fp16 (codec_source_index)
inline constexpr int kNumFp8Formats = 2;    // e4m3, e5m2
inline constexpr int kNumScaleKinds = 2;
inline constexpr int kNumRoundings = 2;

struct CodecTable {
  const char* isa;  // "scalar", "avx2" or "avx512"
  CodecEncodeFn encode[kNumCodecSources][kNumFp8Formats][kNumScaleKinds][kNumRoundings];
  CodecDecodeFn decode[kNumCodecSources][kNumFp8Formats][kNumScaleKinds];
  CodecAccumulateFn accumulate[kNumFp8Formats][kNumScaleKinds];
};

// The reference table (plain per-element code), the oracle of the tests.
const CodecTable& scalar_codecs();
// The per-ISA tables; calling their kernels needs the ISA: prefer codecs_for().
const CodecTable& avx2_codecs();
const CodecTable& avx512_codecs();
// The table for `isa` ("scalar", "avx2", "avx512"; case-insensitive), or nullptr when the name
// is unknown or the CPU cannot run it (the reduction kernels' kernels_for() decides).
const CodecTable* codecs_for(const char* isa);
// The table of the ISA the library's reduction kernels use (kernels(): CHORUS_KERNELS).
const CodecTable& codecs();

// Indices into CodecTable for a valid codec.
int codec_source_index(DataType source);
int codec_format_index(DataType format);

// The kernels of `table` for `codec` (which must be valid).
CodecEncodeFn codec_encode_fn(const CodecTable& table, const BlockCodec& codec);
CodecDecodeFn codec_decode_fn(const CodecTable& table, const BlockCodec& codec);
CodecAccumulateFn codec_accumulate_fn(const CodecTable& table, const BlockCodec& codec);

// Convenience calls through codecs(). `codec` must be valid.
void encode(const BlockCodec& codec, void* dst, const void* src, size_t count,
            RandomStream rng = {});
void decode(const BlockCodec& codec, void* dst, const void* src, size_t count);
void decode_accumulate(const BlockCodec& codec, float* acc, const void* src, size_t count);

}  // namespace chorus::kernels
