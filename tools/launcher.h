// SPDX-License-Identifier: Apache-2.0
// File: tools/launcher.h
// Starts N ranks of a program on this host (chorus-run, the multi-process tests, the demo):
// one unique id for all, CHORUS_* variables per rank (include/chorus/launch.h). A rank that
// fails, or the timeout, stops the others, so a launch never hangs.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace chorus::launch {

struct Options {
  int nranks = 1;
  std::vector<std::string> argv;  // the program (looked up in PATH) and its arguments
  std::vector<std::string> env;   // extra "NAME=value" for every rank
  int timeout_ms = 0;             // 0: no timeout
  // Network namespaces (names under /var/run/netns, as `ip netns add` makes them) standing for
  // hosts: rank r runs in netns[r % size]. Empty: all ranks in the launcher's namespace.
  std::vector<std::string> netns;
};

struct RankExit {
  // Why the launcher stopped a rank that was still running (killed_by_us).
  enum class Stop { kNone, kOtherRankFailed, kTimeout };
  int rank = -1;
  pid_t pid = 0;
  int status = 0;           // as from waitpid
  bool killed_by_us = false;
  Stop stop = Stop::kNone;
  int failed_rank = -1;     // kOtherRankFailed: the rank whose failure stopped the others
  int timeout_ms = 0;       // kTimeout: Options::timeout_ms
  bool ok() const;
  int exit_code() const;    // 0..255, or 128 + signal
  std::string describe() const;
};

// Runs the ranks to completion. The Status fails only if they could not be started.
Result<std::vector<RankExit>> run(const Options& options);

}  // namespace chorus::launch
