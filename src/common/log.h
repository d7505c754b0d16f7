// SPDX-License-Identifier: Apache-2.0
// File: src/common/log.h
// fmt-based logging. The level and subsystem are checked before anything is formatted, and the
// format string is checked against its arguments at compile time.
//
//   CHORUS_DEBUG (or NCCL_DEBUG)               = NONE | VERSION | WARN | INFO | TRACE
//   CHORUS_DEBUG_SUBSYS (or NCCL_DEBUG_SUBSYS) = INIT,COLL,... or ^INIT,... (exclude); default ALL
//   CHORUS_DEBUG_FILE (or NCCL_DEBUG_FILE)     = path; %h = hostname, %p = pid
//
// Each line is prefixed "host:pid:tid [rank] CHORUS LEVEL SUBSYS". Log an error once, where it is
// first detected; callers add context to the Status instead of logging again.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <string_view>

namespace chorus::log {

enum class Level : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kTrace = 4 };

enum Subsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2P = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kBootstrap = 1u << 5,
  kEnv = 1u << 6,
  kAlloc = 1u << 7,
  kRoute = 1u << 8,
  kSched = 1u << 9,
  kMoe = 1u << 10,
  kProxy = 1u << 11,
  kAll = ~0u,
};

struct State {
  std::atomic<int> level{-1};  // -1: not initialised yet
  std::atomic<uint32_t> mask{kAll};
};
extern State g_state;

void init();  // reads the environment; idempotent and thread-safe
// Re-reads the environment (tests and ncclResetDebugInit).
void reset();

inline bool enabled(Level level, Subsys subsys) {
  int current = g_state.level.load(std::memory_order_relaxed);
  if (current < 0) {
    init();
    current = g_state.level.load(std::memory_order_relaxed);
  }
  return static_cast<int>(level) <= current &&
         (level <= Level::kWarn || (g_state.mask.load(std::memory_order_relaxed) & subsys) != 0);
}

void write(Level level, Subsys subsys, std::string_view message);

// The rank shown in the prefix of lines logged by this thread (-1: none).
void set_thread_rank(int rank);
int thread_rank();

// True at most once per `interval_ms` for one call site (see CHORUS_WARN_RATELIMITED).
bool rate_limit_pass(std::atomic<int64_t>& last_ms, int64_t interval_ms);

std::string_view subsys_name(Subsys subsys);
// Whether this build has its TRACE lines (cmake -DCHORUS_ENABLE_TRACE=ON); without them
// TRACE logs what INFO does, and a note says so once.
bool trace_compiled_in();

}  // namespace chorus::log

#define CHORUS_LOG(level, subsys, ...)                                                       \
  do {                                                                                      \
    if (::chorus::log::enabled(level, subsys))                                              \
      ::chorus::log::write(level, subsys, ::fmt::format(__VA_ARGS__));                      \
  } while (0)

#define CHORUS_WARN(subsys, ...) CHORUS_LOG(::chorus::log::Level::kWarn, ::chorus::log::subsys, __VA_ARGS__)
#define CHORUS_INFO(subsys, ...) CHORUS_LOG(::chorus::log::Level::kInfo, ::chorus::log::subsys, __VA_ARGS__)
#define CHORUS_VERSION_LOG(...) CHORUS_LOG(::chorus::log::Level::kVersion, ::chorus::log::kInit, __VA_ARGS__)

#ifdef CHORUS_ENABLE_TRACE
#define CHORUS_TRACE(subsys, ...) CHORUS_LOG(::chorus::log::Level::kTrace, ::chorus::log::subsys, __VA_ARGS__)
#else
#define CHORUS_TRACE(subsys, ...) \
  do {                            \
  } while (0)
#endif

// A warning that repeats at most once a second from one call site.
#define CHORUS_WARN_RATELIMITED(subsys, ...)                                   \
  do {                                                                        \
    static std::atomic<int64_t> chorus_last_ms_{0};                           \
    if (::chorus::log::rate_limit_pass(chorus_last_ms_, 1000)) CHORUS_WARN(subsys, __VA_ARGS__); \
  } while (0)
