/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/stream.h
 * Host streams: the cudaStream_t that Chorus collectives take, without a GPU.
 *
 * A host stream is an ordered queue of work. A collective given a host stream returns as soon
 * as it is queued; Chorus's progress engine runs the stream's operations one after another, in
 * issue order, asynchronously to the caller (operations on different streams may run
 * concurrently, but the operations of one communicator always run in the order they were
 * issued, as NCCL requires). The NULL stream is synchronous: a call returns when its operation
 * is complete.
 *
 * A failed operation fails the operations queued behind it on the same stream; the first error
 * is reported by chorusStreamSynchronize / chorusStreamQuery, with the message available from
 * ncclGetLastError(NULL).
 *
 * Thread safety: a stream may be used from several threads; its order is the order in which
 * the enqueueing calls returned.
 */
#ifndef CHORUS_STREAM_H_
#define CHORUS_STREAM_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef cudaStream_t chorusStream_t;

/* Creates a host stream. ncclInvalidArgument if stream is NULL. */
ncclResult_t chorusStreamCreate(chorusStream_t* stream);

/* Waits for the stream's work (bounded by CHORUS_TIMEOUT_MS of no progress) and destroys it.
 * Returns the first error the stream's work met, if any. */
ncclResult_t chorusStreamDestroy(chorusStream_t stream);

/* Blocks until every operation queued on the stream so far has completed; the calling thread
 * helps to drive them. Returns ncclSuccess, or the first error met by the stream's work. */
ncclResult_t chorusStreamSynchronize(chorusStream_t stream);

/* Non-blocking: ncclSuccess when everything queued has completed, ncclInProgress while work is
 * pending, or the first error met by the stream's work. */
ncclResult_t chorusStreamQuery(chorusStream_t stream);

/* Queues fn(arg) on the stream: it runs on Chorus's progress thread once everything queued
 * before it has completed, and must not call Chorus. */
typedef void (*chorusHostFn_t)(void* arg);
ncclResult_t chorusLaunchHostFunc(chorusStream_t stream, chorusHostFn_t fn, void* arg);

/* Host events (cudaEvent_t without a GPU): an event marks the work queued on a stream up to the
 * moment it is recorded, so one stream (or the host) can wait for part of another's work.
 *   chorusEventRecord(event, stream)   captures the work queued on `stream` so far (the NULL
 *                                      stream: nothing; recording again replaces the capture)
 *   chorusEventQuery(event)            ncclSuccess once that work has completed (an event never
 *                                      recorded is complete), ncclInProgress before, or the
 *                                      work's error once it failed
 *   chorusEventSynchronize(event)      blocks until that work has completed (the calling thread
 *                                      helps to drive it); its error, if it failed
 *   chorusStreamWaitEvent(stream, ev)  work queued on `stream` after this call starts once the
 *                                      event's work has completed; if that work failed, the
 *                                      stream fails too (the NULL stream: the call blocks)
 * Destroying an event whose work is pending is allowed; streams waiting for it still wait. */
typedef struct chorusEvent* chorusEvent_t;
ncclResult_t chorusEventCreate(chorusEvent_t* event);
ncclResult_t chorusEventDestroy(chorusEvent_t event);
ncclResult_t chorusEventRecord(chorusEvent_t event, chorusStream_t stream);
ncclResult_t chorusEventQuery(chorusEvent_t event);
ncclResult_t chorusEventSynchronize(chorusEvent_t event);
ncclResult_t chorusStreamWaitEvent(chorusStream_t stream, chorusEvent_t event);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_STREAM_H_ */
