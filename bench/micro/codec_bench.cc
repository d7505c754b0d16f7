// SPDX-License-Identifier: Apache-2.0
// File: bench/micro/codec_bench.cc
// Google Benchmark of the block-scaled FP8 codecs (kernels/compress/block_codec.h) per ISA
// table, beside memcpy of the same fp32 buffer. Every benchmark counts the bytes of the fp32
// side once (the input of encode, the output of decode), so bytes_per_second columns compare
// directly: encode at half of memcpy's figure takes twice memcpy's time on the same tensor.
// See README.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "bench/micro/pin_cpu.h"
#include "kernels/compress/block_codec.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;

Buffer allocate(size_t bytes) {
  Buffer buf(static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
  if (!buf) {
    std::fprintf(stderr, "codec_bench: out of memory for %zu bytes\n", bytes);
    std::abort();
  }
  std::memset(buf.get(), 0, bytes);  // fault the pages in before any timing
  return buf;
}

// Gradient-like fp32 values: normal, with a magnitude that drifts from block to block.
Buffer make_floats(size_t count, uint64_t seed) {
  Buffer buf = allocate(count * 4);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto* f = reinterpret_cast<float*>(buf.get());
  float magnitude = 1e-3f;
  for (size_t i = 0; i < count; ++i) {
    if (i % 128 == 0) magnitude = 1e-3f * (1.0f + static_cast<float>(rng() % 100));
    f[i] = dist(rng) * magnitude;
  }
  return buf;
}

void bm_memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffer src = make_floats(bytes / 4, 1), dst = allocate(bytes);
  for (auto _ : state) {
    std::memcpy(dst.get(), src.get(), bytes);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void bm_encode(benchmark::State& state, const CodecTable* table, BlockCodec codec) {
  const size_t bytes = static_cast<size_t>(state.range(0)), count = bytes / 4;
  Buffer src = make_floats(count, 1), dst = allocate(compressed_bytes(codec, count));
  const CodecEncodeFn fn = codec_encode_fn(*table, codec);
  uint64_t call = 0;
  for (auto _ : state) {
    fn(dst.get(), src.get(), count, codec.block, RandomStream{7, call++ * count});
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// accumulate == false: decode into an fp32 buffer; true: decode_accumulate into one.
void bm_decode(benchmark::State& state, const CodecTable* table, BlockCodec codec,
               bool accumulate) {
  const size_t bytes = static_cast<size_t>(state.range(0)), count = bytes / 4;
  Buffer src = make_floats(count, 1), packed = allocate(compressed_bytes(codec, count));
  Buffer dst = make_floats(count, 2);
  codec_encode_fn(scalar_codecs(), codec)(packed.get(), src.get(), count, codec.block, {});
  const CodecDecodeFn decode_fn = codec_decode_fn(*table, codec);
  const CodecAccumulateFn accumulate_fn = codec_accumulate_fn(*table, codec);
  for (auto _ : state) {
    if (accumulate) {
      accumulate_fn(reinterpret_cast<float*>(dst.get()), packed.get(), count, codec.block);
    } else {
      decode_fn(dst.get(), packed.get(), count, codec.block);
    }
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(16)->Range(16 << 10, 64 << 20);
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy", bm_memcpy)->Apply(sizes);
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    const CodecTable* table = codecs_for(isa);
    if (table == nullptr) {
      std::fprintf(stderr, "codec_bench: skipping %s (not supported by this CPU)\n", isa);
      continue;
    }
    for (DataType format : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
      for (ScaleKind scale : {ScaleKind::kFloat32, ScaleKind::kUe8m0}) {
        for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
          // e5m2 and UE8M0 only with nearest even: the same loops, other constants.
          const bool main = format == DataType::kFloat8e4m3 && scale == ScaleKind::kFloat32;
          if (!main && rounding == Rounding::kStochastic) continue;
          const BlockCodec codec{DataType::kFloat32, format, scale, rounding, 128};
          const std::string name = std::string(isa) + "/" +
                                   (format == DataType::kFloat8e4m3 ? "e4m3" : "e5m2") + "/" +
                                   (scale == ScaleKind::kFloat32 ? "fp32scale" : "ue8m0");
          const std::string round = rounding == Rounding::kNearestEven ? "/rne" : "/sr";
          benchmark::RegisterBenchmark(("encode/" + name + round).c_str(), bm_encode, table, codec)
              ->Apply(sizes);
          if (rounding != Rounding::kNearestEven) continue;
          benchmark::RegisterBenchmark(("decode/" + name).c_str(), bm_decode, table, codec, false)
              ->Apply(sizes);
          benchmark::RegisterBenchmark(("decode_accumulate/" + name).c_str(), bm_decode, table,
                                       codec, true)
              ->Apply(sizes);
        }
      }
    }
  }
}

}  // namespace
}  // namespace chorus::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  chorus::bench::pin_cpu(argc, argv, "codec_bench");
  benchmark::AddCustomContext("codecs_auto", chorus::kernels::codecs().isa);
  chorus::kernels::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
