// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/launch_env.cc
#include "bootstrap/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/bytes.h"
#include "common/params.h"

namespace chorus::bootstrap {

namespace {

Result<int64_t> int_var(const EnvLookup& env, const char* name, int64_t lo, int64_t hi) {
  const char* v = env(name);
  int64_t x = 0;
  if (v == nullptr || !params::parse_int(v, &x) || x < lo || x > hi)
    return invalid_argument("{}={} is not an integer in {}..{}", name, v ? v : "(unset)", lo, hi);
  return x;
}

Result<uint16_t> port_var(const EnvLookup& env, const char* name) {
  CHORUS_ASSIGN_OR_RETURN(int64_t p, int_var(env, name, 1, 65535));
  return static_cast<uint16_t>(p);
}

// rank, size and local rank from three variables; size from `size_name`.
Status read_ranks(const EnvLookup& env, const char* rank_name, const char* size_name,
                  const char* local_name, LaunchEnv* out) {
  CHORUS_ASSIGN_OR_RETURN(int64_t n, int_var(env, size_name, 1, 1 << 24));
  CHORUS_ASSIGN_OR_RETURN(int64_t r, int_var(env, rank_name, 0, n - 1));
  out->nranks = static_cast<int>(n);
  out->rank = static_cast<int>(r);
  out->local_rank = 0;
  if (local_name != nullptr && env(local_name) != nullptr) {
    CHORUS_ASSIGN_OR_RETURN(int64_t l, int_var(env, local_name, 0, n - 1));
    out->local_rank = static_cast<int>(l);
  }
  return Status();
}

// A port from the job's id when the launcher names none: 20000..29999.
uint16_t derived_port(std::string_view job_id) {
  return static_cast<uint16_t>(20000 + fnv1a(job_id) % 10000);
}

}  // namespace

EnvLookup process_env() {
  return [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
}

Result<std::string> first_slurm_host(std::string_view list) {
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']') --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  std::string_view first = list.substr(0, end);
  size_t open = first.find('[');
  if (open == std::string_view::npos) {
    if (first.empty()) return invalid_argument("node list '{}' names no host", list);
    return std::string(first);
  }
  size_t close = first.find(']', open);
  if (open == 0 || close == std::string_view::npos)
    return invalid_argument("node list '{}' is not prefix[ranges]", list);
  // The first number of the first range, zero padding kept: "07-09,12" -> "07".
  std::string_view ranges = first.substr(open + 1, close - open - 1);
  size_t digits = 0;
  while (digits < ranges.size() && ranges[digits] >= '0' && ranges[digits] <= '9') ++digits;
  if (digits == 0) return invalid_argument("node list '{}' has no number in its brackets", list);
  return std::string(first.substr(0, open)) + std::string(ranges.substr(0, digits)) +
         std::string(first.substr(close + 1));
}

Result<LaunchEnv> read_launch_env(const EnvLookup& env) {
  LaunchEnv le;
  std::string job_id;
  bool port_known = false;
  if (env("RANK") && env("WORLD_SIZE") && env("MASTER_ADDR") && env("MASTER_PORT")) {
    le.launcher = "torchrun";
    le.source = "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT";
    CHORUS_RETURN_IF_ERROR(read_ranks(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", &le));
    le.root_host = env("MASTER_ADDR");  // the port: MASTER_PORT + 1, below
    job_id = env("TORCHELASTIC_RUN_ID") ? env("TORCHELASTIC_RUN_ID") : "";
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    le.launcher = "Open MPI";
    le.source = "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE";
    CHORUS_RETURN_IF_ERROR(read_ranks(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                      "OMPI_COMM_WORLD_LOCAL_RANK", &le));
    for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"})
      if (env(name)) {
        job_id = env(name);
        break;
      }
    if (env("MASTER_ADDR")) {
      le.root_host = env("MASTER_ADDR");
    } else {
      const char* local_size = env("OMPI_COMM_WORLD_LOCAL_SIZE");
      if (local_size == nullptr || std::strcmp(local_size, env("OMPI_COMM_WORLD_SIZE")) != 0)
        return invalid_usage(
            "started by mpirun on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE={} of "
            "OMPI_COMM_WORLD_SIZE={}): set MASTER_ADDR to the host of rank 0 (and MASTER_PORT or "
            "CHORUS_RENDEZVOUS_PORT), e.g. mpirun -x MASTER_ADDR=host0 ...",
            local_size ? local_size : "(unset)", env("OMPI_COMM_WORLD_SIZE"));
      le.root_host = "127.0.0.1";
    }
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    le.launcher = "Slurm";
    le.source = "SLURM_PROCID, SLURM_NTASKS";
    CHORUS_RETURN_IF_ERROR(read_ranks(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", &le));
    job_id = std::string(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "") + "." +
             (env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
    if (env("MASTER_ADDR")) {
      le.root_host = env("MASTER_ADDR");
    } else {
      const char* list_name = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_NODELIST";
      const char* list = env(list_name);
      if (list == nullptr)
        return invalid_usage("started by srun without SLURM_STEP_NODELIST or SLURM_NODELIST: set "
                             "MASTER_ADDR to the host of task 0");
      auto host = first_slurm_host(list);
      if (!host.ok())
        return invalid_argument("{}: {}", list_name, host.status().message());
      le.root_host = *host;
    }
  } else {
    return invalid_usage(
        "no launcher found in the environment: expected chorus-run's CHORUS_UNIQUE_ID, "
        "torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Open MPI's OMPI_COMM_WORLD_RANK/"
        "SIZE or Slurm's SLURM_PROCID/SLURM_NTASKS");
  }
  // Every launcher: torchrun's agent holds MASTER_PORT itself, so the root takes the next one.
  if (env("MASTER_PORT")) {
    CHORUS_ASSIGN_OR_RETURN(uint16_t master_port, port_var(env, "MASTER_PORT"));
    if (master_port == 65535) return invalid_argument("MASTER_PORT=65535 leaves no port above it");
    le.port = static_cast<uint16_t>(master_port + 1);
    port_known = true;
  }
  if (env("CHORUS_RENDEZVOUS_ADDR")) le.root_host = env("CHORUS_RENDEZVOUS_ADDR");
  if (env("CHORUS_RENDEZVOUS_PORT")) {
    CHORUS_ASSIGN_OR_RETURN(le.port, port_var(env, "CHORUS_RENDEZVOUS_PORT"));
    port_known = true;
  }
  if (!port_known) {
    if (job_id.empty() || job_id == ".")
      return invalid_usage("{} names no job id to derive a rendezvous port from: set "
                           "CHORUS_RENDEZVOUS_PORT (or MASTER_PORT)", le.launcher);
    le.port = derived_port(job_id);
  }
  // Not the size: a rank that disagrees on it should hear so from the root, not fail to
  // authenticate.
  le.job = fmt::format("{} job '{}', root {}:{}", le.launcher, job_id, le.root_host, le.port);
  return le;
}

Result<net::Secret> job_secret(const EnvLookup& env, std::string_view job, bool* secret_given) {
  std::string text;
  *secret_given = true;
  if (const char* s = env("CHORUS_JOB_SECRET")) {
    text = s;
  } else if (const char* path = env("CHORUS_JOB_SECRET_FILE")) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return invalid_argument("CHORUS_JOB_SECRET_FILE={}: cannot read it ({})", path,
                                     std::strerror(errno));
    std::ostringstream contents;
    contents << in.rdbuf();
    text = contents.str();
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (text.empty()) return invalid_argument("CHORUS_JOB_SECRET_FILE={} is empty", path);
  } else {
    *secret_given = false;
    text = "chorus: no job secret";
  }
  net::Secret base;  // all zero: HMAC with a known key, as a keyed hash of the text
  return base.derive("chorus job secret " + text).derive(job);
}

}  // namespace chorus::bootstrap
