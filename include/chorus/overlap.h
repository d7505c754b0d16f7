/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/overlap.h
 * The overlap scheduler: gradient AllReduces issued as the backward pass produces gradients,
 * so that communication runs under the rest of the backward pass.
 *
 * Use:
 *   1. chorusOverlapCreate(comm, &config, &s) on every rank (collective: it splits off a small
 *      communicator of its own for the ranks' agreement);
 *   2. chorusOverlapRegister(s, buf, count, datatype, layer) once per gradient tensor, the same
 *      tensors in the same order on every rank (`layer`: the tensor's position in the forward
 *      pass, 0 first);
 *   3. every step: chorusOverlapReady(s, buf, count, datatype) from whichever thread finished
 *      that gradient; then chorusOverlapWait(s, buf) for one tensor (its reduced values are in
 *      place: the next forward pass may use that layer), or chorusOverlapWaitAll(s);
 *   4. chorusOverlapDestroy(s).
 *
 * How it decides. Tensors larger than partitionBytes are cut into pieces. Every cycleUs the
 * ranks agree (a small AllReduce on the scheduler's own communicator) which pieces are ready on
 * all of them and which reductions have finished on all of them; from the pieces ready
 * everywhere and not yet sent, all ranks build the same buckets: in priority order (the first
 * layers of the forward pass first, as ByteScheduler does) or FIFO (in the order they became
 * ready everywhere, as DDP and Horovod), fused up to bucketBytes (firstBucketBytes for a step's
 * first bucket), and launch them while the bytes in flight stay under creditBytes. A partial
 * bucket goes at the next agreement: it never waits for tensors that are not ready. A bucket
 * whose pieces lie back to back in memory is reduced in place (zero copy); others go through a
 * staging buffer. So ranks may see their gradients ready in any order, from any threads. With
 * `compress`, fp32/bf16/fp16 pieces travel as block-scaled FP8 (<chorus/compress.h>).
 *
 * The communicator passed to chorusOverlapCreate belongs to the scheduler while a step runs:
 * other collectives on it from the caller would interleave with the scheduler's in an order
 * the ranks do not agree on. Use a communicator of its own (ncclCommSplit) for other work.
 *
 * Errors: chorusOverlapReady of a buffer never registered, with another count or datatype than
 * registered, or twice in one step (before the tensor's reduction of the step finished) is
 * ncclInvalidUsage; registering after the first chorusOverlapReady, or a buffer overlapping a
 * registered one, too. A wait for tensors that never become ready ends after CHORUS_TIMEOUT_MS
 * with an error naming them (ncclInvalidUsage for tensors this rank never readied,
 * ncclRemoteError for tensors a peer never readied). A failed reduction or agreement (a dead
 * peer, an aborted communicator) fails every later call with its error. Destroying a scheduler
 * with work in flight waits for that work (bounded by CHORUS_TIMEOUT_MS) and is clean; peers
 * still in the step then fail naming this rank.
 */
#ifndef CHORUS_OVERLAP_H_
#define CHORUS_OVERLAP_H_

#include <chorus/compress.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct chorusOverlap* chorusOverlap_t;

typedef enum {
  chorusOverlapPriority = 0, /* first layers of the forward pass first (the default) */
  chorusOverlapFifo = 1      /* in the order gradients became ready everywhere */
} chorusOverlapPolicy_t;

typedef struct {
  chorusOverlapPolicy_t policy;
  size_t bucketBytes;      /* fusion cap (default 4 MiB) */
  size_t firstBucketBytes; /* cap of a step's first bucket (default 1 MiB) */
  size_t partitionBytes;   /* larger tensors are cut into pieces this large (default 4 MiB;
                              0: never) */
  size_t creditBytes;      /* bytes in flight at most (default 8 MiB; 0: no limit; one bucket
                              may always go) */
  double cycleUs;          /* between two agreements of the ranks (default 1000) */
  ncclRedOp_t op;          /* ncclSum or ncclAvg (the default) */
  /* NULL (the default), or FP8 compression of the fp32, bf16 and fp16 gradients: each piece is
   * reduced by chorusAllReduceCompressed through a compressor of its own (so its error-feedback
   * residual, if configured, follows that piece from step to step); compressed pieces are not
   * fused. The configuration is copied at creation. */
  const chorusCompressConfig_t* compress;
} chorusOverlapConfig_t;

typedef struct {
  uint64_t step;           /* steps completed */
  double commUs;           /* last step: first bucket launched to last bucket finished */
  double exposedUs;        /* last step: time the caller spent in chorusOverlapWait* */
  double hiddenFraction;   /* last step: 1 - exposed / comm, clamped to [0, 1] */
  uint64_t bytes;          /* last step: bytes reduced (per rank) */
  uint64_t buckets;        /* last step: AllReduce calls */
  uint64_t agreements;     /* last step: rounds of agreement */
} chorusOverlapStats_t;

/* Fills the defaults above. */
ncclResult_t chorusOverlapConfigInit(chorusOverlapConfig_t* config);
/* config may be NULL (the defaults). Collective over comm's ranks. */
ncclResult_t chorusOverlapCreate(ncclComm_t comm, const chorusOverlapConfig_t* config,
                                 chorusOverlap_t* scheduler);
ncclResult_t chorusOverlapRegister(chorusOverlap_t scheduler, void* buff, size_t count,
                                   ncclDataType_t datatype, int layer);
ncclResult_t chorusOverlapReady(chorusOverlap_t scheduler, void* buff, size_t count,
                                ncclDataType_t datatype);
ncclResult_t chorusOverlapWait(chorusOverlap_t scheduler, void* buff);
ncclResult_t chorusOverlapWaitAll(chorusOverlap_t scheduler);
ncclResult_t chorusOverlapGetStats(chorusOverlap_t scheduler, chorusOverlapStats_t* stats);
/* The last completed step's buckets as a Chrome trace (JSON, chrome://tracing or Perfetto):
 * one event per bucket from launch to finish, with its layers and bytes. */
ncclResult_t chorusOverlapDumpTrace(chorusOverlap_t scheduler, const char* path);
ncclResult_t chorusOverlapDestroy(chorusOverlap_t scheduler);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_OVERLAP_H_ */
