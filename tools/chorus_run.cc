// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_run.cc
// chorus-run: start N ranks of a program on this host.
//   chorus-run -n 4 [--timeout SECONDS] [-x NAME=value]... [--netns NS0,NS1,...] program [args...]
// --netns places rank r in network namespace NS[r % count], each namespace standing for a host.
// Exit status: 0 if every rank succeeded, else the first failing rank's status; 2 for a bad
// command line, which is named ("-n must be at least 1"), not only answered with the usage.
#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "tools/launcher.h"

namespace {

constexpr const char* kUsage =
    "usage: {} -n NRANKS [--timeout SECONDS] [-x NAME=value]... [--netns NS,...] program "
    "[args...]\n";

// A mistake on the command line: what was wrong, then the usage line (exit status 2).
int usage_error(const char* self, const std::string& what) {
  fmt::print(stderr, "chorus-run: {}\n", what);
  fmt::print(stderr, kUsage, self);
  return 2;
}

int help(const char* self) {
  fmt::print(kUsage, self);
  fmt::print(
      "Starts NRANKS processes of program on this host, with one unique id for all and\n"
      "CHORUS_UNIQUE_ID, CHORUS_RANK, CHORUS_NRANKS, CHORUS_LOCAL_RANK (and RANK, WORLD_SIZE,\n"
      "LOCAL_RANK, LOCAL_WORLD_SIZE) set per rank. A rank that fails stops the others.\n"
      "  -n, -np NRANKS      number of ranks, at least 1 (1)\n"
      "  --timeout SECONDS   stop every rank after this long (0 or absent: no limit)\n"
      "  -x NAME=value       set NAME in every rank's environment (repeatable)\n"
      "  --netns NS,...      run rank r in network namespace NS[r % count]\n"
      "  -h, --help          this text\n"
      "Exit status: 0 if every rank exited 0, else the first failing rank's status (1 if\n"
      "only the launcher stopped ranks); 2 for a bad command line.\n");
  return 0;
}

// A whole decimal integer in [lo, hi], or nothing.
std::optional<long> parse_int(const char* text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return std::nullopt;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  chorus::launch::Options o;  // without -n: one rank, as before
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    const char* opt = argv[i];
    if (!std::strcmp(opt, "-h") || !std::strcmp(opt, "--help")) return help(argv[0]);
    const bool takes_value = !std::strcmp(opt, "-n") || !std::strcmp(opt, "-np") ||
                             !std::strcmp(opt, "--timeout") || !std::strcmp(opt, "-x") ||
                             !std::strcmp(opt, "--netns");
    if (!takes_value) return usage_error(argv[0], fmt::format("unknown option '{}'", opt));
    if (i + 1 >= argc) return usage_error(argv[0], fmt::format("{} needs a value", opt));
    const char* value = argv[++i];
    if (!std::strcmp(opt, "-n") || !std::strcmp(opt, "-np")) {
      auto n = parse_int(value, LONG_MIN, LONG_MAX);
      if (!n) return usage_error(argv[0], fmt::format("{} '{}' is not a number", opt, value));
      if (*n < 1)
        return usage_error(argv[0], fmt::format("{} must be at least 1 (got {})", opt, *n));
      if (*n > 65536)
        return usage_error(argv[0], fmt::format("{} {} is more ranks than one host runs", opt, *n));
      o.nranks = static_cast<int>(*n);
    } else if (!std::strcmp(opt, "--timeout")) {
      auto s = parse_int(value, 0, INT_MAX / 1000);
      if (!s) {
        return usage_error(argv[0], fmt::format("--timeout '{}' is not a number of seconds in "
                                                "0..{}",
                                                value, INT_MAX / 1000));
      }
      o.timeout_ms = static_cast<int>(*s) * 1000;
    } else if (!std::strcmp(opt, "-x")) {
      o.env.emplace_back(value);
    } else {  // --netns
      std::string list = value;
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        o.netns.push_back(list.substr(pos, comma - pos));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    }
  }
  if (i >= argc) return usage_error(argv[0], "no program to start");
  for (; i < argc; ++i) o.argv.emplace_back(argv[i]);
  auto result = chorus::launch::run(o);
  if (!result.ok()) {
    fmt::print(stderr, "chorus-run: {}\n", result.status().message());
    return 1;
  }
  int code = 0;
  for (const auto& r : *result) {
    if (r.ok()) continue;
    fmt::print(stderr, "chorus-run: {}\n", r.describe());
    if (code == 0 && !r.killed_by_us) code = r.exit_code();
  }
  if (code == 0) {
    for (const auto& r : *result)
      if (!r.ok()) code = 1;
  }
  return code;
}
