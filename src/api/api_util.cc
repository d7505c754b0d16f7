// SPDX-License-Identifier: Apache-2.0
#include "api/api_util.h"

#include <fmt/format.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "common/dtype.h"
#include "common/params.h"

namespace chorus::api {

static_assert(static_cast<int>(Code::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(Code::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(Code::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(Code::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(Code::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(Code::kInProgress) == ncclInProgress);
static_assert(static_cast<int>(DataType::kFloat8e5m2) == ncclFloat8e5m2);
static_assert(static_cast<int>(DataType::kBfloat16) == ncclBfloat16);
static_assert(static_cast<int>(RedOpKind::kAvg) == ncclAvg);

namespace {
thread_local std::string t_last_error;

std::shared_mutex g_comms_mutex;
// Bumped (under g_comms_mutex) by every registration and removal.
std::atomic<uint64_t> g_comms_generation{0};
// The last handle this thread looked up, valid while the generation is unchanged: a thread
// calling one communicator over and over takes neither the lock nor the map lookup. It may
// hold a destroyed comm's memory (never its resources: destroy shuts the comm down) until the
// thread's next lookup or exit; the destroying thread drops its own at once.
struct LastComm {
  ncclComm_t handle = nullptr;
  uint64_t generation = 0;
  std::shared_ptr<Comm> comm;
};
thread_local LastComm t_last_comm;
std::unordered_map<const void*, std::shared_ptr<Comm>>& comms() {
  static auto* map = new std::unordered_map<const void*, std::shared_ptr<Comm>>();
  return *map;
}
}  // namespace

ncclResult_t to_nccl(Code code) { return static_cast<ncclResult_t>(code); }

log::Subsys subsys_of(std::string_view function) {
  auto has = [function](std::string_view part) { return function.find(part) != function.npos; };
  // The WARN line's subsystem follows what the call is about (a bad count passed to
  // ncclAllReduce is COLL, not INIT), so that NCCL_DEBUG_SUBSYS-minded readers find it.
  if (has("Overlap")) return log::kSched;  // chorusOverlapRegister registers a tensor
  if (function.substr(0, 8) == "chorusEp") return log::kMoe;
  if (has("Register") || has("MemAlloc") || has("MemFree")) return log::kAlloc;
  if (function.substr(0, 8) == "ncclComm" || has("UniqueId") || has("GetVersion") ||
      has("chorusLaunch") || has("Timeout"))
    return log::kInit;
  return log::kColl;  // collectives, send/receive, groups, reduction ops, streams, compressors
}

ncclResult_t report(const char* function, const Status& status) {
  t_last_error = fmt::format("{}: {}", function, status.message());
  // An error logged where it was detected (a transport, a comm that broke) is not logged again.
  if (!status.logged() && log::enabled(log::Level::kWarn, log::kAll)) {
    log::write(log::Level::kWarn, subsys_of(function),
               fmt::format("{} failed: {} ({})", function, status.message(),
                           code_name(status.code())));
  }
  return to_nccl(status.code());
}

const char* last_error() { return t_last_error.c_str(); }

ncclComm_t register_comm(std::shared_ptr<Comm> comm) {
  auto* handle = reinterpret_cast<ncclComm_t>(comm.get());
  std::unique_lock<std::shared_mutex> lock(g_comms_mutex);
  comms()[handle] = std::move(comm);
  g_comms_generation.fetch_add(1, std::memory_order_release);
  return handle;
}

void unregister_comm(ncclComm_t handle) {
  std::shared_ptr<Comm> gone;  // released after the lock, like the thread's cached reference
  {
    std::unique_lock<std::shared_mutex> lock(g_comms_mutex);
    auto it = comms().find(handle);
    if (it == comms().end()) return;
    gone = std::move(it->second);
    comms().erase(it);
    g_comms_generation.fetch_add(1, std::memory_order_release);
  }
  if (t_last_comm.handle == handle) t_last_comm = LastComm{};
}

Result<std::shared_ptr<Comm>> find_comm(ncclComm_t handle) {
  if (handle == nullptr) return invalid_argument("comm is NULL");
  // The registry has not changed since this thread looked this handle up: the same comm.
  const uint64_t generation = g_comms_generation.load(std::memory_order_acquire);
  if (t_last_comm.handle == handle && t_last_comm.generation == generation)
    return t_last_comm.comm;
  LastComm found;
  {
    std::shared_lock<std::shared_mutex> lock(g_comms_mutex);
    auto it = comms().find(handle);
    // Read under the lock: a registration after it bumps the generation again.
    if (it != comms().end())
      found = LastComm{handle, g_comms_generation.load(std::memory_order_relaxed), it->second};
  }
  // Replaced outside the lock: the reference dropped may be a destroyed comm's last.
  t_last_comm = std::move(found);
  if (t_last_comm.comm == nullptr) {
    return invalid_argument("comm {} is not a live communicator (destroyed, aborted or never "
                            "created)", static_cast<const void*>(handle));
  }
  return t_last_comm.comm;
}

Result<std::shared_ptr<Comm>> usable_comm(ncclComm_t handle) {
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> comm, find_comm(handle));
  switch (comm->state()) {
    case Comm::State::kInitializing:
      return invalid_usage("{} is still initializing; poll ncclCommGetAsyncError until it "
                           "returns ncclSuccess", comm->describe());
    case Comm::State::kFinalized:
      return invalid_usage("{} was finalized; only ncclCommDestroy is allowed", comm->describe());
    case Comm::State::kAborted:
      return invalid_usage("{} was aborted", comm->describe());
    default: break;
  }
  return comm;
}

Result<Stream*> find_stream(cudaStream_t stream) {
  if (stream == nullptr) return static_cast<Stream*>(nullptr);
  Stream* s = Stream::from_handle(stream);
  if (s == nullptr) {
    return invalid_argument("stream {} was not created by chorusStreamCreate (or was destroyed)",
                            static_cast<const void*>(stream));
  }
  return s;
}

Status check_datatype(int datatype) {
  if (!datatype_valid(datatype))
    return invalid_argument("datatype {} is not a valid ncclDataType_t", datatype);
  return Status();
}

Status check_rank(const char* what, int value, int nranks) {
  if (value < 0 || value >= nranks)
    return invalid_argument("{} {} is out of range [0, {})", what, value, nranks);
  return Status();
}

Result<RedOp> resolve_op(const Comm& comm, int op, int datatype) {
  int id = op;
  if (id >= 0 && id < kNumBuiltinOps) {
    RedOp r;
    r.kind = static_cast<RedOpKind>(id);
    return r;
  }
  return comm.resolve_redop(id, static_cast<DataType>(datatype));
}

Status check_size(size_t count, int datatype, size_t multiplier) {
  size_t es = datatype_size(static_cast<DataType>(datatype));
  if (multiplier == 0) multiplier = 1;
  if (count > SIZE_MAX / es / multiplier || count * es * multiplier > (size_t{1} << 56))
    return invalid_argument("count {} x {} x {} overflows", count, es, multiplier);
  return Status();
}

namespace {
constexpr unsigned kConfigMagic = 0xcafebeef;
}  // namespace

Result<CommConfig> parse_config(const ncclConfig_t* config, const CommConfig& defaults) {
  CommConfig out = defaults;
  int env_blocking = static_cast<int>(params::kCommBlocking.get());
  if (env_blocking != INT_MIN) out.blocking = env_blocking != 0;
  if (config == nullptr) return out;
  if (config->magic != kConfigMagic) {
    return invalid_argument("ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER "
                            "(magic {:#x})", config->magic);
  }
  // Read only what the caller's struct holds (its size) and what its header version defines.
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  size_t size = std::min(config->size, sizeof(ncclConfig_t));
  if (size < offsetof(ncclConfig_t, blocking)) {
    return invalid_argument("ncclConfig_t size {} is too small", config->size);
  }
  std::memcpy(&c, config, size);
  c.size = sizeof(ncclConfig_t);
  const ncclConfig_t d = NCCL_CONFIG_INITIALIZER;
  unsigned v = config->version;
  if (v < NCCL_VERSION(2, 17, 0)) {
    c.cgaClusterSize = d.cgaClusterSize;
    c.minCTAs = d.minCTAs;
    c.maxCTAs = d.maxCTAs;
    c.netName = d.netName;
  }
  if (v < NCCL_VERSION(2, 18, 0)) c.splitShare = d.splitShare;
  if (v < NCCL_VERSION(2, 26, 0)) c.trafficClass = d.trafficClass;
  if (v < NCCL_VERSION(2, 27, 0)) {
    c.commName = d.commName;
    c.collnetEnable = d.collnetEnable;
    c.CTAPolicy = d.CTAPolicy;
    c.shrinkShare = d.shrinkShare;
    c.nvlsCTAs = d.nvlsCTAs;
  }
  if (v < NCCL_VERSION(2, 28, 0)) {
    c.nChannelsPerNetPeer = d.nChannelsPerNetPeer;
    c.nvlinkCentricSched = d.nvlinkCentricSched;
  }
  auto bad = [](const char* field, int value) {
    return invalid_argument("ncclConfig_t.{} = {} is not valid", field, value);
  };
  if (c.blocking != NCCL_CONFIG_UNDEF_INT) {
    if (c.blocking != 0 && c.blocking != 1) return bad("blocking", c.blocking);
    out.blocking = c.blocking == 1;
  }
  if (c.cgaClusterSize != NCCL_CONFIG_UNDEF_INT && (c.cgaClusterSize < 0 || c.cgaClusterSize > 8))
    return bad("cgaClusterSize", c.cgaClusterSize);
  if (c.minCTAs != NCCL_CONFIG_UNDEF_INT && c.minCTAs <= 0) return bad("minCTAs", c.minCTAs);
  if (c.maxCTAs != NCCL_CONFIG_UNDEF_INT && c.maxCTAs <= 0) return bad("maxCTAs", c.maxCTAs);
  if (c.minCTAs != NCCL_CONFIG_UNDEF_INT && c.maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      c.minCTAs > c.maxCTAs)
    return invalid_argument("ncclConfig_t.minCTAs {} > maxCTAs {}", c.minCTAs, c.maxCTAs);
  if (c.splitShare != NCCL_CONFIG_UNDEF_INT) {
    if (c.splitShare != 0 && c.splitShare != 1) return bad("splitShare", c.splitShare);
    out.split_share = c.splitShare;
  }
  if (c.collnetEnable != NCCL_CONFIG_UNDEF_INT && c.collnetEnable != 0 && c.collnetEnable != 1)
    return bad("collnetEnable", c.collnetEnable);
  if (c.CTAPolicy != NCCL_CONFIG_UNDEF_INT && (c.CTAPolicy < 0 || c.CTAPolicy > 2))
    return bad("CTAPolicy", c.CTAPolicy);
  if (c.shrinkShare != NCCL_CONFIG_UNDEF_INT && c.shrinkShare != 0 && c.shrinkShare != 1)
    return bad("shrinkShare", c.shrinkShare);
  if (c.nChannelsPerNetPeer != NCCL_CONFIG_UNDEF_INT && c.nChannelsPerNetPeer <= 0)
    return bad("nChannelsPerNetPeer", c.nChannelsPerNetPeer);
  if (c.commName != nullptr) out.name = std::string(c.commName).substr(0, 128);
  return out;
}

}  // namespace chorus::api
