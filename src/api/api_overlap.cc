// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_overlap.cc
// The overlap scheduler's entry points (include/chorus/overlap.h): argument checks and handles;
// the scheduler itself is src/overlap/scheduler.{h,cc}.
#include <chorus/overlap.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "api/api_util.h"
#include "overlap/scheduler.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

namespace {

// Live schedulers: a handle is valid while it is in here.
std::mutex g_mutex;
std::unordered_map<chorusOverlap_t, std::shared_ptr<overlap::Scheduler>>& schedulers() {
  static auto* map = new std::unordered_map<chorusOverlap_t, std::shared_ptr<overlap::Scheduler>>();
  return *map;
}

Result<std::shared_ptr<overlap::Scheduler>> find_scheduler(chorusOverlap_t handle) {
  if (handle == nullptr) return invalid_argument("scheduler is NULL");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = schedulers().find(handle);
  if (it == schedulers().end())
    return invalid_argument("scheduler {} is not a live chorusOverlap_t (destroyed?)",
                            static_cast<void*>(handle));
  return it->second;
}

Status check_config(const chorusOverlapConfig_t& c) {
  const int policy = enum_bits(c.policy);
  if (policy != chorusOverlapPriority && policy != chorusOverlapFifo)
    return invalid_argument("policy {} is neither chorusOverlapPriority nor chorusOverlapFifo", policy);
  if (c.bucketBytes == 0) return invalid_argument("bucketBytes is 0 (it caps a bucket: give it a size)");
  if (!(c.cycleUs > 0) || !std::isfinite(c.cycleUs) || c.cycleUs > 1e7)
    return invalid_argument("cycleUs must be in (0, 1e7] microseconds, not {}", c.cycleUs);
  const int op = enum_bits(c.op);
  if (op != ncclSum && op != ncclAvg)
    return invalid_argument("op {} is not supported by the overlap scheduler (ncclSum or ncclAvg)", op);
  return Status();
}

}  // namespace

CHORUS_API ncclResult_t chorusOverlapConfigInit(chorusOverlapConfig_t* config) {
  return guard("chorusOverlapConfigInit", [&]() -> Status {
    if (config == nullptr) return invalid_argument("config is NULL");
    *config = chorusOverlapConfig_t{};
    config->policy = chorusOverlapPriority;
    config->bucketBytes = 4 << 20;
    config->firstBucketBytes = 1 << 20;
    config->partitionBytes = 4 << 20;
    config->creditBytes = 8 << 20;
    config->cycleUs = 1000;
    config->op = ncclAvg;
    config->compress = nullptr;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusOverlapCreate(ncclComm_t comm, const chorusOverlapConfig_t* config,
                                            chorusOverlap_t* scheduler) {
  return guard("chorusOverlapCreate", [&]() -> Status {
    if (scheduler == nullptr) return invalid_argument("scheduler is NULL");
    *scheduler = nullptr;
    CHORUS_RETURN_IF_ERROR(usable_comm(comm).status());
    chorusOverlapConfig_t c;
    chorusOverlapConfigInit(&c);
    if (config != nullptr) c = *config;
    CHORUS_RETURN_IF_ERROR(check_config(c));
    CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<overlap::Scheduler> s, overlap::Scheduler::create(comm, c));
    auto handle = reinterpret_cast<chorusOverlap_t>(s.get());
    std::lock_guard<std::mutex> lock(g_mutex);
    schedulers()[handle] = std::shared_ptr<overlap::Scheduler>(std::move(s));
    *scheduler = handle;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusOverlapRegister(chorusOverlap_t scheduler, void* buff, size_t count,
                                              ncclDataType_t datatype, int layer) {
  return guard("chorusOverlapRegister", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto s, find_scheduler(scheduler));
    CHORUS_RETURN_IF_ERROR(check_datatype(enum_bits(datatype)));
    if (buff == nullptr) return invalid_argument("buff is NULL");
    if (count == 0) return invalid_argument("count is 0: a tensor of no elements has nothing to reduce");
    CHORUS_RETURN_IF_ERROR(check_size(count, enum_bits(datatype), 1));
    if (layer < 0) return invalid_argument("layer {} is negative (0 is the forward pass's first)", layer);
    return s->add(buff, count, enum_bits(datatype), layer);
  });
}

CHORUS_API ncclResult_t chorusOverlapReady(chorusOverlap_t scheduler, void* buff, size_t count,
                                           ncclDataType_t datatype) {
  return guard("chorusOverlapReady", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto s, find_scheduler(scheduler));
    return s->ready(buff, count, enum_bits(datatype));
  });
}

CHORUS_API ncclResult_t chorusOverlapWait(chorusOverlap_t scheduler, void* buff) {
  return guard("chorusOverlapWait", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto s, find_scheduler(scheduler));
    return s->wait(buff);
  });
}

CHORUS_API ncclResult_t chorusOverlapWaitAll(chorusOverlap_t scheduler) {
  return guard("chorusOverlapWaitAll", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(auto s, find_scheduler(scheduler));
    return s->wait_all();
  });
}

CHORUS_API ncclResult_t chorusOverlapGetStats(chorusOverlap_t scheduler, chorusOverlapStats_t* stats) {
  return guard("chorusOverlapGetStats", [&]() -> Status {
    if (stats == nullptr) return invalid_argument("stats is NULL");
    CHORUS_ASSIGN_OR_RETURN(auto s, find_scheduler(scheduler));
    *stats = s->stats();
    return Status();
  });
}

CHORUS_API ncclResult_t chorusOverlapDumpTrace(chorusOverlap_t scheduler, const char* path) {
  return guard("chorusOverlapDumpTrace", [&]() -> Status {
    if (path == nullptr) return invalid_argument("path is NULL");
    CHORUS_ASSIGN_OR_RETURN(auto s, find_scheduler(scheduler));
    return s->dump_trace(path);
  });
}

CHORUS_API ncclResult_t chorusOverlapDestroy(chorusOverlap_t scheduler) {
  return guard("chorusOverlapDestroy", [&]() -> Status {
    std::shared_ptr<overlap::Scheduler> s;
    {
      CHORUS_ASSIGN_OR_RETURN(s, find_scheduler(scheduler));
      std::lock_guard<std::mutex> lock(g_mutex);
      schedulers().erase(scheduler);
    }
    s.reset();  // the last reference: stops it (calls in other threads hold their own)
    return Status();
  });
}
