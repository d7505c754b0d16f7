// SPDX-License-Identifier: Apache-2.0
#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "common/fork_safe_mutex.h"
#include "common/params.h"

namespace chorus::log {

State g_state;

namespace {

// Guards g_file and the one-time setup below; fork-safe: a child forked while another thread
// logs must still be able to log.
ForkSafeMutex g_mutex;
FILE* g_file = nullptr;
std::string g_hostname;
thread_local int t_rank = -1;

struct SubsysName {
  Subsys bit;
  const char* name;
};
constexpr SubsysName kSubsysNames[] = {
    {kInit, "INIT"}, {kColl, "COLL"},          {kP2P, "P2P"},   {kShm, "SHM"},
    {kNet, "NET"},   {kBootstrap, "BOOTSTRAP"}, {kEnv, "ENV"},   {kAlloc, "ALLOC"},
    {kRoute, "ROUTE"}, {kSched, "SCHED"},      {kMoe, "MOE"},   {kProxy, "PROXY"},
};

int parse_level(const std::string& s) {
  if (s == "NONE") return static_cast<int>(Level::kNone);
  if (s == "VERSION") return static_cast<int>(Level::kVersion);
  if (s == "INFO") return static_cast<int>(Level::kInfo);
  if (s == "TRACE") return static_cast<int>(Level::kTrace);
  return static_cast<int>(Level::kWarn);
}

uint32_t parse_mask(std::string spec) {
  bool invert = !spec.empty() && spec[0] == '^';
  if (invert) spec.erase(0, 1);
  uint32_t mask = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string token = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (auto& c : token) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (token == "ALL") mask = kAll;
    for (const auto& s : kSubsysNames)
      if (token == s.name) mask |= s.bit;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

std::string expand_path(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      if (c == 'h') out += g_hostname;
      else if (c == 'p') out += std::to_string(getpid());
      else out += c;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// Writes one line; g_mutex is held.
void write_locked(Level level, Subsys subsys, std::string_view message) {
  static constexpr const char* kLevelNames[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};
  // Not cached: after fork() the calling thread has a new id.
  long tid = static_cast<long>(syscall(SYS_gettid));
  std::string line = fmt::format("{}:{}:{} [{}] CHORUS {} {} {}\n", g_hostname, getpid(), tid,
                                 t_rank, kLevelNames[static_cast<int>(level)],
                                 subsys_name(subsys), message);
  std::fwrite(line.data(), 1, line.size(), g_file ? g_file : stderr);
}

void init_locked() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  g_hostname = host;
  if (auto dot = g_hostname.find('.'); dot != std::string::npos) g_hostname.resize(dot);
  if (g_file != nullptr && g_file != stderr) std::fclose(g_file);
  g_file = stderr;
  const std::string& path = params::kDebugFile.get();
  if (!path.empty()) {
    std::string expanded = expand_path(path);
    if (FILE* f = std::fopen(expanded.c_str(), "a")) {
      std::setvbuf(f, nullptr, _IOLBF, 0);
      g_file = f;
    } else {
      std::fprintf(stderr, "chorus: cannot open CHORUS_DEBUG_FILE %s: %s\n", expanded.c_str(),
                   std::strerror(errno));
    }
  }
  g_state.mask.store(parse_mask(params::kDebugSubsys.get()), std::memory_order_relaxed);
  const int level = parse_level(params::kDebug.get());
  g_state.level.store(level, std::memory_order_release);
#ifndef CHORUS_ENABLE_TRACE
  // TRACE lines are compiled out of this build (they cost even when off), so TRACE would
  // silently log what INFO logs: say so, once per process.
  static bool trace_noted = false;
  if (level == static_cast<int>(Level::kTrace) && !trace_noted) {
    trace_noted = true;
    write_locked(Level::kWarn, kInit,
                 "TRACE was asked for (CHORUS_DEBUG or NCCL_DEBUG) but this build has no TRACE "
                 "lines: logging at INFO. Rebuild with cmake -DCHORUS_ENABLE_TRACE=ON for them");
  }
#endif
}

}  // namespace

void init() {
  std::lock_guard<ForkSafeMutex> lock(g_mutex);
  if (g_state.level.load(std::memory_order_relaxed) >= 0) return;
  init_locked();
}

void reset() {
  std::lock_guard<ForkSafeMutex> lock(g_mutex);
  init_locked();
}

std::string_view subsys_name(Subsys subsys) {
  for (const auto& s : kSubsysNames)
    if (s.bit == subsys) return s.name;
  return "ALL";
}

bool trace_compiled_in() {
#ifdef CHORUS_ENABLE_TRACE
  return true;
#else
  return false;
#endif
}

void set_thread_rank(int rank) { t_rank = rank; }
int thread_rank() { return t_rank; }

void write(Level level, Subsys subsys, std::string_view message) {
  // g_hostname is (re)written by init_locked() under g_mutex, possibly on another thread after
  // this one saw the level set (a relaxed load): read it under the mutex too.
  std::lock_guard<ForkSafeMutex> lock(g_mutex);
  write_locked(level, subsys, message);
}

bool rate_limit_pass(std::atomic<int64_t>& last_ms, int64_t interval_ms) {
  int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t prev = last_ms.load(std::memory_order_relaxed);
  if (prev != 0 && now - prev < interval_ms) return false;
  return last_ms.compare_exchange_strong(prev, now, std::memory_order_relaxed);
}

}  // namespace chorus::log
