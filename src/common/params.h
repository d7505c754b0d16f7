// SPDX-License-Identifier: Apache-2.0
// File: src/common/params.h
// The one typed registry of every tunable. A parameter NAME is read from the environment as
// CHORUS_NAME, then (where NCCL has the same meaning) as NCCL_<alias>, then from the first config
// file found (CHORUS_CONF_FILE, ~/.chorus.conf, /etc/chorus.conf; lines "CHORUS_NAME=value"), and
// otherwise takes its default. Values are read once, on first use, and cached.
// `chorus-info` prints every parameter with its value, source and description.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::params {

class Param {
 public:
  Param(const char* name, const char* nccl_alias, const char* description);
  virtual ~Param() = default;
  Param(const Param&) = delete;
  Param& operator=(const Param&) = delete;

  const char* name() const { return name_; }            // without the CHORUS_ prefix
  const char* nccl_alias() const { return nccl_alias_; }  // without NCCL_, or nullptr
  const char* description() const { return description_; }
  std::string env_name() const;
  // Where the value came from: "default", "env CHORUS_X", "env NCCL_X" or "file PATH".
  const std::string& source() const;
  virtual std::string value_string() const = 0;
  virtual std::string default_string() const = 0;

 protected:
  friend void load_all();
  // Parses `text` (already trimmed); returns an empty string or why it is invalid.
  virtual std::string parse(std::string_view text) = 0;
  virtual void reset_to_default() = 0;
  static void ensure_loaded();

 private:
  const char* name_;
  const char* nccl_alias_;
  const char* description_;
  std::string source_ = "default";
};

class IntParam final : public Param {
 public:
  IntParam(const char* name, const char* nccl_alias, int64_t default_value, int64_t min_value,
           int64_t max_value, const char* description);
  int64_t get() const {
    ensure_loaded();
    return value_;
  }
  std::string value_string() const override;
  std::string default_string() const override;

 private:
  std::string parse(std::string_view text) override;
  void reset_to_default() override { value_ = default_; }
  int64_t default_, min_, max_;
  int64_t value_;
};

class StringParam final : public Param {
 public:
  // `choices`: comma-separated allowed values (case-insensitive), or nullptr for free text.
  StringParam(const char* name, const char* nccl_alias, const char* default_value,
              const char* choices, const char* description);
  const std::string& get() const {
    ensure_loaded();
    return value_;
  }
  std::string value_string() const override { return get(); }
  std::string default_string() const override { return default_; }

 private:
  std::string parse(std::string_view text) override;
  void reset_to_default() override { value_ = default_; }
  std::string default_;
  const char* choices_;
  std::string value_;
};

// Every parameter, in the order chorus-info prints them.
const std::vector<Param*>& all();
// Loads every value (idempotent). Invalid values keep the default and print a warning.
void load_all();
// Forgets cached values so the next access re-reads the environment. Tests only: not safe
// while other threads read parameters.
void reload_for_testing();
// Bumped whenever values are (re)loaded: caches derived from parameters compare it.
uint64_t generation();
// Parses a size with an optional K/M/G suffix (powers of 1024) or an integer; false if invalid.
bool parse_int(std::string_view text, int64_t* out);

// A misspelt CHORUS_* variable would otherwise be ignored without a word. The CHORUS_* names in
// `envp` (an environ-style, NULL-terminated array) that are neither a parameter nor another name
// that Chorus reads (the launcher's CHORUS_RANK..., CHORUS_CONF_FILE) nor under a prefix that
// the tests, benchmarks and scripts keep for themselves (kForeignEnvPrefixes in params.cc).
std::vector<std::string> unknown_env_names(const char* const* envp);
// The parameter's environment name nearest to `env_name` ("CHORUS_NCHANNEL" ->
// "CHORUS_NCHANNELS"), or "" when none is within a few typing mistakes.
std::string nearest_env_name(std::string_view env_name);
// Logs unknown_env_names(environ) at WARN, once per process (communicator initialisation calls
// it).
void warn_unknown_env_once();

// ---- The parameters -------------------------------------------------------------------------
// Logging (read by common/log.cc).
extern StringParam kDebug;
extern StringParam kDebugSubsys;
extern StringParam kDebugFile;
// Bootstrap and sockets.
extern StringParam kSocketIfname;
extern StringParam kSocketFamily;
extern IntParam kBootstrapTimeoutMs;
extern IntParam kConnectTimeoutMs;
extern StringParam kHostId;
// Transports.
extern StringParam kTransport;
extern IntParam kNumChannels;
extern IntParam kPathChunkBytes;
extern IntParam kShmFifoBytes;
extern IntParam kShmCmaBytes;
extern IntParam kShmMapBytes;
extern IntParam kStreamCopyBytes;
extern IntParam kTcpBounceBytes;
extern IntParam kTcpFailover;
// RDMA verbs (transports/verbs).
extern StringParam kIbHca;
extern StringParam kIbAddrFamily;
extern IntParam kIbGidIndex;
extern IntParam kIbTimeout;
extern IntParam kIbRetryCnt;
extern IntParam kIbTc;
extern IntParam kIbSl;
extern IntParam kIbSlots;
extern IntParam kIbSlotBytes;
extern IntParam kIbRdvBytes;
extern IntParam kIbQpsPerConnection;
// Progress and waiting.
extern IntParam kEpMap;
extern IntParam kEpPieceBytes;
extern IntParam kTimeoutMs;
extern IntParam kSpinUs;
extern IntParam kLivenessMs;
extern IntParam kPeerTimeoutMs;
extern IntParam kFlightRecorderOps;
extern IntParam kCommBlocking;
// Algorithms.
extern StringParam kAlgo;
extern IntParam kChunkBytes;
extern IntParam kBoxBytes;
extern IntParam kExpress;
extern StringParam kTuner;
extern StringParam kTunerFile;
extern StringParam kTopoFile;
extern StringParam kRing;
extern StringParam kRoute;
extern StringParam kCompress;
extern StringParam kCompressPolicy;
extern IntParam kCompressMinBytes;
extern IntParam kCompressBlock;
extern StringParam kCompressScale;
// Kernels.
extern StringParam kKernels;
// Registered memory.
extern IntParam kRegCacheBytes;

}  // namespace chorus::params
