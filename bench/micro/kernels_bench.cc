// SPDX-License-Identifier: Apache-2.0
// File: bench/micro/kernels_bench.cc
// Google Benchmark of the reduction kernels per ISA table, datatype and operator, 4 KiB..64 MiB
// per buffer, beside memcpy and the tables' copy on the same buffer sizes. See README.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/micro/pin_cpu.h"
#include "common/dtype.h"
#include "kernels/reduce/reduce.h"

namespace chorus::kernels {
namespace {

constexpr int64_t kMinBytes = 4 << 10;
constexpr int64_t kMaxBytes = 64 << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;

// A 64-byte aligned buffer of `bytes` elements' worth of ordinary values of type t: moderate
// finite floats (no NaN or subnormal slow paths), random integers.
Buffer make_buffer(DataType t, size_t bytes, uint64_t seed) {
  Buffer buf(static_cast<unsigned char*>(std::aligned_alloc(64, bytes)));
  if (!buf) {
    std::fprintf(stderr, "kernels_bench: out of memory for %zu bytes\n", bytes);
    std::abort();
  }
  const size_t es = datatype_size(t), count = bytes / es;
  std::mt19937_64 rng(seed);
  if (!datatype_is_float(t)) {
    for (size_t i = 0; i < bytes; ++i) buf.get()[i] = static_cast<unsigned char>(rng());
    return buf;
  }
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  std::vector<float> values(count);
  for (float& v : values) v = static_cast<float>(dist(rng));
  if (t == DataType::kFloat32) {
    std::memcpy(buf.get(), values.data(), count * es);
  } else if (t == DataType::kFloat64) {
    for (size_t i = 0; i < count; ++i) {
      double d = values[i];
      std::memcpy(buf.get() + i * es, &d, es);
    }
  } else {
    scalar_kernels().from_float[static_cast<int>(t)](buf.get(), values.data(), count);
  }
  return buf;
}

// dst = a op b over `bytes`-sized buffers: 2 reads + 1 write per element.
void bm_reduce(benchmark::State& state, const KernelTable* table, DataType t, ReduceOp op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffer a = make_buffer(t, bytes, 1), b = make_buffer(t, bytes, 2), d = make_buffer(t, bytes, 3);
  const size_t count = bytes / datatype_size(t);
  ReduceFn fn = table->reduce[static_cast<int>(t)][static_cast<int>(op)];
  for (auto _ : state) {
    fn(d.get(), a.get(), b.get(), count);
    benchmark::DoNotOptimize(d.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 *
                          static_cast<int64_t>(bytes));
}

// dst1 = dst2 = a op b: 2 reads + 2 writes per element.
void bm_reduce_copy(benchmark::State& state, const KernelTable* table, DataType t, ReduceOp op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffer a = make_buffer(t, bytes, 1), b = make_buffer(t, bytes, 2);
  Buffer d1 = make_buffer(t, bytes, 3), d2 = make_buffer(t, bytes, 4);
  const size_t count = bytes / datatype_size(t);
  ReduceCopyFn fn = table->reduce_copy[static_cast<int>(t)][static_cast<int>(op)];
  for (auto _ : state) {
    fn(d1.get(), d2.get(), a.get(), b.get(), count);
    benchmark::DoNotOptimize(d1.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 4 *
                          static_cast<int64_t>(bytes));
}

// memcpy (table == nullptr), a table's copy, or with `streaming` its stream_copy (the stores
// bypass the caches): 1 read + 1 write per byte.
void bm_copy(benchmark::State& state, const KernelTable* table, bool streaming) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffer src = make_buffer(DataType::kUint8, bytes, 1),
         dst = make_buffer(DataType::kUint8, bytes, 2);
  for (auto _ : state) {
    if (table == nullptr) {
      std::memcpy(dst.get(), src.get(), bytes);
    } else {
      (streaming ? table->stream_copy : table->copy)(dst.get(), src.get(), bytes);
    }
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 *
                          static_cast<int64_t>(bytes));
}

const char* op_name(ReduceOp op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min"};
  return kNames[static_cast<int>(op)];
}

void sizes(benchmark::internal::Benchmark* b) {
  b->RangeMultiplier(4)->Range(kMinBytes, kMaxBytes);
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy", bm_copy, nullptr, false)->Apply(sizes);
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    const KernelTable* table = kernels_for(isa);
    if (table == nullptr) {
      std::fprintf(stderr, "kernels_bench: skipping %s (not supported by this CPU)\n", isa);
      continue;
    }
    benchmark::RegisterBenchmark((std::string("copy/") + isa).c_str(), bm_copy, table, false)
        ->Apply(sizes);
    benchmark::RegisterBenchmark((std::string("stream_copy/") + isa).c_str(), bm_copy, table, true)
        ->Apply(sizes);
    for (int ti = 0; ti < kNumDataTypes; ++ti) {
      const DataType t = static_cast<DataType>(ti);
      const bool all_ops = t == DataType::kFloat32 || t == DataType::kBfloat16;
      for (int oi = 0; oi < (all_ops ? kNumReduceOps : 1); ++oi) {
        const auto op = static_cast<ReduceOp>(oi);
        const std::string name =
            std::string(isa) + "/" + std::string(datatype_name(t)) + "/" + op_name(op);
        benchmark::RegisterBenchmark(("reduce/" + name).c_str(), bm_reduce, table, t, op)
            ->Apply(sizes);
      }
    }
    benchmark::RegisterBenchmark((std::string("reduce_copy/") + isa + "/float/sum").c_str(),
                                 bm_reduce_copy, table, DataType::kFloat32, ReduceOp::kSum)
        ->Apply(sizes);
  }
}

}  // namespace
}  // namespace chorus::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // removes the --benchmark_* flags it knows
  chorus::bench::pin_cpu(argc, argv, "kernels_bench");
  benchmark::AddCustomContext("kernels_auto", chorus::kernels::select_kernels("AUTO").isa);
  chorus::kernels::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
