// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_init.cc
// Communicator life cycle: unique ids, initialisation (by rank, all-in-process, scalable),
// split, shrink, finalize, destroy, abort, revoke.
#include <nccl.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "api/api_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/root_server.h"
#include "bootstrap/unique_id.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/params.h"
#include "core/engine.h"
#include "core/group.h"
#include "core/internal_ops.h"

namespace chorus::api {

namespace {

// Threads running non-blocking initialisations, joined by destroy/abort.
std::mutex g_init_threads_mutex;
std::map<const void*, std::thread>& init_threads() {
  static auto* map = new std::map<const void*, std::thread>();
  return *map;
}

void join_init_thread(const void* handle) {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(g_init_threads_mutex);
    auto it = init_threads().find(handle);
    if (it == init_threads().end()) return;
    t = std::move(it->second);
    init_threads().erase(it);
  }
  if (t.joinable()) t.join();
}

// Runs `setup` for a registered comm: now, at the group's end, or in the background.
Status start_setup(const std::shared_ptr<Comm>& comm, ncclComm_t handle,
                   std::function<Status()> setup) {
  auto job = [comm, setup = std::move(setup)]() -> Status {
    log::set_thread_rank(comm->rank());
    Status s = setup();
    if (!s.ok()) {
      comm->poison(s);
      comm->set_state(Comm::State::kFailed);
    }
    return s;
  };
  if (in_group()) return submit_init(job);
  if (!comm->config().blocking) {
    std::lock_guard<std::mutex> lock(g_init_threads_mutex);
    init_threads()[handle] = std::thread([job] { (void)job(); });
    return Status(Code::kInProgress, "initializing");
  }
  return job();
}

Status init_rank(ncclComm_t* out, int nranks, const std::vector<bootstrap::UniqueId>& ids,
                 int rank, const ncclConfig_t* config, int cu_device) {
  if (out == nullptr) return invalid_argument("comm (the output pointer) is NULL");
  *out = nullptr;
  if (nranks < 1) return invalid_argument("nranks {} must be at least 1", nranks);
  CHORUS_RETURN_IF_ERROR(check_rank("rank", rank, nranks));
  CommConfig defaults;
  defaults.cu_device = cu_device;
  CHORUS_ASSIGN_OR_RETURN(CommConfig cfg, parse_config(config, defaults));
  CommIdentity identity{rank, nranks, ids.front().comm_uid, ids.front().secret, cfg};
  auto comm = std::make_shared<Comm>(identity);
  ncclComm_t handle = register_comm(comm);
  *out = handle;
  Status s = start_setup(comm, handle, [comm, ids, rank, nranks]() -> Status {
    Deadline deadline = comm->cancellable_deadline(params::kBootstrapTimeoutMs.get());
    return comm->setup([&](const std::string& mine) {
      return ids.size() == 1 ? bootstrap::exchange(ids.front(), rank, nranks, mine, deadline)
                             : bootstrap::exchange_scalable(ids, rank, nranks, mine, deadline);
    });
  });
  if (!s.ok() && s.code() != Code::kInProgress && !in_group()) {
    unregister_comm(handle);
    comm->shutdown();
    *out = nullptr;
  }
  return s;
}

Result<bootstrap::UniqueId> decode(const ncclUniqueId& id) {
  return bootstrap::decode_unique_id(id.internal);
}

uint64_t child_uid(uint64_t parent, uint32_t ordinal, int color) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (uint64_t v : {static_cast<uint64_t>(ordinal), static_cast<uint64_t>(color) + 1}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

// Builds the child comm of a split or shrink over `members` (parent ranks, in new-rank order)
// and connects it through the parent. The records go round `exchange` (parent ranks, members
// among them): a split exchanges among all parent ranks, so that every parent rank runs the
// same internal operations on the parent whatever its colour (NCCL_SPLIT_NOCOLOR included);
// otherwise the parent's internal sequence numbers part and its next split fails.
Status make_child(const std::shared_ptr<Comm>& parent, std::vector<int> members,
                  std::vector<int> exchange, uint32_t ordinal, int color, const CommConfig& cfg,
                  ncclComm_t* newcomm) {
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank()) -
                                  members.begin());
  uint64_t uid = child_uid(parent->uid(), ordinal, color);
  CommIdentity identity{new_rank, static_cast<int>(members.size()), uid,
                        parent->secret().derive(fmt::format("child:{:x}", uid)), cfg};
  auto comm = std::make_shared<Comm>(identity);
  ncclComm_t handle = register_comm(comm);
  *newcomm = handle;
  return start_setup(comm, handle, [comm, parent, members, exchange]() -> Status {
    return comm->setup([&](const std::string& mine) -> Result<std::vector<std::string>> {
      CHORUS_ASSIGN_OR_RETURN(std::vector<std::string> records,
                              allgather_records(*parent, exchange, mine));
      std::vector<std::string> out;
      for (int r : members)
        out.push_back(std::move(records[std::find(exchange.begin(), exchange.end(), r) -
                                        exchange.begin()]));
      return out;
    });
  });
}

// The survivors of a shrink cannot count on the parent's connections: a failed comm has
// closed them, and a peer may have died in the middle of a message. So they meet afresh, at
// a rendezvous served by the lowest surviving rank on (a duplicate of) the listening socket
// its parent comm already published, authenticated with a secret derived from the parent's:
// only members of the parent can join, and the excluded ranks are simply never waited for.
Status shrink(const std::shared_ptr<Comm>& parent, const std::vector<int>& members,
              uint32_t ordinal, const CommConfig& cfg, ncclComm_t* newcomm) {
  const int new_rank = static_cast<int>(
      std::find(members.begin(), members.end(), parent->rank()) - members.begin());
  const int nranks = static_cast<int>(members.size());
  bootstrap::UniqueId id;
  id.comm_uid = child_uid(parent->uid(), ordinal, -2);
  id.secret = parent->secret().derive(fmt::format("shrink:{:x}", id.comm_uid));
  id.root = parent->peer(members.front()).rendezvous;
  if (nranks > 1 && new_rank == 0) {
    CHORUS_ASSIGN_OR_RETURN(UniqueFd listener, parent->dup_listener());
    CHORUS_RETURN_IF_ERROR(bootstrap::start_root_server(std::move(listener), id,
                                                        params::kBootstrapTimeoutMs.get()));
  }
  CommIdentity identity{new_rank, nranks, id.comm_uid,
                        id.secret.derive(fmt::format("child:{:x}", id.comm_uid)), cfg};
  auto comm = std::make_shared<Comm>(identity);
  ncclComm_t handle = register_comm(comm);
  *newcomm = handle;
  return start_setup(comm, handle, [comm, id, new_rank, nranks]() -> Status {
    Deadline deadline = comm->cancellable_deadline(params::kBootstrapTimeoutMs.get());
    return comm->setup([&](const std::string& mine) -> Result<std::vector<std::string>> {
      if (nranks == 1) return std::vector<std::string>{mine};
      return bootstrap::exchange(id, new_rank, nranks, mine, deadline);
    });
  });
}

Status split(const std::shared_ptr<Comm>& parent, int color, int key, const CommConfig& cfg,
             ncclComm_t* newcomm) {
  // Every parent rank learns every (color, key); then each color group builds its comm.
  ByteWriter w;
  w.put<int32_t>(color);
  w.put<int32_t>(key);
  std::vector<int> all(parent->nranks());
  for (int r = 0; r < parent->nranks(); ++r) all[r] = r;
  uint32_t ordinal = parent->next_child_ordinal();
  CHORUS_ASSIGN_OR_RETURN(std::vector<std::string> records, allgather_records(*parent, all, w.take()));
  // A NOCOLOR rank still takes part in the exchange of the children's records (see make_child).
  if (color == NCCL_SPLIT_NOCOLOR) return allgather_records(*parent, all, std::string()).status();
  std::vector<std::pair<int, int>> group;  // (key, parent rank)
  for (int r = 0; r < parent->nranks(); ++r) {
    ByteReader rd(records[r]);
    int32_t c = 0, k = 0;
    CHORUS_RETURN_IF_ERROR(rd.get(&c));
    CHORUS_RETURN_IF_ERROR(rd.get(&k));
    if (c == color) group.emplace_back(k, r);
  }
  std::sort(group.begin(), group.end());
  std::vector<int> members;
  for (const auto& [k, r] : group) members.push_back(r);
  return make_child(parent, members, all, ordinal, color, cfg, newcomm);
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
      return split(parent, color, key, cfg, newcomm);
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
      return shrink(parent, members, ordinal, cfg, newcomm);
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
  join_init_thread(handle);
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
  switch (result) {
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
