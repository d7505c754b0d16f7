// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/log_test.cc
// The logger's setup from the environment: a TRACE request in a build without TRACE lines
// says so once, instead of silently logging at INFO. The subsystem of API errors.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nccl.h>

#include "api/api_util.h"
#include "common/log.h"
#include "common/params.h"

namespace chorus::log {
namespace {

std::string read_file(const char* path) {
  std::string text;
  if (FILE* f = std::fopen(path, "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("TRACE without TRACE lines compiled in says how to get them, once", "[unit][log]") {
  char path[] = "/tmp/chorus_log_test_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  setenv("CHORUS_DEBUG_FILE", path, 1);
  setenv("NCCL_DEBUG", "TRACE", 1);
  params::reload_for_testing();
  reset();
  reset();  // a second setup (ncclResetDebugInit) does not repeat the note
  CHORUS_INFO(kInit, "an info line");
  unsetenv("CHORUS_DEBUG_FILE");
  unsetenv("NCCL_DEBUG");
  params::reload_for_testing();
  reset();
  std::string text = read_file(path);
  unlink(path);
  INFO(text);
  CHECK(count(text, "an info line") == 1);
  if (trace_compiled_in()) {
    CHECK(count(text, "no TRACE lines") == 0);
  } else {
    CHECK(count(text, "CHORUS WARN INIT TRACE was asked for (CHORUS_DEBUG or NCCL_DEBUG) but "
                      "this build has no TRACE lines: logging at INFO. Rebuild with cmake "
                      "-DCHORUS_ENABLE_TRACE=ON") == 1);
  }
}

TEST_CASE("argument errors are logged under the subsystem of the call", "[unit][log]") {
  // A bad count passed to ncclAllReduce is a COLL matter, not INIT (as it was for every call).
  CHECK(api::subsys_of("ncclAllReduce") == kColl);
  CHECK(api::subsys_of("ncclSend") == kColl);
  CHECK(api::subsys_of("ncclGroupEnd") == kColl);
  CHECK(api::subsys_of("ncclRedOpCreatePreMulSum") == kColl);
  CHECK(api::subsys_of("chorusAllReduceCompressed") == kColl);
  CHECK(api::subsys_of("ncclCommInitRank") == kInit);
  CHECK(api::subsys_of("ncclCommDestroy") == kInit);
  CHECK(api::subsys_of("ncclGetUniqueId") == kInit);
  CHECK(api::subsys_of("ncclMemAlloc") == kAlloc);
  CHECK(api::subsys_of("ncclCommRegister") == kAlloc);
  CHECK(api::subsys_of("ncclCommWindowRegister") == kAlloc);
  CHECK(api::subsys_of("chorusOverlapRegister") == kSched);
  CHECK(api::subsys_of("chorusOverlapWait") == kSched);
  CHECK(api::subsys_of("chorusEpDispatch") == kMoe);
  CHECK(api::subsys_of("chorusEpBufferCreate") == kMoe);

  // And through the API: a NULL communicator given to a collective.
  char path[] = "/tmp/chorus_log_test_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  setenv("CHORUS_DEBUG_FILE", path, 1);
  params::reload_for_testing();
  reset();
  float x = 0;
  CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
  unsetenv("CHORUS_DEBUG_FILE");
  params::reload_for_testing();
  reset();
  std::string text = read_file(path);
  unlink(path);
  INFO(text);
  CHECK(count(text, "CHORUS WARN COLL ncclAllReduce failed") == 1);
  CHECK(count(text, " INIT ") == 0);
}

}  // namespace
}  // namespace chorus::log
