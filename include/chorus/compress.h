/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/compress.h
 * FP8 gradient compression: AllReduce, ReduceScatter and AllGather of fp32, bf16 or fp16 data
 * whose messages travel as block-scaled FP8 (OCP E4M3 or E5M2, one scale per block of
 * `blockSize` elements), about 26 % of the bytes of fp32.
 *
 * AllReduce quantizes each value twice, whatever the number of ranks: every rank sends shard j
 * of its input, quantized, straight to rank j, which adds the n - 1 decoded shards to its own
 * (exact) shard in fp32, quantizes the sum once and sends it to every rank; every rank decodes
 * the same bytes, so all ranks end with bitwise identical results. ReduceScatter is the first
 * half (one quantization), AllGather quantizes each block once (its owner's copy included, so
 * again every rank holds the same result).
 *
 * A compressor carries the codec settings and, with error feedback, a residual: what
 * quantization dropped from this rank's data in the last call, added to the data before the
 * next quantization. The residual belongs to one tensor (one gradient bucket): the first call
 * binds it to its collective, count, datatype and communicator, and later calls must match
 * (ncclInvalidUsage otherwise; chorusCompressorReset unbinds). Calls using one compressor run
 * one at a time: queue them on one stream, or wait between them (ncclInvalidUsage when two
 * run at once).
 *
 * The same path without code changes: CHORUS_COMPRESS=FP8_E4M3 (or FP8_E5M2) makes plain
 * ncclAllReduce / ncclReduceScatter of fp32, bf16 and fp16 with Sum, Avg, Max or Min compress
 * when the tuner predicts it is faster (CHORUS_COMPRESS_POLICY=always: whenever allowed) and
 * the buffer holds at least CHORUS_COMPRESS_MIN_BYTES; see the README.
 */
#ifndef CHORUS_COMPRESS_H_
#define CHORUS_COMPRESS_H_

#include <stddef.h>

#include <nccl.h>
#include <chorus/stream.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { chorusFp8E4M3 = 0, chorusFp8E5M2 = 1 } chorusCompressFormat_t;
/* One scale per block: an fp32 (4 bytes) or a power of two stored as one byte (UE8M0). */
typedef enum { chorusScaleFloat32 = 0, chorusScaleUe8m0 = 1 } chorusScaleKind_t;
typedef enum { chorusRoundNearestEven = 0, chorusRoundStochastic = 1 } chorusRounding_t;
/* Always: every call compresses. Auto: a call compresses only where the tuner's cost model
 * (which includes the codec's measured speed) predicts it is faster than the plain collective,
 * e.g. never over shared memory; the result is then exact. */
typedef enum { chorusCompressAlways = 0, chorusCompressAuto = 1 } chorusCompressPolicy_t;

typedef struct {
  size_t size; /* sizeof(chorusCompressConfig_t): set by CHORUS_COMPRESS_CONFIG_INIT */
  chorusCompressFormat_t format;
  unsigned int blockSize; /* elements per scale, 1 .. 65536; 128 as DeepEP */
  chorusScaleKind_t scaleKind;
  chorusRounding_t rounding;
  int errorFeedback;       /* 1: keep a residual (see above) */
  unsigned long long seed; /* stochastic rounding: calls draw from (seed, call number, rank) */
  chorusCompressPolicy_t policy;
} chorusCompressConfig_t;

#define CHORUS_COMPRESS_CONFIG_INIT                                                          \
  {                                                                                          \
    sizeof(chorusCompressConfig_t), chorusFp8E4M3, 128, chorusScaleFloat32,                \
        chorusRoundNearestEven, 0, 0ULL, chorusCompressAlways                                \
  }

typedef struct chorusCompressor* chorusCompressor_t;

/* A compressor with `config` (NULL: the defaults above). ncclInvalidArgument names a bad
 * field. */
ncclResult_t chorusCompressorCreate(const chorusCompressConfig_t* config,
                                    chorusCompressor_t* compressor);
/* Releases the handle; calls already queued keep what they need. */
ncclResult_t chorusCompressorDestroy(chorusCompressor_t compressor);
/* Zeroes and unbinds the error-feedback residual (a new tensor, or after a skipped step). Not
 * while a call using the compressor is queued or running (ncclInvalidUsage). */
ncclResult_t chorusCompressorReset(chorusCompressor_t compressor);

/* As ncclAllReduce / ncclReduceScatter / ncclAllGather, through `compressor`. Datatypes
 * ncclFloat32, ncclBfloat16, ncclFloat16; ops ncclSum, ncclAvg, ncclMax, ncclMin (anything
 * else, an integer type included: ncclInvalidArgument saying why). In place or not. */
ncclResult_t chorusAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op,
                                       chorusCompressor_t compressor, ncclComm_t comm,
                                       cudaStream_t stream);
ncclResult_t chorusReduceScatterCompressed(const void* sendbuff, void* recvbuff,
                                           size_t recvcount, ncclDataType_t datatype,
                                           ncclRedOp_t op, chorusCompressor_t compressor,
                                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t chorusAllGatherCompressed(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, chorusCompressor_t compressor,
                                       ncclComm_t comm, cudaStream_t stream);

/* Bytes a communicator moved to or from one peer, counted as its operations post them:
 * `wire` what crossed the transport, `data` what those bytes stand for uncompressed (equal to
 * wire for uncompressed transfers). */
typedef struct {
  unsigned long long wireBytesSent;
  unsigned long long wireBytesReceived;
  unsigned long long dataBytesSent;
  unsigned long long dataBytesReceived;
} chorusByteCounters_t;

/* The counters of `comm` towards `peer`, or summed over all peers when peer is -1. */
ncclResult_t chorusCommGetByteCounters(ncclComm_t comm, int peer, chorusByteCounters_t* counters);
/* Zeroes every counter of `comm` (not while operations are in flight on it, or they count
 * partly). */
ncclResult_t chorusCommResetByteCounters(ncclComm_t comm);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_COMPRESS_H_ */
