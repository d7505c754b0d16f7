// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/launch_env.h
// Who started this process, read from the launcher's environment, so that ranks agree on a
// unique id without anyone handing it round (chorusCommInitFromEnv, include/chorus/launch.h).
//
// Every rank derives the same id from the job: the root's address (where rank 0 listens), a
// secret (from the job secret, else from the job's identity alone) and a communicator uid.
// Rank 0 starts the bootstrap root there; the others connect to it, retrying until it listens
// or CHORUS_BOOTSTRAP_TIMEOUT_MS passes. Launchers, first match wins:
//   torchrun, or any env:// style start: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//       (LOCAL_RANK); the root listens on MASTER_PORT + 1, since torchrun's agent holds
//       MASTER_PORT itself;
//   Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; root at
//       MASTER_ADDR if set, else 127.0.0.1 when every rank shares one host (an error
//       otherwise: mpirun names no address the ranks could meet at);
//   Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; root on the first node of
//       SLURM_STEP_NODELIST (the node of task 0), or MASTER_ADDR.
// CHORUS_RENDEZVOUS_ADDR and CHORUS_RENDEZVOUS_PORT override the address and port. Without a
// port (no MASTER_PORT), one is derived from the job's id in 20000..29999.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "net/auth.h"

namespace chorus::bootstrap {

struct LaunchEnv {
  std::string launcher;   // "torchrun", "Open MPI", "Slurm"
  int rank = 0;
  int nranks = 1;
  int local_rank = 0;
  std::string root_host;  // a name or numeric address; rank 0's host
  uint16_t port = 0;
  std::string job;        // names the job (launcher, job id, size, root): keys the secret
  std::string source;     // the variables it came from, for messages
};

// Looks a variable up; nullptr when unset (empty counts as unset).
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

// kInvalidUsage when no launcher's variables are there ("no launcher found: ..."), naming
// what was looked for; kInvalidArgument naming the variable when one is malformed (a rank
// outside 0..size-1, a port that is not one, a node list with no host).
Result<LaunchEnv> read_launch_env(const EnvLookup& env);

// The first host of a Slurm node list: "node[07-09,12],gpu1" -> "node07".
Result<std::string> first_slurm_host(std::string_view nodelist);

// The job's secret: a key derived (HMAC-SHA256) from CHORUS_JOB_SECRET, or from the contents of
// CHORUS_JOB_SECRET_FILE (trailing newlines dropped), else from a fixed label (`*secret_given`
// false: the rendezvous is then authenticated only by the job's identity), and then for `job`.
// kInvalidArgument when the file cannot be read or is empty.
Result<net::Secret> job_secret(const EnvLookup& env, std::string_view job, bool* secret_given);

}  // namespace chorus::bootstrap
