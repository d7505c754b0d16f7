// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_launch.cc
// The environment contract between chorus-run and the ranks it starts (include/chorus/launch.h).
#include <chorus/launch.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "api/api_util.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/launch_env.h"
#include "bootstrap/unique_id.h"
#include "common/bytes.h"
#include "common/log.h"
#include "common/params.h"
#include "net/socket.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_API ncclResult_t chorusUniqueIdToHex(const ncclUniqueId* id, char* hex) {
  return guard("chorusUniqueIdToHex", [&]() -> Status {
    if (id == nullptr || hex == nullptr) return invalid_argument("id or hex is NULL");
    static const char kDigits[] = "0123456789abcdef";
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
      auto b = static_cast<unsigned char>(id->internal[i]);
      hex[2 * i] = kDigits[b >> 4];
      hex[2 * i + 1] = kDigits[b & 15];
    }
    hex[2 * NCCL_UNIQUE_ID_BYTES] = '\0';
    return Status();
  });
}

CHORUS_API ncclResult_t chorusUniqueIdFromHex(const char* hex, ncclUniqueId* id) {
  return guard("chorusUniqueIdFromHex", [&]() -> Status {
    if (id == nullptr || hex == nullptr) return invalid_argument("id or hex is NULL");
    if (std::strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES)
      return invalid_argument("a unique id has {} hex digits, not {}", 2 * NCCL_UNIQUE_ID_BYTES,
                              std::strlen(hex));
    auto nibble = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
      int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) return invalid_argument("'{}' is not a hex digit", hi < 0 ? hex[2 * i] : hex[2 * i + 1]);
      id->internal[i] = static_cast<char>(hi << 4 | lo);
    }
    return Status();
  });
}

CHORUS_API ncclResult_t chorusLaunchInfo(ncclUniqueId* id, int* rank, int* nranks) {
  return guard("chorusLaunchInfo", [&]() -> Status {
    if (id == nullptr || rank == nullptr || nranks == nullptr)
      return invalid_argument("id, rank or nranks is NULL");
    const char* hex = std::getenv("CHORUS_UNIQUE_ID");
    const char* r = std::getenv("CHORUS_RANK");
    const char* n = std::getenv("CHORUS_NRANKS");
    if (hex == nullptr || r == nullptr || n == nullptr)
      return invalid_usage("CHORUS_UNIQUE_ID, CHORUS_RANK and CHORUS_NRANKS are not all set: start "
                           "the program with chorus-run");
    int64_t rv = 0, nv = 0;
    if (!params::parse_int(r, &rv) || !params::parse_int(n, &nv) || nv < 1 || rv < 0 || rv >= nv)
      return invalid_argument("CHORUS_RANK={} / CHORUS_NRANKS={} are not a valid rank and size", r, n);
    if (chorusUniqueIdFromHex(hex, id) != ncclSuccess)
      return invalid_argument("CHORUS_UNIQUE_ID is not a unique id in hex");
    *rank = static_cast<int>(rv);
    *nranks = static_cast<int>(nv);
    return Status();
  });
}

namespace {

// chorusUniqueIdFromEnv's count of calls in this process: the k-th call of every process makes
// the k-th communicator's id.
std::atomic<uint64_t> g_env_ids{0};

Status unique_id_from_env(ncclUniqueId* id, int* rank, int* nranks) {
  if (std::getenv("CHORUS_UNIQUE_ID") != nullptr) {
    ncclResult_t r = chorusLaunchInfo(id, rank, nranks);
    return r == ncclSuccess ? Status() : invalid_argument("{}", ncclGetLastError(nullptr));
  }
  const bootstrap::EnvLookup env = bootstrap::process_env();
  CHORUS_ASSIGN_OR_RETURN(bootstrap::LaunchEnv le, bootstrap::read_launch_env(env));
  CHORUS_ASSIGN_OR_RETURN(net::SockAddr root, net::resolve(le.root_host, le.port));
  const std::string job = fmt::format("{} #{}", le.job, g_env_ids.fetch_add(1));
  bool secret_given = false;
  bootstrap::UniqueId uid;
  uid.root = root;
  CHORUS_ASSIGN_OR_RETURN(uid.secret, bootstrap::job_secret(env, job, &secret_given));
  uid.comm_uid = fnv1a(job) | 1;
  CHORUS_INFO(kBootstrap, "{} ({}): rank {} of {}, rendezvous at {} ({}){}", le.launcher,
              le.source, le.rank, le.nranks, root.to_string(), le.root_host,
              secret_given ? ", job secret given"
                           : ", no CHORUS_JOB_SECRET(_FILE): keyed by the job's identity only");
  if (le.rank == 0) {
    // The root gives up a little before the ranks do (they start waiting at the same moment
    // here, unlike after ncclGetUniqueId), so that they hear from it which ranks never came.
    const int64_t timeout = params::kBootstrapTimeoutMs.get();
    CHORUS_RETURN_IF_ERROR(
        bootstrap::start_root_at(uid, timeout - std::min<int64_t>(1000, timeout / 10)));
  }
  bootstrap::encode_unique_id(uid, id->internal);
  *rank = le.rank;
  *nranks = le.nranks;
  return Status();
}

}  // namespace

CHORUS_API ncclResult_t chorusUniqueIdFromEnv(ncclUniqueId* id, int* rank, int* nranks) {
  return guard("chorusUniqueIdFromEnv", [&]() -> Status {
    if (id == nullptr || rank == nullptr || nranks == nullptr)
      return invalid_argument("id, rank or nranks is NULL");
    return unique_id_from_env(id, rank, nranks);
  });
}

CHORUS_API ncclResult_t chorusCommInitFromEnv(ncclComm_t* comm, ncclConfig_t* config) {
  if (comm == nullptr)
    return guard("chorusCommInitFromEnv",
                 [] { return invalid_argument("comm (the output pointer) is NULL"); });
  ncclUniqueId id;
  int rank = 0, nranks = 0;
  ncclResult_t r = guard("chorusCommInitFromEnv", [&]() -> Status {
    return unique_id_from_env(&id, &rank, &nranks);
  });
  if (r != ncclSuccess) return r;
  return ncclCommInitRankConfig(comm, nranks, id, rank, config);
}
