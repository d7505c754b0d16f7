// SPDX-License-Identifier: Apache-2.0
// Multi-process: the collective matrix (smaller than the threaded one) across processes, over
// shared memory and over TCP (forced), started by the project's launcher.
#include <catch2/catch.hpp>
#include <dirent.h>

#include <set>
#include <string>

#include "tools/launcher.h"

namespace {

std::set<std::string> shm_entries() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

void run_workers(int nranks, const std::string& transport, const std::string& suite) {
  auto before = shm_entries();
  chorus::launch::Options o;
  o.nranks = nranks;
  o.argv = {CHORUS_MP_WORKER, suite};
  o.env = {"CHORUS_TRANSPORT=" + transport};
  o.timeout_ms = 600000;
  auto result = chorus::launch::run(o);
  REQUIRE(result.ok());
  for (const auto& r : *result) {
    INFO(r.describe());
    CHECK(r.ok());
  }
  CHECK(shm_entries() == before);  // nothing left behind in /dev/shm
}

}  // namespace

TEST_CASE("multi-process matrix over shared memory with 2 ranks", "[mp][shm]") { run_workers(2, "SHM", "matrix"); }
TEST_CASE("multi-process matrix over shared memory with 3 ranks", "[mp][shm]") { run_workers(3, "SHM", "matrix"); }
TEST_CASE("multi-process matrix over shared memory with 4 ranks", "[mp][shm]") { run_workers(4, "SHM", "matrix"); }
TEST_CASE("multi-process matrix over TCP with 2 ranks", "[mp][tcp]") { run_workers(2, "TCP", "matrix"); }
TEST_CASE("multi-process matrix over TCP with 3 ranks", "[mp][tcp]") { run_workers(3, "TCP", "matrix"); }
TEST_CASE("multi-process matrix on host streams over shared memory with 3 ranks", "[mp][shm][stream]") {
  run_workers(3, "SHM", "stream-matrix");
}
TEST_CASE("multi-process matrix with automatic transports with 4 ranks", "[mp]") { run_workers(4, "AUTO", "matrix"); }
