// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/world.h
// Which processes take part and the job's one ncclUniqueId: from chorus-run's environment
// (chorusLaunchInfo), from mpirun (MPI_Init, then MPI_Bcast of the id from process 0; nothing
// else uses MPI), from torchrun's or srun's environment (chorusUniqueIdFromEnv), or a single
// process that creates the id itself.
#pragma once

#include <nccl.h>

#include <string>

namespace chorus::bench {

enum class Launcher { kSingle, kChorusRun, kMpi, kEnv };
const char* launcher_name(Launcher l);

struct World {
  Launcher launcher = Launcher::kSingle;
  int proc = 0;    // this process's index
  int nprocs = 1;  // processes in the job
  ncclUniqueId id{};
};

struct JoinedWorld {
  World world;
  std::string error;  // non-empty: the job cannot start
};

// Finds how this process was started and obtains the unique id (creating it in process 0
// when no launcher did). Call once, from main, before any rank thread starts.
JoinedWorld join_world(int* argc, char*** argv);

// Ends the job for this process: MPI_Finalize, or MPI_Abort when `failed` (so that mpirun
// stops the other processes at once). No-op without MPI.
void leave_world(const World& world, bool failed);

// Whether this process is, judging by the launchers' environment, the job's first (so that
// command-line errors are printed once, before any launcher is contacted).
bool first_process_by_environment();

// Whether the tools were built with MPI support.
bool built_with_mpi();

}  // namespace chorus::bench
