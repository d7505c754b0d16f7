// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_init.cc
// Communicator life cycle entry points: unique ids, initialisation (by rank, all-in-process,
// scalable), split, shrink, finalize, destroy, abort, revoke. They validate and translate; how
// a communicator is made, split or shrunk is core's (core/lifecycle.h).
#include <chorus/chorus.h>
#include <nccl.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "api/api_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "core/engine.h"
#include "core/lifecycle.h"
#include "core/group.h"
#include "core/internal_ops.h"

namespace chorus::api {

namespace {

// NCCL_DEBUG=VERSION (or any level asked for explicitly): once per process, which library
// this is and where it was loaded from, so a program started against libnccl.so.2 shows that
// Chorus answered. Not at the default level, which NCCL keeps silent too.
void log_version_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (params::kDebug.source() == "default") return;
    Dl_info info{};
    const char* path = dladdr(reinterpret_cast<void*>(&log_version_once), &info) != 0 &&
                               info.dli_fname != nullptr
                           ? info.dli_fname
                           : "?";
    CHORUS_VERSION_LOG("Chorus: {}, loaded from {}", chorusBuildInfo(), path);
  });
}

// Registers the handle of a new comm and starts its setup (core/lifecycle.h).
Status register_and_start(const NewComm& c, ncclComm_t* out) {
  ncclComm_t handle = register_comm(c.comm);
  *out = handle;
  return start_setup(c, handle);
}

Status init_rank(ncclComm_t* out, int nranks, const std::vector<bootstrap::UniqueId>& ids,
                 int rank, const ncclConfig_t* config, int cu_device) {
  log_version_once();
  if (out == nullptr) return invalid_argument("comm (the output pointer) is NULL");
  *out = nullptr;
  if (nranks < 1) return invalid_argument("nranks {} must be at least 1", nranks);
  CHORUS_RETURN_IF_ERROR(check_rank("rank", rank, nranks));
  // Once per process: a CHORUS_* name that nothing reads is most likely misspelt.
  params::warn_unknown_env_once();
  CommConfig defaults;
  defaults.cu_device = cu_device;
  CHORUS_ASSIGN_OR_RETURN(CommConfig cfg, parse_config(config, defaults));
  NewComm c = make_comm(ids, rank, nranks, cfg);
  Status s = register_and_start(c, out);
  if (!s.ok() && s.code() != Code::kInProgress && !in_group()) {
    unregister_comm(*out);
    c.comm->shutdown();
    *out = nullptr;
  }
  return s;
}

Result<bootstrap::UniqueId> decode(const ncclUniqueId& id) {
  return bootstrap::decode_unique_id(id.internal);
}

}  // namespace

}  // namespace chorus::api

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  return guard("ncclGetVersion", [&]() -> Status {
    if (version == nullptr) return invalid_argument("version is NULL");
    *version = NCCL_VERSION_CODE;
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guard("ncclGetUniqueId", [&]() -> Status {
    if (uniqueId == nullptr) return invalid_argument("uniqueId is NULL");
    CHORUS_ASSIGN_OR_RETURN(bootstrap::UniqueId id, bootstrap::create_unique_id());
    bootstrap::encode_unique_id(id, uniqueId->internal);
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks,
                ncclUniqueId commId, int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return guard("ncclCommInitRankConfig", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(bootstrap::UniqueId id, decode(commId));
    return init_rank(comm, nranks, {id}, rank, config, -1);
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId,
                int rank);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return guard("ncclCommInitRank", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(bootstrap::UniqueId id, decode(commId));
    return init_rank(comm, nranks, {id}, rank, nullptr, -1);
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks,
                int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  return guard("ncclCommInitRankScalable", [&]() -> Status {
    if (commIds == nullptr) return invalid_argument("commIds is NULL");
    if (nId < 1 || nId > nranks)
      return invalid_argument("nId {} must be in [1, nranks={}]", nId, nranks);
    std::vector<bootstrap::UniqueId> ids;
    for (int i = 0; i < nId; ++i) {
      CHORUS_ASSIGN_OR_RETURN(bootstrap::UniqueId id, decode(commIds[i]));
      ids.push_back(id);
    }
    return init_rank(newcomm, nranks, ids, myrank, config, -1);
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return guard("ncclCommInitAll", [&]() -> Status {
    if (comm == nullptr) return invalid_argument("comm (the output array) is NULL");
    if (ndev < 1) return invalid_argument("ndev {} must be at least 1", ndev);
    if (devlist != nullptr) {
      for (int i = 0; i < ndev; ++i)
        for (int j = 0; j < i; ++j)
          if (devlist[i] == devlist[j])
            return invalid_argument("devlist has device {} twice", devlist[i]);
    }
    CHORUS_ASSIGN_OR_RETURN(bootstrap::UniqueId id, bootstrap::create_unique_id());
    std::vector<Status> results(ndev);
    std::vector<std::thread> threads;
    for (int r = 0; r < ndev; ++r) {
      threads.emplace_back([&, r] {
        results[r] = init_rank(&comm[r], ndev, {id}, r, nullptr, devlist ? devlist[r] : r);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < ndev; ++r) {
      if (results[r].ok()) continue;
      for (int k = 0; k < ndev; ++k) {
        if (comm[k] == nullptr) continue;
        if (auto c = find_comm(comm[k]); c.ok()) (*c)->shutdown();
        unregister_comm(comm[k]);
        comm[k] = nullptr;
      }
      return results[r].with_context(fmt::format("rank {} of {}", r, ndev));
    }
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key,
                ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  return guard("ncclCommSplit", [&]() -> Status {
    if (newcomm == nullptr) return invalid_argument("newcomm is NULL");
    *newcomm = nullptr;
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> parent, usable_comm(comm));
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      return invalid_argument("color {} must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
    CHORUS_ASSIGN_OR_RETURN(CommConfig cfg, parse_config(config, parent->config()));
    cfg.cu_device = parent->cu_device();
    return submit_init([parent, color, key, cfg, newcomm]() -> Status {
      CHORUS_ASSIGN_OR_RETURN(NewComm child, make_split_child(parent, color, key, cfg));
      if (!child.comm) return Status();  // NCCL_SPLIT_NOCOLOR: *newcomm stays NULL
      return register_and_start(child, newcomm);
    }, parent.get());
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList,
                int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return guard("ncclCommShrink", [&]() -> Status {
    if (newcomm == nullptr) return invalid_argument("newcomm is NULL");
    *newcomm = nullptr;
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> parent, find_comm(comm));
    if (parent->state() == Comm::State::kInitializing)
      return invalid_usage("{} is still initializing", parent->describe());
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      return invalid_argument("shrinkFlags {} is not NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT",
                              shrinkFlags);
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr))
      return invalid_argument("excludeRanksList is NULL with excludeRanksCount {}",
                              excludeRanksCount);
    std::vector<bool> excluded(parent->nranks(), false);
    for (int i = 0; i < excludeRanksCount; ++i) {
      CHORUS_RETURN_IF_ERROR(check_rank("excluded rank", excludeRanksList[i], parent->nranks()));
      excluded[excludeRanksList[i]] = true;
    }
    if (excluded[parent->rank()])
      return invalid_argument("rank {} is in excludeRanksList: excluded ranks must not call "
                              "ncclCommShrink", parent->rank());
    std::vector<int> members;
    for (int r = 0; r < parent->nranks(); ++r)
      if (!excluded[r]) members.push_back(r);
    CHORUS_ASSIGN_OR_RETURN(CommConfig cfg, parse_config(config, parent->config()));
    cfg.cu_device = parent->cu_device();
    if (shrinkFlags == NCCL_SHRINK_ABORT) parent->request_abort();
    uint32_t ordinal = parent->next_child_ordinal();
    return submit_init([parent, members, ordinal, cfg, newcomm]() -> Status {
      CHORUS_ASSIGN_OR_RETURN(NewComm child, make_shrink_child(parent, members, ordinal, cfg));
      return register_and_start(child, newcomm);
    });
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guard("ncclCommFinalize", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, usable_comm(comm));
    c->set_state(Comm::State::kFinalized);
    if (!c->config().blocking && c->has_pending_ops()) {
      Engine::get().watch(c);
      return Status(Code::kInProgress, "finalizing");
    }
    drive_until([&] { return !c->has_pending_ops(); }, {c.get()});
    return Status();
  });
}

namespace {
Status destroy(ncclComm_t handle, bool abort) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> comm, find_comm(handle));
  unregister_comm(handle);
  const bool busy = comm->has_pending_ops();
  if (abort) {
    comm->request_abort();
    comm->set_state(Comm::State::kAborted);
  }
  join_setup(handle);
  if (comm->state() != Comm::State::kInitializing)
    drive_until([&] { return !comm->has_pending_ops(); }, {comm.get()});
  if (abort && busy) {
    CHORUS_WARN(kInit, "{} aborted with operations in flight; {}", comm->describe(),
                comm->dump_flight_recorder());
  }
  comm->shutdown();
  return Status();
}
}  // namespace

CHORUS_NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return guard("ncclCommDestroy", [&] { return destroy(comm, false); });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return guard("ncclCommAbort", [&] { return destroy(comm, true); });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guard("ncclCommRevoke", [&]() -> Status {
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      return invalid_argument("revokeFlags {} must be NCCL_REVOKE_DEFAULT", revokeFlags);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, usable_comm(comm));
    if (c->has_pending_ops()) {
      c->request_abort();
      drive_until([&] { return !c->has_pending_ops(); }, {c.get()});
    }
    c->set_state(Comm::State::kRevoked);
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guard("ncclCommGetAsyncError", [&]() -> Status {
    if (asyncError == nullptr) return invalid_argument("asyncError is NULL");
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    *asyncError = to_nccl(c->async_status().code());
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return guard("ncclCommCount", [&]() -> Status {
    if (count == nullptr) return invalid_argument("count is NULL");
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    *count = c->nranks();
    return Status();
  });
}

CHORUS_API ncclResult_t chorusCommSetTimeout(ncclComm_t comm, int64_t timeoutMs) {
  return guard("chorusCommSetTimeout", [&]() -> Status {
    if (timeoutMs < 1) return invalid_argument("timeoutMs is {}: it must be at least 1", timeoutMs);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    c->set_timeout_ms(timeoutMs);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusCommGetTimeout(ncclComm_t comm, int64_t* timeoutMs) {
  return guard("chorusCommGetTimeout", [&]() -> Status {
    if (timeoutMs == nullptr) return invalid_argument("timeoutMs is NULL");
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    *timeoutMs = c->timeout_ms();
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guard("ncclCommCuDevice", [&]() -> Status {
    if (device == nullptr) return invalid_argument("device is NULL");
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    *device = c->cu_device();
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guard("ncclCommUserRank", [&]() -> Status {
    if (rank == nullptr) return invalid_argument("rank is NULL");
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    *rank = c->rank();
    return Status();
  });
}

CHORUS_NCCL_API(const char*, ncclGetErrorString, ncclResult_t result);
const char* ncclGetErrorString(ncclResult_t result) {
  // C callers may pass any int: read the bits, not the enum (a value outside ncclResult_t's
  // range is undefined to load as one; UBSan's enum check reports it).
  int code = 0;
  static_assert(sizeof(code) == sizeof(result));
  std::memcpy(&code, &result, sizeof(code));
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

CHORUS_NCCL_API(const char*, ncclGetLastError, ncclComm_t comm);
const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;  // as in NCCL, the last error of the calling thread
  return last_error();
}

CHORUS_NCCL_API(void, ncclResetDebugInit, void);
void ncclResetDebugInit(void) {
  params::reload_for_testing();
  log::reset();
}
