// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/launch_env_test.cc
// Reading the launcher's environment (bootstrap/launch_env.h): torchrun, Open MPI and Slurm,
// the overrides, Slurm node lists, malformed variables, the job secret. The rendezvous itself,
// processes under each launcher, is tests/launcher/env_launch_test.sh's.
#include "bootstrap/launch_env.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <string>

namespace {

using namespace chorus;
using namespace chorus::bootstrap;

// An environment of its own, instead of the process's.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() || it->second.empty() ? nullptr : it->second.c_str();
    };
  }
};

FakeEnv torchrun(int rank) {
  return {{{"RANK", std::to_string(rank)},
           {"WORLD_SIZE", "4"},
           {"LOCAL_RANK", std::to_string(rank % 2)},
           {"MASTER_ADDR", "10.1.2.3"},
           {"MASTER_PORT", "29500"},
           {"TORCHELASTIC_RUN_ID", "run7"}}};
}

}  // namespace

TEST_CASE("launch env: torchrun's variables; the root one port above MASTER_PORT", "[launch]") {
  auto le = read_launch_env(torchrun(3).lookup());
  REQUIRE(le.ok());
  CHECK(le->launcher == "torchrun");
  CHECK(le->rank == 3);
  CHECK(le->nranks == 4);
  CHECK(le->local_rank == 1);
  CHECK(le->root_host == "10.1.2.3");
  CHECK(le->port == 29501);
  // Every rank names the same job, so derives the same secret.
  auto other = read_launch_env(torchrun(0).lookup());
  REQUIRE(other.ok());
  CHECK(other->job == le->job);
  CHECK(le->job.find("run7") != std::string::npos);
}

TEST_CASE("launch env: Open MPI on one host meets on loopback, on several needs MASTER_ADDR",
          "[launch]") {
  FakeEnv env{{{"OMPI_COMM_WORLD_RANK", "1"},
               {"OMPI_COMM_WORLD_SIZE", "3"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
               {"PMIX_NAMESPACE", "prterun-vm-1234@1"}}};
  auto le = read_launch_env(env.lookup());
  REQUIRE(le.ok());
  CHECK(le->launcher == "Open MPI");
  CHECK(le->rank == 1);
  CHECK(le->nranks == 3);
  CHECK(le->root_host == "127.0.0.1");
  CHECK(le->port >= 20000);
  CHECK(le->port < 30000);
  // Another job id, (almost surely) another port: jobs on one host keep apart.
  FakeEnv env2 = env;
  env2.vars["PMIX_NAMESPACE"] = "prterun-vm-5678@1";
  auto le2 = read_launch_env(env2.lookup());
  REQUIRE(le2.ok());
  CHECK(le2->job != le->job);

  env.vars["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  auto several = read_launch_env(env.lookup());
  REQUIRE_FALSE(several.ok());
  CHECK(several.status().code() == Code::kInvalidUsage);
  CHECK_THAT(several.status().message(), Catch::Contains("set MASTER_ADDR"));
  env.vars["MASTER_ADDR"] = "host0";
  env.vars["MASTER_PORT"] = "4000";
  auto named = read_launch_env(env.lookup());
  REQUIRE(named.ok());
  CHECK(named->root_host == "host0");
  CHECK(named->port == 4001);
}

TEST_CASE("launch env: Slurm's first node hosts the root; node lists", "[launch]") {
  FakeEnv env{{{"SLURM_PROCID", "5"},
               {"SLURM_NTASKS", "8"},
               {"SLURM_LOCALID", "1"},
               {"SLURM_JOB_ID", "42"},
               {"SLURM_STEP_ID", "0"},
               {"SLURM_STEP_NODELIST", "gpu[007-009,12],login1"}}};
  auto le = read_launch_env(env.lookup());
  REQUIRE(le.ok());
  CHECK(le->launcher == "Slurm");
  CHECK(le->rank == 5);
  CHECK(le->nranks == 8);
  CHECK(le->local_rank == 1);
  CHECK(le->root_host == "gpu007");

  CHECK(*first_slurm_host("node1") == "node1");
  CHECK(*first_slurm_host("a,b") == "a");
  CHECK(*first_slurm_host("rack[2-3]-n[1-4]") == "rack2-n[1-4]");
  CHECK(*first_slurm_host("n[10]x,m") == "n10x");
  CHECK_FALSE(first_slurm_host("").ok());
  CHECK_FALSE(first_slurm_host("[1-2]").ok());
  CHECK_FALSE(first_slurm_host("n[a-b]").ok());

  // Without a job id and a port there is nothing to agree on.
  env.vars.erase("SLURM_JOB_ID");
  env.vars.erase("SLURM_STEP_ID");
  auto no_port = read_launch_env(env.lookup());
  REQUIRE_FALSE(no_port.ok());
  CHECK_THAT(no_port.status().message(), Catch::Contains("CHORUS_RENDEZVOUS_PORT"));
  env.vars["CHORUS_RENDEZVOUS_PORT"] = "31000";
  env.vars["CHORUS_RENDEZVOUS_ADDR"] = "192.0.2.9";
  auto overridden = read_launch_env(env.lookup());
  REQUIRE(overridden.ok());
  CHECK(overridden->port == 31000);
  CHECK(overridden->root_host == "192.0.2.9");
}

TEST_CASE("launch env: chosen in order, malformed variables named", "[launch]") {
  // mpirun inside a Slurm allocation: Open MPI's ranks, not the allocation's.
  FakeEnv both{{{"OMPI_COMM_WORLD_RANK", "0"},
                {"OMPI_COMM_WORLD_SIZE", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                {"PMIX_NAMESPACE", "x"},
                {"SLURM_PROCID", "0"},
                {"SLURM_NTASKS", "1"},
                {"SLURM_JOB_ID", "1"}}};
  CHECK(read_launch_env(both.lookup())->launcher == "Open MPI");

  FakeEnv none;
  auto missing = read_launch_env(none.lookup());
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == Code::kInvalidUsage);
  CHECK_THAT(missing.status().message(), Catch::Contains("no launcher found"));

  FakeEnv bad = torchrun(0);
  bad.vars["RANK"] = "4";
  auto r = read_launch_env(bad.lookup());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("RANK=4"));
  bad = torchrun(0);
  bad.vars["MASTER_PORT"] = "http";
  CHECK_THAT(read_launch_env(bad.lookup()).status().message(), Catch::Contains("MASTER_PORT=http"));
  bad = torchrun(0);
  bad.vars["WORLD_SIZE"] = "-2";
  CHECK_THAT(read_launch_env(bad.lookup()).status().message(), Catch::Contains("WORLD_SIZE=-2"));
}

TEST_CASE("launch env: the job secret keys the rendezvous", "[launch]") {
  FakeEnv env;
  bool given = true;
  auto open = job_secret(env.lookup(), "job A", &given);
  REQUIRE(open.ok());
  CHECK_FALSE(given);
  CHECK(*job_secret(env.lookup(), "job A", &given) == *open);
  CHECK_FALSE(*job_secret(env.lookup(), "job B", &given) == *open);

  env.vars["CHORUS_JOB_SECRET"] = "s3cret";
  auto keyed = job_secret(env.lookup(), "job A", &given);
  REQUIRE(keyed.ok());
  CHECK(given);
  CHECK_FALSE(*keyed == *open);

  // The same secret from a file (its trailing newline is not part of it).
  char path[] = "/tmp/chorus-secret-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, "s3cret\n", 7) == 7);
  close(fd);
  FakeEnv from_file{{{"CHORUS_JOB_SECRET_FILE", path}}};
  auto filed = job_secret(from_file.lookup(), "job A", &given);
  REQUIRE(filed.ok());
  CHECK(*filed == *keyed);
  std::remove(path);
  auto gone = job_secret(from_file.lookup(), "job A", &given);
  REQUIRE_FALSE(gone.ok());
  CHECK_THAT(gone.status().message(), Catch::Contains("CHORUS_JOB_SECRET_FILE="));
}
