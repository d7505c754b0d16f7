// SPDX-License-Identifier: Apache-2.0
// File: src/compress/compressor.cc
#include "compress/compressor.h"

#include <algorithm>

#include "common/params.h"

namespace chorus::compress {

bool compressible_dtype(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kBfloat16 || t == DataType::kFloat16;
}

bool compressible_op(RedOpKind op) {
  return op == RedOpKind::kSum || op == RedOpKind::kAvg || op == RedOpKind::kMax ||
         op == RedOpKind::kMin;
}

Status check_call(CollKind kind, DataType dtype, RedOpKind op) {
  if (!compressible_dtype(dtype))
    return invalid_argument(
        "{} cannot be compressed: FP8 compression takes float32, bfloat16 or float16 data, "
        "not {}",
        coll_name(kind), datatype_name(dtype));
  if (kind != CollKind::kAllGather && !compressible_op(op))
    return invalid_argument(
        "{} cannot be compressed with {}: compressed reductions are sum, avg, max and min "
        "(a product of quantized values compounds their errors)",
        coll_name(kind), redop_name(op));
  return Status();
}

Status Compressor::bind(const Binding& b) {
  if (!settings_.error_feedback) return Status();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!bound_) {
    bound_ = true;
    binding_ = b;
    residual_.clear();  // allocated by the first run
    return Status();
  }
  if (b == binding_) return Status();
  auto what = [](const Binding& x) {
    return fmt::format("{} of {} {} elements on comm {:#x} rank {}/{}", coll_name(x.kind),
                       x.elements, datatype_name(x.dtype), x.comm_uid & 0xffffffffu, x.rank,
                       x.nranks);
  };
  return invalid_usage(
      "this compressor's error-feedback residual belongs to {}, but the call is {}: use one "
      "compressor per tensor, or chorusCompressorReset it first",
      what(binding_), what(b));
}

Status Compressor::reset() {
  if (queued_.load() > 0)
    return invalid_usage("chorusCompressorReset: {} call(s) using this compressor are still queued",
                         queued_.load());
  std::lock_guard<std::mutex> lock(mutex_);
  bound_ = false;
  residual_.clear();
  residual_.shrink_to_fit();
  return Status();
}

Result<float*> Compressor::begin_run() {
  if (!settings_.error_feedback) return static_cast<float*>(nullptr);
  if (running_.exchange(true))
    return invalid_usage(
        "an error-feedback compressor is used by two operations at once; queue calls that "
        "share a compressor on one stream");
  std::lock_guard<std::mutex> lock(mutex_);
  if (residual_.size() != binding_.elements) residual_.assign(binding_.elements, 0.0f);
  return residual_.data();
}

void Compressor::end_run() {
  if (settings_.error_feedback) running_.store(false);
}

namespace {

struct TransparentCache {
  std::mutex mutex;
  uint64_t generation = 0;
  std::shared_ptr<Compressor> compressor;
};

}  // namespace

std::shared_ptr<Compressor> transparent() {
  static TransparentCache cache;
  const std::string mode = params::kCompress.get();  // loads the parameters first
  const uint64_t gen = params::generation();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (cache.generation == gen) return cache.compressor;
  cache.generation = gen;
  if (mode == "OFF") {
    cache.compressor.reset();
  } else {
    Settings s;
    s.format = mode == "FP8_E5M2" ? DataType::kFloat8e5m2 : DataType::kFloat8e4m3;
    s.scale = params::kCompressScale.get() == "UE8M0" ? kernels::ScaleKind::kUe8m0
                                                       : kernels::ScaleKind::kFloat32;
    s.block = static_cast<uint32_t>(params::kCompressBlock.get());
    s.policy = params::kCompressPolicy.get() == "ALWAYS" ? Policy::kAlways : Policy::kAuto;
    cache.compressor = std::make_shared<Compressor>(s);
  }
  return cache.compressor;
}

size_t transparent_min_bytes() { return static_cast<size_t>(params::kCompressMinBytes.get()); }

}  // namespace chorus::compress
