// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/world.cc
// Launcher detection and unique-id distribution. MPI is optional at build time
// (CHORUS_BENCH_HAVE_MPI); without mpirun's environment it is never initialised.
#include "bench/coll/world.h"

#include <chorus/launch.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#if CHORUS_BENCH_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace chorus::bench {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// Open MPI's mpirun, then PMI launchers (MPICH's hydra, Slurm).
const char* mpi_size_variable() {
  if (env("OMPI_COMM_WORLD_SIZE")) return "OMPI_COMM_WORLD_SIZE";
  if (env("PMI_SIZE")) return "PMI_SIZE";
  return nullptr;
}

std::string last_error(const char* what, ncclResult_t r) {
  return fmt::format("{} failed: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr));
}

JoinedWorld join_chorus_run() {
  JoinedWorld j;
  j.world.launcher = Launcher::kChorusRun;
  ncclResult_t r = chorusLaunchInfo(&j.world.id, &j.world.proc, &j.world.nprocs);
  if (r != ncclSuccess) j.error = last_error("chorusLaunchInfo", r);
  return j;
}

// torchrun (env://) or srun without MPI: the id every process derives from the launcher's
// environment (chorusUniqueIdFromEnv; process 0 serves the rendezvous).
JoinedWorld join_from_env() {
  JoinedWorld j;
  j.world.launcher = Launcher::kEnv;
  ncclResult_t r = chorusUniqueIdFromEnv(&j.world.id, &j.world.proc, &j.world.nprocs);
  if (r != ncclSuccess) j.error = last_error("chorusUniqueIdFromEnv", r);
  return j;
}

// torchrun's variables, or Slurm's without PMI (srun --mpi=none, the default).
bool env_launcher() {
  if (env("RANK") && env("WORLD_SIZE") && env("MASTER_ADDR") && env("MASTER_PORT")) return true;
  return env("SLURM_PROCID") && env("SLURM_NTASKS");
}

JoinedWorld join_single() {
  JoinedWorld j;
  ncclResult_t r = ncclGetUniqueId(&j.world.id);
  if (r != ncclSuccess) j.error = last_error("ncclGetUniqueId", r);
  return j;
}

#if CHORUS_BENCH_HAVE_MPI
JoinedWorld join_mpi(int* argc, char*** argv) {
  JoinedWorld j;
  j.world.launcher = Launcher::kMpi;
  if (MPI_Init(argc, argv) != MPI_SUCCESS) {
    j.error = "MPI_Init failed";
    return j;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &j.world.proc);
  MPI_Comm_size(MPI_COMM_WORLD, &j.world.nprocs);
  // Process 0 creates the id; the status travels with it so that a failure stops everyone.
  struct {
    ncclUniqueId id;
    int status;
  } message{};
  if (j.world.proc == 0) {
    ncclResult_t r = ncclGetUniqueId(&message.id);
    message.status = static_cast<int>(r);
    if (r != ncclSuccess) j.error = last_error("ncclGetUniqueId", r);
  }
  if (MPI_Bcast(&message, sizeof(message), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    j.error = "MPI_Bcast of the unique id failed";
    return j;
  }
  if (message.status != 0 && j.error.empty()) j.error = "process 0 could not create the unique id";
  j.world.id = message.id;
  return j;
}
#else
JoinedWorld join_mpi(int*, char***) {
  const char* variable = mpi_size_variable();
  if (std::strcmp(env(variable), "1") == 0) return join_single();
  // Open MPI's variables are enough to meet without MPI itself.
  if (std::strcmp(variable, "OMPI_COMM_WORLD_SIZE") == 0) return join_from_env();
  JoinedWorld j;
  j.error = fmt::format(
      "started by an MPI launcher ({}={}) but built without MPI: use chorus-run -n N, or -t N, "
      "or rebuild with Open MPI's development files installed",
      variable, env(variable));
  return j;
}
#endif

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::kSingle: return "single process";
    case Launcher::kChorusRun: return "chorus-run";
    case Launcher::kMpi: return "mpirun";
    case Launcher::kEnv: return "torchrun or srun";
  }
  return "?";
}

bool built_with_mpi() { return CHORUS_BENCH_HAVE_MPI != 0; }

JoinedWorld join_world(int* argc, char*** argv) {
  if (env("CHORUS_UNIQUE_ID")) return join_chorus_run();
  if (mpi_size_variable() != nullptr) return join_mpi(argc, argv);
  if (env_launcher()) return join_from_env();
  return join_single();
}

void leave_world(const World& world, bool failed) {
#if CHORUS_BENCH_HAVE_MPI
  if (world.launcher != Launcher::kMpi) return;
  if (failed) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  } else {
    MPI_Finalize();
  }
#else
  (void)world;
  (void)failed;
#endif
}

bool first_process_by_environment() {
  for (const char* name : {"CHORUS_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"}) {
    const char* v = env(name);
    if (v != nullptr) return std::strcmp(v, "0") == 0;
  }
  return true;
}

}  // namespace chorus::bench
