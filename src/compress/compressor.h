// SPDX-License-Identifier: Apache-2.0
// File: src/compress/compressor.h
// What a compressed collective needs besides its call: the codec settings, the policy (always,
// or where the tuner predicts it pays) and, with error feedback, the per-tensor residual. One
// Compressor is one chorusCompressor_t (include/chorus/compress.h), or the process-wide one
// CHORUS_COMPRESS makes for plain NCCL calls (transparent()).
//
// The residual is bound to one tensor by the first call that uses it (collective, count,
// datatype, communicator, rank); later calls must match. It is read and written by the thread
// running the operation, one operation at a time (begin_run / end_run enforce it); the API
// thread only binds and resets it, and only while no call using it is queued (CompressorHold
// counts them).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/compress/block_codec.h"

namespace chorus::compress {

enum class Policy : uint8_t { kAlways, kAuto };

struct Settings {
  DataType format = DataType::kFloat8e4m3;
  kernels::ScaleKind scale = kernels::ScaleKind::kFloat32;
  kernels::Rounding rounding = kernels::Rounding::kNearestEven;
  uint32_t block = 128;
  bool error_feedback = false;
  uint64_t seed = 0;
  Policy policy = Policy::kAlways;
};
inline constexpr uint32_t kMaxBlock = 65536;

// The collectives that compress, and the datatypes and reductions they take.
bool compressible_dtype(DataType t);
bool compressible_op(RedOpKind op);
// Why `kind` / `dtype` / `op` cannot be compressed (kInvalidArgument), or OK.
Status check_call(CollKind kind, DataType dtype, RedOpKind op);

class Compressor {
 public:
  explicit Compressor(const Settings& s) : settings_(s) {}
  const Settings& settings() const { return settings_; }
  // The codec for `source` elements.
  kernels::BlockCodec codec(DataType source) const {
    return kernels::BlockCodec{source, settings_.format, settings_.scale, settings_.rounding,
                               settings_.block};
  }

  // What one call binds the residual to.
  struct Binding {
    CollKind kind = CollKind::kAllReduce;
    size_t elements = 0;  // of this rank's quantized data: count, count * n (ReduceScatter)
    DataType dtype = DataType::kFloat32;
    uint64_t comm_uid = 0;
    int rank = 0, nranks = 0;
    bool operator==(const Binding&) const = default;
  };
  // API thread, when a call is submitted: binds an unbound residual to `b`, or checks that
  // `b` is what it is bound to (kInvalidUsage saying what differs). No-op without error
  // feedback.
  Status bind(const Binding& b);
  // chorusCompressorReset: kInvalidUsage while a call using it is queued.
  Status reset();

  // Operation thread: marks the compressor in use for the whole run (kInvalidUsage when another
  // operation is running with it) and returns the residual (null without error feedback), of
  // binding().elements floats, zeroed on first use.
  Result<float*> begin_run();
  void end_run();

 private:
  friend class CompressorHold;
  const Settings settings_;
  std::mutex mutex_;  // binding_ and residual_ allocation
  bool bound_ = false;
  Binding binding_;
  std::vector<float> residual_;
  std::atomic<int> queued_{0};
  std::atomic<bool> running_{false};
};

// A queued call's hold on its compressor: counts queued calls (reset() refuses while any is).
class CompressorHold {
 public:
  explicit CompressorHold(std::shared_ptr<Compressor> c) : c_(std::move(c)) {
    c_->queued_.fetch_add(1);
  }
  ~CompressorHold() { c_->queued_.fetch_sub(1); }
  CompressorHold(const CompressorHold&) = delete;
  CompressorHold& operator=(const CompressorHold&) = delete;
  Compressor& get() const { return *c_; }

 private:
  std::shared_ptr<Compressor> c_;
};

// The compressor of CHORUS_COMPRESS for plain ncclAllReduce / ncclReduceScatter calls (no error
// feedback, so one serves every communicator at once), or null when it is off. Rebuilt when the
// parameters change (params::generation()).
std::shared_ptr<Compressor> transparent();
// CHORUS_COMPRESS_MIN_BYTES: plain calls with smaller buffers never compress.
size_t transparent_min_bytes();

}  // namespace chorus::compress
