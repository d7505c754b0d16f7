/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/launch.h
 * Starting ranks without MPI: `chorus-run -n N prog args...` creates a unique id, then starts N
 * copies of prog with CHORUS_UNIQUE_ID (the id in hex), CHORUS_RANK, CHORUS_NRANKS and
 * CHORUS_LOCAL_RANK set (and RANK, WORLD_SIZE, LOCAL_RANK, for torchrun-style programs). If one
 * rank fails or a timeout passes, it stops the others. A program reads its part with
 * chorusLaunchInfo().
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_LAUNCH_H_ */
