/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/chorus.h
 * Chorus's own API beside nccl.h: version and the extension headers. Everything here is
 * prefixed chorus; nothing Chorus adds uses the nccl prefix.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <nccl.h>
#include <chorus/stream.h>
#include <chorus/compress.h>
#include <chorus/paths.h>

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* Stores CHORUS_VERSION_CODE of the library (not of the header). */
ncclResult_t chorusGetVersion(int* version);

/* A static string describing the library build: version, git revision, kernels, transports. */
const char* chorusBuildInfo(void);

/* The flight recorder of a communicator, as text: its last CHORUS_FLIGHT_RECORDER_OPS
 * operations, oldest first, each with its id, state (queued, running, done, FAILED), the call
 * (collective, sequence number, count, datatype, op, root, or the peers of a send/receive
 * group), bytes, timing, and for a running or failed one the peers it is still waiting for and
 * why it failed. Chorus also logs it (WARN) when an operation times out or fails and when a
 * communicator with work in flight is aborted. Works on failed and aborting communicators.
 * Writes at most `size` bytes including a terminating NUL into `buffer` (which may be NULL when
 * `size` is 0) and the full length including the NUL into `*needed` (if not NULL). */
ncclResult_t chorusCommDumpFlightRecorder(ncclComm_t comm, char* buffer, size_t size,
                                          size_t* needed);

/* How long an operation of `comm` (a collective, a send/receive group, a stream's work) may
 * make no progress before it fails with ncclRemoteError naming the peers it waits for, and the
 * communicator with it. It starts as CHORUS_TIMEOUT_MS (300000); communicators split or shrunk
 * from `comm` later start with its value. Any thread may change it at any time: waits in
 * progress use the new value from their next check. timeoutMs < 1 is ncclInvalidArgument.
 * (Framework backends set it from their process group's timeout.) */
ncclResult_t chorusCommSetTimeout(ncclComm_t comm, int64_t timeoutMs);
ncclResult_t chorusCommGetTimeout(ncclComm_t comm, int64_t* timeoutMs);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_CHORUS_H_ */
