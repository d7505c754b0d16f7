// SPDX-License-Identifier: Apache-2.0
// The parameter registry: parsing, precedence (CHORUS_ > NCCL_ > config file > default), and
// invalid values falling back to the default.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/params.h"

namespace chorus::params {
namespace {

// Sets environment variables for one test and restores the registry afterwards.
class EnvScope {
 public:
  ~EnvScope() {
    for (const auto& n : names_) unsetenv(n.c_str());
    reload_for_testing();
  }
  void set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    names_.push_back(name);
    reload_for_testing();
  }

 private:
  std::vector<std::string> names_;
};

TEST_CASE("integers parse with K, M and G suffixes", "[unit][params]") {
  int64_t v = 0;
  REQUIRE(parse_int("42", &v));
  CHECK(v == 42);
  REQUIRE(parse_int(" 4K ", &v));
  CHECK(v == 4096);
  REQUIRE(parse_int("2m", &v));
  CHECK(v == 2 << 20);
  REQUIRE(parse_int("1G", &v));
  CHECK(v == 1 << 30);
  REQUIRE(parse_int("0x10", &v));
  CHECK(v == 16);
  REQUIRE(parse_int("-3", &v));
  CHECK(v == -3);
  CHECK_FALSE(parse_int("", &v));
  CHECK_FALSE(parse_int("12abc", &v));
  CHECK_FALSE(parse_int("K", &v));
  CHECK_FALSE(parse_int("99999999999G", &v));
}

TEST_CASE("every parameter has a name, a description and a printable value", "[unit][params]") {
  REQUIRE(all().size() >= 15);
  for (const Param* p : all()) {
    CHECK(std::string(p->name()).size() > 0);
    CHECK(std::string(p->description()).size() > 10);
    CHECK(p->env_name().rfind("CHORUS_", 0) == 0);
    CHECK_NOTHROW(p->value_string());
    CHECK(p->source() == "default");
  }
}

TEST_CASE("environment values are read, CHORUS_ names before NCCL_ ones", "[unit][params]") {
  EnvScope env;
  CHECK(kTimeoutMs.get() == 300000);
  env.set("CHORUS_TIMEOUT_MS", "5000");
  CHECK(kTimeoutMs.get() == 5000);
  CHECK(kTimeoutMs.source() == "env CHORUS_TIMEOUT_MS");
  env.set("NCCL_SOCKET_IFNAME", "=eth0");
  CHECK(kSocketIfname.get() == "=eth0");
  CHECK(kSocketIfname.source() == "env NCCL_SOCKET_IFNAME");
  env.set("CHORUS_SOCKET_IFNAME", "^docker");
  CHECK(kSocketIfname.get() == "^docker");
  env.set("CHORUS_TUNER", "static");  // choices are case-insensitive
  CHECK(kTuner.get() == "STATIC");
}

TEST_CASE("invalid values keep the default", "[unit][params]") {
  EnvScope env;
  env.set("CHORUS_TIMEOUT_MS", "soon");
  CHECK(kTimeoutMs.get() == 300000);
  CHECK(kTimeoutMs.source() == "default");
  env.set("CHORUS_NCHANNELS", "99");  // out of range
  CHECK(kNumChannels.get() == 1);
  env.set("CHORUS_TUNER", "carrier-pigeon");
  CHECK(kTuner.get() == "MEASURE");
}

TEST_CASE("a config file supplies values the environment does not", "[unit][params]") {
  EnvScope env;
  std::string path = "/tmp/chorus_params_test_" + std::to_string(getpid()) + ".conf";
  {
    std::ofstream f(path);
    f << "# comment\nCHORUS_SPIN_US = 7\nNCCL_DEBUG=INFO\nCHORUS_CHUNK_BYTES=1M\n";
  }
  env.set("CHORUS_CONF_FILE", path);
  env.set("CHORUS_CHUNK_BYTES", "64K");  // the environment wins over the file
  CHECK(kSpinUs.get() == 7);
  CHECK(kSpinUs.source() == "file " + path);
  CHECK(kDebug.get() == "INFO");
  CHECK(kChunkBytes.get() == 64 << 10);
  std::remove(path.c_str());
}

TEST_CASE("misspelt CHORUS_ names are found, tools' and scripts' own names are not",
          "[unit][params]") {
  const char* env[] = {
      "CHORUS_NCHANNEL=4",         // misspelt CHORUS_NCHANNELS
      "CHORUS_NCHANNELS=2",        // a parameter
      "CHORUS_DEBG=INFO",          // misspelt CHORUS_DEBUG
      "CHORUS_RANK=0",             // set by chorus-run
      "CHORUS_UNIQUE_ID=00",       // set by chorus-run
      "CHORUS_CONF_FILE=/x",       // the config file's path
      "CHORUS_TEST_TRANSPORTS=tcp",  // tests
      "CHORUS_BENCH_ANYTHING=1",   // benchmarks
      "CHORUS_RDMA_DEV=rxe0",      // RDMA scripts
      "CHORUS_SOAK_SECONDS=5",     // soak
      "NCCL_NCHANNEL=3",           // not ours to judge
      "CHORUS_=1",                 // empty name: unknown
      "CHORUS_ZZZZZZZZZZZZZZZZZZZZ",  // no '=' at all
      nullptr,
  };
  CHECK(unknown_env_names(env) ==
        std::vector<std::string>{"CHORUS_", "CHORUS_DEBG", "CHORUS_NCHANNEL",
                                 "CHORUS_ZZZZZZZZZZZZZZZZZZZZ"});
  CHECK(nearest_env_name("CHORUS_NCHANNEL") == "CHORUS_NCHANNELS");
  CHECK(nearest_env_name("CHORUS_DEBG") == "CHORUS_DEBUG");
  CHECK(nearest_env_name("CHORUS_ZZZZZZZZZZZZZZZZZZZZ").empty());
  CHECK(unknown_env_names(nullptr).empty());
}

}  // namespace
}  // namespace chorus::params
