// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_compress.cc
// Compressor handles and byte counters (include/chorus/compress.h). The compressed collectives'
// entry points are beside their NCCL siblings in api_coll.cc.
#include <chorus/compress.h>

#include <mutex>
#include <unordered_map>

#include "api/api_util.h"

// The handle: a compressor shared with the calls queued through it.
struct chorusCompressor {
  std::shared_ptr<chorus::compress::Compressor> compressor;
};

namespace chorus::api {
namespace {

// Live handles, so a stale or foreign pointer is an error, not a crash.
struct HandleRegistry {
  std::mutex mutex;
  std::unordered_map<chorusCompressor_t, std::unique_ptr<chorusCompressor>> live;
};
HandleRegistry& handles() {
  static auto* registry = new HandleRegistry;  // outlives static destructors
  return *registry;
}

// The enum fields are read with enum_bits: a caller's out-of-range value (say 7) must be
// reported, and loading it as the enum type would be undefined behaviour.
Result<compress::Settings> settings_from(const chorusCompressConfig_t* config) {
  compress::Settings s;
  if (config == nullptr) return s;
  if (config->size != sizeof(chorusCompressConfig_t))
    return invalid_argument(
        "config->size is {}, expected sizeof(chorusCompressConfig_t) = {}: initialize the config "
        "with CHORUS_COMPRESS_CONFIG_INIT",
        config->size, sizeof(chorusCompressConfig_t));
  switch (enum_bits(config->format)) {
    case chorusFp8E4M3: s.format = DataType::kFloat8e4m3; break;
    case chorusFp8E5M2: s.format = DataType::kFloat8e5m2; break;
    default:
      return invalid_argument("config->format {} is not chorusFp8E4M3 or chorusFp8E5M2",
                              enum_bits(config->format));
  }
  if (config->blockSize < 1 || config->blockSize > compress::kMaxBlock)
    return invalid_argument("config->blockSize {} is outside 1..{}", config->blockSize,
                            compress::kMaxBlock);
  s.block = config->blockSize;
  switch (enum_bits(config->scaleKind)) {
    case chorusScaleFloat32: s.scale = kernels::ScaleKind::kFloat32; break;
    case chorusScaleUe8m0: s.scale = kernels::ScaleKind::kUe8m0; break;
    default:
      return invalid_argument("config->scaleKind {} is not chorusScaleFloat32 or chorusScaleUe8m0",
                              enum_bits(config->scaleKind));
  }
  switch (enum_bits(config->rounding)) {
    case chorusRoundNearestEven: s.rounding = kernels::Rounding::kNearestEven; break;
    case chorusRoundStochastic: s.rounding = kernels::Rounding::kStochastic; break;
    default:
      return invalid_argument(
          "config->rounding {} is not chorusRoundNearestEven or chorusRoundStochastic",
          enum_bits(config->rounding));
  }
  if (config->errorFeedback != 0 && config->errorFeedback != 1)
    return invalid_argument("config->errorFeedback is {}, expected 0 or 1", config->errorFeedback);
  s.error_feedback = config->errorFeedback == 1;
  s.seed = config->seed;
  switch (enum_bits(config->policy)) {
    case chorusCompressAlways: s.policy = compress::Policy::kAlways; break;
    case chorusCompressAuto: s.policy = compress::Policy::kAuto; break;
    default:
      return invalid_argument("config->policy {} is not chorusCompressAlways or chorusCompressAuto",
                              enum_bits(config->policy));
  }
  return s;
}

}  // namespace

Result<std::shared_ptr<compress::Compressor>> find_compressor(chorusCompressor_t handle) {
  if (handle == nullptr) return invalid_argument("compressor is NULL");
  HandleRegistry& reg = handles();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.live.find(handle);
  if (it == reg.live.end())
    return invalid_argument("compressor {} is not a live chorusCompressor_t (destroyed?)",
                            static_cast<const void*>(handle));
  return it->second->compressor;
}

}  // namespace chorus::api

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_API ncclResult_t chorusCompressorCreate(const chorusCompressConfig_t* config,
                                               chorusCompressor_t* compressor) {
  return guard("chorusCompressorCreate", [&]() -> Status {
    if (compressor == nullptr) return invalid_argument("compressor is NULL");
    CHORUS_ASSIGN_OR_RETURN(compress::Settings s, settings_from(config));
    auto handle = std::make_unique<chorusCompressor>();
    handle->compressor = std::make_shared<compress::Compressor>(s);
    HandleRegistry& reg = handles();
    std::lock_guard<std::mutex> lock(reg.mutex);
    *compressor = handle.get();
    reg.live.emplace(handle.get(), std::move(handle));
    return Status();
  });
}

CHORUS_API ncclResult_t chorusCompressorDestroy(chorusCompressor_t compressor) {
  return guard("chorusCompressorDestroy", [&]() -> Status {
    if (compressor == nullptr) return invalid_argument("compressor is NULL");
    HandleRegistry& reg = handles();
    std::lock_guard<std::mutex> lock(reg.mutex);
    if (reg.live.erase(compressor) == 0)
      return invalid_argument("compressor {} is not a live chorusCompressor_t (destroyed twice?)",
                              static_cast<const void*>(compressor));
    return Status();
  });
}

CHORUS_API ncclResult_t chorusCompressorReset(chorusCompressor_t compressor) {
  return guard("chorusCompressorReset", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto c, find_compressor(compressor));
    return c->reset();
  });
}

CHORUS_API ncclResult_t chorusCommGetByteCounters(ncclComm_t comm, int peer,
                                                  chorusByteCounters_t* counters) {
  return guard("chorusCommGetByteCounters", [&]() -> Status {
    if (counters == nullptr) return invalid_argument("counters is NULL");
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    if (peer < -1 || peer >= c->nranks())
      return invalid_argument("peer {} is not -1 or a rank of {} ({} ranks)", peer, c->describe(),
                              c->nranks());
    ByteCounts b = c->byte_counts(peer);
    counters->wireBytesSent = b.wire_sent;
    counters->wireBytesReceived = b.wire_received;
    counters->dataBytesSent = b.data_sent;
    counters->dataBytesReceived = b.data_received;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusCommResetByteCounters(ncclComm_t comm) {
  return guard("chorusCommResetByteCounters", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    c->reset_byte_counts();
    return Status();
  });
}
