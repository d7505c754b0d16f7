// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_run.cc
// chorus-run: start N ranks of a program on this host.
//   chorus-run -n 4 [--timeout SECONDS] [-x NAME=value]... [--netns NS0,NS1,...] program [args...]
// --netns places rank r in network namespace NS[r % count], each namespace standing for a host.
// Exit status: 0 if every rank succeeded, else the first failing rank's status.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "tools/launcher.h"

namespace {
int usage(const char* self) {
  fmt::print(stderr,
             "usage: {} -n NRANKS [--timeout SECONDS] [-x NAME=value]... [--netns NS,...] "
             "program [args...]\n",
             self);
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  chorus::launch::Options o;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    if ((!std::strcmp(argv[i], "-n") || !std::strcmp(argv[i], "-np")) && i + 1 < argc) {
      o.nranks = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--timeout") && i + 1 < argc) {
      o.timeout_ms = std::atoi(argv[++i]) * 1000;
    } else if (!std::strcmp(argv[i], "-x") && i + 1 < argc) {
      o.env.emplace_back(argv[++i]);
    } else if (!std::strcmp(argv[i], "--netns") && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        o.netns.push_back(list.substr(pos, comma - pos));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else {
      return usage(argv[0]);
    }
  }
  if (i >= argc || o.nranks < 1) return usage(argv[0]);
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
