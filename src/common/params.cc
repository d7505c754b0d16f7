// SPDX-License-Identifier: Apache-2.0
#include "common/params.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>

#include "common/log.h"

extern char** environ;  // NOLINT: POSIX

namespace chorus::params {

// ---- The parameters -------------------------------------------------------------------------
// Keep this list and all() below in the same order: it is what chorus-info prints.

StringParam kDebug("DEBUG", "DEBUG", "WARN", "NONE,VERSION,WARN,INFO,TRACE",
                   "log level (TRACE needs a build with CHORUS_ENABLE_TRACE)");
StringParam kDebugSubsys("DEBUG_SUBSYS", "DEBUG_SUBSYS", "ALL", nullptr,
                         "subsystems logged at INFO/TRACE: INIT,COLL,P2P,SHM,NET,BOOTSTRAP,ENV,"
                         "ALLOC,ROUTE,SCHED,MOE,PROXY,ALL; a leading ^ excludes");
StringParam kDebugFile("DEBUG_FILE", "DEBUG_FILE", "", nullptr,
                       "log to this file instead of stderr (%h = hostname, %p = pid)");

StringParam kSocketIfname("SOCKET_IFNAME", "SOCKET_IFNAME", "", nullptr,
                          "interfaces for bootstrap and TCP: comma-separated prefixes, ^ to "
                          "exclude, = for exact names; empty = first non-loopback interface up");
StringParam kSocketFamily("SOCKET_FAMILY", "SOCKET_FAMILY", "ANY", "ANY,AF_INET,AF_INET6",
                          "address family for bootstrap and TCP sockets");
IntParam kBootstrapTimeoutMs("BOOTSTRAP_TIMEOUT_MS", nullptr, 120000, 100, INT64_MAX,
                             "how long the bootstrap root and ranks wait for each other");
IntParam kConnectTimeoutMs("CONNECT_TIMEOUT_MS", nullptr, 60000, 100, INT64_MAX,
                           "how long a rank waits to set up its transport connections");
StringParam kHostId("HOST_ID", "HOSTID", "", nullptr,
                    "override of the host identity (ranks with equal ids use shared memory); "
                    "default: boot id + network namespace");

StringParam kTransport("TRANSPORT", nullptr, "AUTO", nullptr,
                       "AUTO: the cheapest registered transport that reaches each peer (direct "
                       "memory in one process, shared memory on one host, TCP across hosts); or "
                       "a transport's name (chorus-info lists them) to force it between every "
                       "pair of ranks");
IntParam kNumChannels("NCHANNELS", "NCHANNELS", 1, 1, 16,
                      "independent ordered connections per peer");
IntParam kPathChunkBytes("PATH_CHUNK_BYTES", nullptr, 1 << 20, 4 << 10, 1ll << 30,
                     "with several connections per peer (CHORUS_NCHANNELS), messages longer "
                     "than this are cut into chunks of this size (a multiple of 4 KiB) that "
                     "travel over all of them at once; equal on every rank");
IntParam kShmFifoBytes("SHM_FIFO_BYTES", nullptr, 4 << 20, 64 << 10, 1ll << 30,
                       "bytes of each shared-memory FIFO (one per peer and channel)");
// Off by default: on the 2-core VM measured (bench/compare, quiet run), copying through the
// cache-resident FIFO beat process_vm_readv at every size from 1 MiB to 128 MiB, for every
// collective (AllReduce 1 MiB: 2.10 vs 1.02 GB/s busbw).
IntParam kShmCmaBytes("SHM_CMA_BYTES", nullptr, 0, 0, 1ll << 40,
                      "shared-memory messages of at least this many bytes are copied once, "
                      "straight from the sender's memory (process_vm_readv); 0 (default) turns "
                      "it off");
// From 256 KiB up, streaming stores were 1.4-1.7x faster for AllGather, AlltoAll and Broadcast
// over shared memory (2 ranks, 1-128 MiB, bench/coll with 128 MiB buffers).
IntParam kShmMapBytes("SHM_MAP_BYTES", nullptr, 64 << 10, 0, 1ll << 40,
                      "shared-memory messages of at least this many bytes sent from registered "
                      "ncclMemAlloc memory are copied once: the receiver maps the sender's "
                      "memfd and reads them in place; 0 turns it off");
IntParam kStreamCopyBytes("STREAM_COPY_BYTES", nullptr, 256 << 10, 0, 1ll << 40,
                          "copies and reductions of at least this many bytes into a user's "
                          "output buffer use streaming (non-temporal) stores that bypass the "
                          "caches; 0 turns them off");
IntParam kTcpBounceBytes("TCP_BOUNCE_BYTES", nullptr, 1 << 20, 4 << 10, 1ll << 30,
                         "staging buffer a TCP receive reduces from");
IntParam kTcpFailover("TCP_FAILOVER", nullptr, 1, 0, 1,
                      "1 = the TCP connections to a peer on several rails stand in for each "
                      "other: when one fails, its traffic continues on another and the "
                      "operations carry on (each keeps a copy of what it sent until "
                      "acknowledged); 0 = a failed connection fails the operations");

StringParam kIbHca("IB_HCA", "IB_HCA", "", nullptr,
                   "RDMA devices and ports the verbs transport may use: comma-separated "
                   "name[:port] prefixes, ^ to exclude, = for exact names (NCCL syntax); empty = "
                   "the first active port");
StringParam kIbAddrFamily("IB_ADDR_FAMILY", "IB_ADDR_FAMILY", "", "AF_INET,AF_INET6",
                          "verbs over RoCE: the address family of the GID (AF_INET: IPv4-mapped, "
                          "AF_INET6); empty: IPv4 preferred, IPv6 accepted");
IntParam kIbGidIndex("IB_GID_INDEX", "IB_GID_INDEX", -1, -1, 65535,
                     "GID index of the verbs transport's port; -1 = automatic (RoCE v2 with an "
                     "IPv4-mapped address first)");
IntParam kIbTimeout("IB_TIMEOUT", "IB_TIMEOUT", 20, 1, 31,
                    "verbs QP ACK timeout exponent: 4.096 us x 2^value per retry");
IntParam kIbRetryCnt("IB_RETRY_CNT", "IB_RETRY_CNT", 7, 0, 7,
                     "verbs QP retransmissions before a work request fails");
IntParam kIbTc("IB_TC", "IB_TC", 0, 0, 255, "verbs traffic class (DSCP << 2) of RoCE packets");
IntParam kIbSl("IB_SL", "IB_SL", 0, 0, 15, "verbs service level");
IntParam kIbSlots("IB_SLOTS", nullptr, 16, 4, 256,
                  "slots of each verbs receive ring (one per peer and channel); equal on every "
                  "rank");
IntParam kIbSlotBytes("IB_SLOT_BYTES", nullptr, 64 << 10, 4 << 10, 8 << 20,
                      "bytes of each verbs ring slot (64 of header, then payload; a multiple of "
                      "64); equal on every rank");
IntParam kIbQpsPerConnection("IB_QPS_PER_CONNECTION", "IB_QPS_PER_CONNECTION", 1, 1, 16,
                             "verbs QPs per connection (peer and channel): slots and zero-copy "
                             "writes go round robin over them (on RoCE v2 each has its own UDP "
                             "source port: its own ECMP path); equal on every rank");
IntParam kIbRdvBytes("IB_RDV_BYTES", nullptr, 64 << 10, 0, INT64_MAX,
                     "verbs messages of at least this many bytes from registered memory go by "
                     "rendezvous: written straight into the receiver's buffer when it is "
                     "registered too (zero copy), else through its ring; 0 = never");

IntParam kEpMap("EP_MAP", nullptr, 1, 0, 1,
                "MoE dispatch and combine (chorus/ep.h): 1 = a sender writes its tokens straight "
                "into the EP buffers of same-host receivers (one copy; unless CHORUS_TRANSPORT "
                "forces a transport without shared memory); 0 = through the communicator");
IntParam kEpPieceBytes("EP_PIECE_BYTES", nullptr, 1 << 20, 1, INT64_MAX,
                       "MoE dispatch and combine (chorus/ep.h): the records and rows between two "
                       "ranks on different hosts travel in pieces of about this many bytes (at "
                       "most 16), and the receiver unpacks or sums what arrived while the others "
                       "travel; the same on every rank");
IntParam kTimeoutMs("TIMEOUT_MS", nullptr, 300000, 1, INT64_MAX,
                    "a collective that makes no progress for this long fails naming the peer");
IntParam kSpinUs("SPIN_US", nullptr, 50, 0, 1000000,
                 "how long a waiting thread polls before it sleeps");
IntParam kLivenessMs("LIVENESS_MS", nullptr, 100, 1, 60000,
                     "how often a waiting rank checks that the processes of its same-host peers "
                     "are alive (a dead one fails the collective at once, naming it) and that "
                     "its peers on other hosts still acknowledge (CHORUS_PEER_TIMEOUT_MS)");
IntParam kPeerTimeoutMs("PEER_TIMEOUT_MS", nullptr, 10000, 2000, 3600000,
                        "a peer on another host that acknowledges none of the data sent to it, "
                        "or answers no keepalive probe while this rank waits for it, for this "
                        "long is unreachable (a host gone, every link to it down): the "
                        "operation fails naming it (TCP connections)");
IntParam kFlightRecorderOps("FLIGHT_RECORDER_OPS", nullptr, 64, 0, 1 << 20,
                            "operations each communicator remembers for diagnosis (logged on "
                            "timeout, abort and error; chorusCommDumpFlightRecorder)");
IntParam kCommBlocking("COMM_BLOCKING", "COMM_BLOCKING", INT_MIN, INT_MIN, 1,
                       "default for ncclConfig_t.blocking (0 or 1; unset: blocking)");

StringParam kAlgo("ALGO", nullptr, "AUTO", nullptr,
                  "force an algorithm, e.g. RING; AUTO lets the tuner choose");
IntParam kChunkBytes("CHUNK_BYTES", nullptr, 512 << 10, 256, 1ll << 30,
                     "pipelining granularity of chain and tree algorithms");
IntParam kBoxBytes("BOX_BYTES", nullptr, 4096, 0, 4096,
                   "largest message the small-message algorithms (one round through shared-memory "
                   "boxes, ranks of one host) carry; 0: never use them");
IntParam kExpress("EXPRESS", nullptr, 1, 0, 1,
                  "1: a blocking call that goes through the small-message boxes on an idle "
                  "communicator runs from the caller's frame, without queueing an operation; "
                  "0: as an operation, like every other call");

StringParam kTuner("TUNER", nullptr, "MEASURE", "MEASURE,STATIC",
                   "MEASURE: calibrate the cost model of each communicator when it is created; "
                   "STATIC: use the built-in defaults (or CHORUS_TUNER_FILE)");
StringParam kTunerFile("TUNER_FILE", nullptr, "", nullptr,
                       "cost-model parameters to use instead of measuring (see chorus-info --tune)");
StringParam kTopoFile("TOPO_FILE", nullptr, "", nullptr,
                      "topology file (src/topo/README.md) describing the cluster: when it "
                      "describes the communicator (its ranks, on its hosts in block order), its "
                      "link figures and rails make the cost model instead of measuring");
StringParam kKernels("KERNELS", nullptr, "AUTO", "AUTO,SCALAR,AVX2,AVX512",
                     "reduction kernel table (AUTO: the best the CPU supports)");
StringParam kRoute("ROUTE", nullptr, "ADAPTIVE", "ADAPTIVE,STATIC",
                   "how a message split over several paths to a peer (CHORUS_NCHANNELS > 1) "
                   "places its chunks: ADAPTIVE sends each on the path expected to finish it "
                   "first (bytes queued / measured rate); STATIC stripes them evenly");
StringParam kRing("RING", nullptr, "HOST", "HOST,RANK",
                  "order of the ring algorithms: HOST keeps each host's ranks adjacent (the ring "
                  "crosses between hosts once per host), RANK follows rank order");
StringParam kCompress("COMPRESS", nullptr, "OFF", "OFF,FP8_E4M3,FP8_E5M2",
                      "plain AllReduce / ReduceScatter of fp32, bf16 and fp16 send block-scaled FP8 "
                      "(include/chorus/compress.h): OFF, FP8_E4M3 or FP8_E5M2");
StringParam kCompressPolicy("COMPRESS_POLICY", nullptr, "AUTO", "AUTO,ALWAYS",
                            "with CHORUS_COMPRESS: AUTO compresses where the tuner predicts it is "
                            "faster (never over shared memory), ALWAYS whenever allowed");
IntParam kCompressMinBytes("COMPRESS_MIN_BYTES", nullptr, 256 << 10, 0, INT64_MAX,
                           "with CHORUS_COMPRESS: smaller buffers never compress");
IntParam kCompressBlock("COMPRESS_BLOCK", nullptr, 128, 1, 65536,
                        "with CHORUS_COMPRESS: elements per FP8 scale");
StringParam kCompressScale("COMPRESS_SCALE", nullptr, "FP32", "FP32,UE8M0",
                           "with CHORUS_COMPRESS: the per-block scale, an fp32 or a power of two "
                           "in one byte");
IntParam kRegCacheBytes("REG_CACHE_BYTES", nullptr, 1ll << 30, 0, INT64_MAX,
                        "buffers an operation registers implicitly (not ncclCommRegister'ed) "
                        "stay registered for reuse; the least recently used are released while a "
                        "communicator's registrations exceed this many bytes");

const std::vector<Param*>& all() {
  static const std::vector<Param*> list = {
      &kDebug,        &kDebugSubsys,   &kDebugFile,    &kSocketIfname, &kSocketFamily,
      &kBootstrapTimeoutMs, &kConnectTimeoutMs, &kHostId, &kTransport, &kNumChannels,
      &kPathChunkBytes, &kShmFifoBytes, &kShmCmaBytes,   &kShmMapBytes,   &kStreamCopyBytes, &kTcpBounceBytes, &kTcpFailover,
      &kIbHca, &kIbAddrFamily, &kIbGidIndex, &kIbTimeout, &kIbRetryCnt, &kIbTc, &kIbSl, &kIbSlots, &kIbSlotBytes, &kIbRdvBytes, &kIbQpsPerConnection, &kTimeoutMs,   &kSpinUs,       &kLivenessMs, &kPeerTimeoutMs,
      &kFlightRecorderOps, &kCommBlocking,
      &kAlgo,         &kChunkBytes,    &kBoxBytes,    &kExpress,     &kTuner,        &kTunerFile,   &kTopoFile,    &kKernels,
      &kRegCacheBytes, &kRing, &kRoute, &kCompress, &kCompressPolicy, &kCompressMinBytes, &kCompressBlock,
      &kCompressScale, &kEpMap, &kEpPieceBytes,
  };
  return list;
}

// ---- Loading --------------------------------------------------------------------------------

namespace {

std::atomic<bool> g_loaded{false};
std::atomic<uint64_t> g_generation{0};
std::mutex g_load_mutex;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// KEY=VALUE lines of the first config file that exists; '#' starts a comment.
std::vector<std::pair<std::string, std::string>> read_config_file(std::string* path_out) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("CHORUS_CONF_FILE")) candidates.emplace_back(p);
  if (const char* home = std::getenv("HOME")) candidates.push_back(std::string(home) + "/.chorus.conf");
  candidates.emplace_back("/etc/chorus.conf");
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& path : candidates) {
    std::ifstream in(path);
    if (!in) continue;
    *path_out = path;
    std::string line;
    while (std::getline(in, line)) {
      std::string_view view = trim(line);
      if (view.empty() || view.front() == '#') continue;
      auto eq = view.find('=');
      if (eq == std::string_view::npos) continue;
      entries.emplace_back(std::string(trim(view.substr(0, eq))), std::string(trim(view.substr(eq + 1))));
    }
    break;
  }
  return entries;
}

}  // namespace

bool parse_int(std::string_view text, int64_t* out) {
  text = trim(text);
  if (text.empty()) return false;
  int64_t multiplier = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'K' || last == 'M' || last == 'G') {
    multiplier = last == 'K' ? (1ll << 10) : last == 'M' ? (1ll << 20) : (1ll << 30);
    text.remove_suffix(1);
  }
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str() || *end != '\0') return false;
  if (v > INT64_MAX / multiplier || v < INT64_MIN / multiplier) return false;
  *out = static_cast<int64_t>(v) * multiplier;
  return true;
}

Param::Param(const char* name, const char* nccl_alias, const char* description)
    : name_(name), nccl_alias_(nccl_alias), description_(description) {}

std::string Param::env_name() const { return std::string("CHORUS_") + name_; }

const std::string& Param::source() const {
  ensure_loaded();
  return source_;
}

void Param::ensure_loaded() {
  if (!g_loaded.load(std::memory_order_acquire)) load_all();
}

void load_all() {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (g_loaded.load(std::memory_order_relaxed)) return;
  std::string file_path;
  auto file_entries = read_config_file(&file_path);
  for (Param* p : all()) {
    p->reset_to_default();
    p->source_ = "default";
    std::optional<std::string> text;
    std::string source;
    std::string env = p->env_name();
    if (const char* v = std::getenv(env.c_str())) {
      text = v;
      source = "env " + env;
    } else if (p->nccl_alias_ != nullptr) {
      std::string alias = std::string("NCCL_") + p->nccl_alias_;
      if (const char* v2 = std::getenv(alias.c_str())) {
        text = v2;
        source = "env " + alias;
      }
    }
    if (!text) {
      for (const auto& [key, value] : file_entries) {
        if (key == env || (p->nccl_alias_ && key == std::string("NCCL_") + p->nccl_alias_)) {
          text = value;
          source = "file " + file_path;
        }
      }
    }
    if (!text) continue;
    std::string error = p->parse(trim(*text));
    if (!error.empty()) {
      // Not through the logger: the logger itself reads parameters.
      std::fprintf(stderr, "chorus: ignoring %s=\"%s\" (%s): %s; using default %s\n",
                   env.c_str(), text->c_str(), source.c_str(), error.c_str(),
                   p->default_string().c_str());
      p->reset_to_default();
      continue;
    }
    p->source_ = source;
  }
  g_generation.fetch_add(1, std::memory_order_release);
  g_loaded.store(true, std::memory_order_release);
}

uint64_t generation() {
  if (!g_loaded.load(std::memory_order_acquire)) load_all();
  return g_generation.load(std::memory_order_acquire);
}

void reload_for_testing() {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  g_loaded.store(false, std::memory_order_release);
}

IntParam::IntParam(const char* name, const char* nccl_alias, int64_t default_value,
                   int64_t min_value, int64_t max_value, const char* description)
    : Param(name, nccl_alias, description),
      default_(default_value),
      min_(min_value),
      max_(max_value),
      value_(default_value) {}

std::string IntParam::parse(std::string_view text) {
  int64_t v = 0;
  if (!parse_int(text, &v)) return "not an integer";
  if (v < min_ || v > max_) return fmt::format("out of range [{}, {}]", min_, max_);
  value_ = v;
  return {};
}

std::string IntParam::value_string() const {
  int64_t v = get();
  return v == INT_MIN ? "unset" : std::to_string(v);
}

std::string IntParam::default_string() const {
  return default_ == INT_MIN ? "unset" : std::to_string(default_);
}

StringParam::StringParam(const char* name, const char* nccl_alias, const char* default_value,
                         const char* choices, const char* description)
    : Param(name, nccl_alias, description),
      default_(default_value),
      choices_(choices),
      value_(default_value) {}

std::string StringParam::parse(std::string_view text) {
  if (choices_ == nullptr) {
    value_ = std::string(text);
    return {};
  }
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  std::string_view choices(choices_);
  while (!choices.empty()) {
    auto comma = choices.find(',');
    std::string_view choice = choices.substr(0, comma);
    if (choice == upper) {
      value_ = upper;
      return {};
    }
    if (comma == std::string_view::npos) break;
    choices.remove_prefix(comma + 1);
  }
  return fmt::format("not one of {}", choices_);
}

// ---- Unknown CHORUS_* names ----------------------------------------------------------------

namespace {

// CHORUS_* names read outside this registry: the per-rank variables that chorus-run sets
// (read by api/api_launch.cc; CHORUS_LOCAL_RANK is for the program), the config file's path,
// and the scripts' path to chorus-run.
constexpr const char* kOtherEnvNames[] = {
    "CHORUS_CONF_FILE", "CHORUS_UNIQUE_ID", "CHORUS_RANK", "CHORUS_NRANKS", "CHORUS_LOCAL_RANK",
    "CHORUS_RUN",  // scripts/testbed.sh: the chorus-run to launch with
    // chorusCommInitFromEnv (bootstrap/launch_env.h): the job secret is not a parameter, so
    // that chorus-info never prints it.
    "CHORUS_JOB_SECRET", "CHORUS_JOB_SECRET_FILE", "CHORUS_RENDEZVOUS_ADDR",
    "CHORUS_RENDEZVOUS_PORT",
};
// Prefixes that belong to the tests, benchmarks and scripts, never to the library: their
// variables pass through the environment of the processes they start, and must not warn.
// (tests: CHORUS_TEST_*; bench: CHORUS_BENCH_*; the soft-RoCE and RDMA scripts: CHORUS_RDMA_*,
// CHORUS_RXE_*; scripts/sanitizers.sh: CHORUS_FUZZ_*, CHORUS_SAN_*; soak: CHORUS_SOAK_*;
// accuracy checks: CHORUS_ACCURACY_*; the launcher's tests: CHORUS_X_*; the torch backend's
// tests and benchmark: CHORUS_TORCH_*.)
constexpr const char* kForeignEnvPrefixes[] = {
    "CHORUS_TEST_", "CHORUS_BENCH_", "CHORUS_RDMA_", "CHORUS_RXE_",      "CHORUS_FUZZ_",
    "CHORUS_SAN_",  "CHORUS_SOAK_",  "CHORUS_X_",    "CHORUS_ACCURACY_", "CHORUS_TORCH_",
};

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> unknown_env_names(const char* const* envp) {
  std::vector<std::string> unknown;
  if (envp == nullptr) return unknown;
  for (const char* const* e = envp; *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    if (!starts_with(name, "CHORUS_")) continue;
    bool known = false;
    for (const Param* p : all()) known = known || name == p->env_name();
    for (const char* other : kOtherEnvNames) known = known || name == other;
    for (const char* prefix : kForeignEnvPrefixes) known = known || starts_with(name, prefix);
    if (!known) unknown.emplace_back(name);
  }
  std::sort(unknown.begin(), unknown.end());
  return unknown;
}

std::string nearest_env_name(std::string_view env_name) {
  std::string best;
  size_t best_distance = 4;  // more than 3 edits apart is not a typing mistake
  for (const Param* p : all()) {
    std::string candidate = p->env_name();
    size_t d = edit_distance(env_name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = std::move(candidate);
    }
  }
  return best;
}

void warn_unknown_env_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& name : unknown_env_names(environ)) {
      std::string nearest = nearest_env_name(name);
      CHORUS_WARN(kEnv, "{} is not a Chorus parameter and is ignored{} (chorus-info lists them)",
                  name, nearest.empty() ? "" : fmt::format("; did you mean {}?", nearest));
    }
  });
}

}  // namespace chorus::params
