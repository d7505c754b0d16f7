/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/launch.h
 * Starting ranks without MPI: `chorus-run -n N prog args...` creates a unique id, then starts N
 * copies of prog with CHORUS_UNIQUE_ID (the id in hex), CHORUS_RANK, CHORUS_NRANKS and
 * CHORUS_LOCAL_RANK set (and RANK, WORLD_SIZE, LOCAL_RANK, for torchrun-style programs). If one
 * rank fails or a timeout passes, it stops the others. A program reads its part with
 * chorusLaunchInfo(). Programs started by other launchers (torchrun, mpirun, srun) make their
 * communicator with chorusCommInitFromEnv().
 */
#ifndef CHORUS_LAUNCH_H_
#define CHORUS_LAUNCH_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHORUS_UNIQUE_ID_HEX_BYTES (2 * NCCL_UNIQUE_ID_BYTES + 1)

/* Writes id as 256 lowercase hex digits and a NUL. */
ncclResult_t chorusUniqueIdToHex(const ncclUniqueId* id, char hex[CHORUS_UNIQUE_ID_HEX_BYTES]);

/* Parses 256 hex digits; ncclInvalidArgument if hex is not exactly that. */
ncclResult_t chorusUniqueIdFromHex(const char* hex, ncclUniqueId* id);

/* Reads CHORUS_UNIQUE_ID, CHORUS_RANK and CHORUS_NRANKS. ncclInvalidUsage (with a message for
 * ncclGetLastError) when the process was not started by chorus-run. */
ncclResult_t chorusLaunchInfo(ncclUniqueId* id, int* rank, int* nranks);

/* The job's unique id, from whatever launcher started this process, with no id handed round:
 *   chorus-run      CHORUS_UNIQUE_ID, CHORUS_RANK, CHORUS_NRANKS (as chorusLaunchInfo);
 *   torchrun        RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: rank 0 serves the rendezvous
 *                   on MASTER_ADDR, port MASTER_PORT + 1 (torchrun's agent holds MASTER_PORT);
 *   mpirun          OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE: on MASTER_ADDR, else 127.0.0.1
 *                   when every rank is on one host;
 *   srun            SLURM_PROCID, SLURM_NTASKS: on the first node of SLURM_STEP_NODELIST.
 * CHORUS_RENDEZVOUS_ADDR / CHORUS_RENDEZVOUS_PORT override the address and port (without any
 * port, mpirun and srun jobs derive one from the job id, in 20000..29999). Every process
 * derives the same id; the one of rank 0 starts the bootstrap root there, the others connect to
 * it (retrying until it listens, within CHORUS_BOOTSTRAP_TIMEOUT_MS). The rendezvous is
 * authenticated with the job secret: CHORUS_JOB_SECRET, or the contents of the file named by
 * CHORUS_JOB_SECRET_FILE; without either, only the job's identity (launcher, job id, address)
 * keys it, which keeps jobs apart but does not keep out whoever can read the job's environment.
 * Call it once per communicator, in the same order in every process: each call makes a new id
 * (under chorus-run, whose one id serves one communicator, every call returns that id).
 * ncclInvalidUsage when no launcher's environment is found; ncclInvalidArgument naming the
 * variable when one is malformed; ncclSystemError when rank 0 cannot listen there. */
ncclResult_t chorusUniqueIdFromEnv(ncclUniqueId* id, int* rank, int* nranks);

/* chorusUniqueIdFromEnv, then ncclCommInitRankConfig(comm, nranks, id, rank, config): one call
 * makes the job's communicator under torchrun, mpirun, srun or chorus-run. config may be NULL. */
ncclResult_t chorusCommInitFromEnv(ncclComm_t* comm, ncclConfig_t* config);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_LAUNCH_H_ */
