/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/ep.h
 * MoE expert parallelism: DeepEP-style dispatch and combine of tokens between the ranks that
 * hold the experts (DeepEP's "normal" mode, on host memory).
 *
 * Experts. numExperts experts are split evenly over the communicator's nranks ranks
 * (numExperts % nranks == 0): rank r holds experts [r * L, (r + 1) * L), L = numExperts / nranks,
 * its "local" experts 0 .. L-1. Each token picks up to topk experts: topkIdx[t * topk + k] is an
 * expert in [0, numExperts) or -1 (an unused slot: a token may have fewer than topk experts).
 *
 * Use (the names follow DeepEP's Buffer):
 *   1. chorusEpBufferSizeHint(nranks, maxTokens, hidden, topk, &bytes), then
 *      chorusEpBufferCreate(comm, bytes, &buffer) on every rank;
 *   2. per MoE layer: chorusEpGetDispatchLayout (optional: dispatch computes the layout itself
 *      when given none), chorusEpDispatch -> the tokens this rank's experts must process, and a
 *      handle; the caller runs its experts on them, weights each expert's output by the received
 *      topk weight and sums them per received token; chorusEpCombine(handle) sends those sums
 *      back, where they are added up per token at its source rank: the token's weighted sum of
 *      expert outputs;
 *   3. chorusEpHandleDestroy(handle) when no combine needs it any more; chorusEpBufferDestroy.
 *
 * Layouts (row-major, C order; "token" = row):
 *   x               [numTokens, hidden] of the dispatch datatype
 *   xScales         FP8 only: [numTokens, hidden / 128] float, the scale of each 128 channels
 *                   (value = fp8 code decoded * scale); FP8 requires hidden % 128 == 0
 *   topkIdx         [numTokens, topk] int64; topkWeights [numTokens, topk] float
 *   numTokensPerRank [nranks]: tokens with at least one expert on the rank (each token counts
 *                   once per rank, however many of its experts the rank holds)
 *   numTokensPerExpert [numExperts]: tokens routed to each expert (per slot)
 *   isTokenInRank   [numTokens, nranks] uint8: 1 iff the token has an expert on the rank
 *   recvX ...       [numRecvTokens, ...]: every token that has an expert on this rank, exactly
 *                   once, ordered by source rank, then by token index at the source (DeepEP's
 *                   order); recvTopkIdx holds the token's experts as local expert indices
 *                   (0 .. L-1) and -1 for slots not on this rank; recvTopkWeights the weights of
 *                   the local slots and 0 for the others
 *   numRecvTokensPerExpert [L]: received (token, slot) pairs per local expert, each rounded up to
 *                   a multiple of expertAlignment
 *
 * Data and numbers. Dispatch moves token bytes unchanged: FP32 and BF16 rows, or FP8 E4M3 rows
 * with their scales, arrive bit for bit. Combine takes FP32 or BF16 rows (whatever the dispatch
 * datatype was); each token's rows from the ranks it went to are added in float, in ascending
 * rank order, and the sum is rounded once to the datatype. So results are deterministic and
 * identical for identical inputs.
 *
 * Data path. The buffer's staging memory is shared with the buffer's peers on the same host:
 * a sender writes each token straight from x into the receiving rank's buffer (and combine each
 * result row straight from its x into the source rank's buffer), one copy, no pack / AlltoAll /
 * unpack; the receiver copies from there into its outputs. Tokens for other hosts go through
 * the communicator's transports (TCP, UCX, verbs), each token once per destination host (not
 * once per rank): one rank there receives it and writes it into the buffers of the ranks of
 * its host that hold its experts (senders are spread over a host's ranks). Combine results
 * travel back per rank. CHORUS_EP_MAP=0, or a CHORUS_TRANSPORT that
 * forces a transport without shared memory, sends every token through the communicator.
 *
 * Calls are blocking and collective: every rank of the communicator calls chorusEpDispatch (and
 * chorusEpCombine) the same number of times in the same order, each with its own tokens (0 is
 * allowed). A buffer and its handles are used by one thread at a time, and the communicator
 * carries no other work during a call. Every argument is checked, and the ranks agree on the
 * verdict before any token moves: a call refused on one rank is refused on every rank (the
 * others return ncclInvalidArgument naming the refusing ranks), nothing was sent, and the
 * buffer and communicator are usable afterwards. Exception: a NULL or dead buffer handle is
 * refused at once, without communication.
 *
 * Errors: ncclInvalidArgument for an expert index outside [-1, numExperts) (naming the token and
 * slot), numExperts not a multiple of nranks, a hidden size not a multiple of 128 with FP8, a
 * datatype not supported, a layout that does not match topkIdx, more tokens than the buffer
 * allows (naming the size hint needed), outputs too small for what arrives (naming the count
 * needed), a handle of another buffer or a destroyed one. A dead peer fails the call with
 * ncclRemoteError/ncclSystemError naming it (the communicator is then broken, as for any
 * collective). Waits are bounded by the communicator's timeout (CHORUS_TIMEOUT_MS, or
 * chorusCommSetTimeout).
 */
#ifndef CHORUS_EP_H_
#define CHORUS_EP_H_

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct chorusEpBuffer* chorusEpBuffer_t;
typedef struct chorusEpHandle* chorusEpHandle_t;

/* Channels per FP8 scale. */
#define CHORUS_EP_FP8_BLOCK 128

/* Bytes an EP buffer needs so that every dispatch and combine of up to maxTokens tokens per
 * rank, of `hidden` channels (any datatype) and `topk` slots, fits on a communicator of nranks
 * ranks. Local, no communication. */
ncclResult_t chorusEpBufferSizeHint(int nranks, size_t maxTokens, size_t hidden, int topk,
                                    size_t* bytes);

/* An EP buffer of `bytes` staging bytes bound to comm (which must outlive it). Not collective;
 * every rank should use the same size hint. The memory is allocated once, here. */
ncclResult_t chorusEpBufferCreate(ncclComm_t comm, size_t bytes, chorusEpBuffer_t* buffer);

/* Destroys a buffer. Its handles stay valid objects to destroy, but combine refuses them. */
ncclResult_t chorusEpBufferDestroy(chorusEpBuffer_t buffer);

/* DeepEP's get_dispatch_layout: from topkIdx [numTokens, topk] (numTokens may be 0), fills
 * numTokensPerRank [nranks], numTokensPerExpert [numExperts] and isTokenInRank
 * [numTokens, nranks] (each may be NULL: not wanted). Local, no communication. */
ncclResult_t chorusEpGetDispatchLayout(chorusEpBuffer_t buffer, const int64_t* topkIdx,
                                       size_t numTokens, int topk, int numExperts,
                                       int* numTokensPerRank, int* numTokensPerExpert,
                                       uint8_t* isTokenInRank);

typedef struct {
  const void* x;             /* [numTokens, hidden] of datatype (NULL only if numTokens == 0) */
  const float* xScales;      /* FP8: [numTokens, hidden / 128]; NULL for other datatypes */
  ncclDataType_t datatype;   /* ncclFloat32, ncclBfloat16 or ncclFloat8e4m3 */
  size_t numTokens;          /* tokens on this rank; may differ between ranks, may be 0 */
  size_t hidden;             /* channels per token: the same on every rank, > 0 */
  const int64_t* topkIdx;    /* [numTokens, topk] */
  const float* topkWeights;  /* [numTokens, topk], or NULL (weights of 0 are sent) */
  int topk;                  /* 1..1024, the same on every rank */
  int numExperts;            /* a multiple of nranks, the same on every rank */
  /* The layout of chorusEpGetDispatchLayout for these tokens, or all three NULL (isTokenInRank
   * may be NULL with 0 tokens). Given, it is checked against topkIdx. */
  const int* numTokensPerRank;
  const int* numTokensPerExpert;
  const uint8_t* isTokenInRank;
  int expertAlignment;       /* >= 1 (DeepEP's expert_alignment; 1: no rounding) */
} chorusEpDispatchArgs_t;

typedef struct {
  void* recvX;               /* [recvCapacity, hidden] of the dispatch datatype */
  float* recvXScales;        /* FP8: [recvCapacity, hidden / 128]; NULL otherwise */
  int64_t* recvTopkIdx;      /* [recvCapacity, topk], or NULL (not wanted) */
  float* recvTopkWeights;    /* [recvCapacity, topk], or NULL */
  size_t recvCapacity;       /* rows of the arrays above; a rank receives at most the sum of
                                all ranks' numTokens */
  int* numRecvTokensPerExpert; /* [numExperts / nranks], or NULL */
  size_t numRecvTokens;      /* out: rows written */
} chorusEpDispatchOutput_t;

/* DeepEP's dispatch (normal mode): sends each token once to every rank that holds any of its
 * experts, with its topk indices and weights; fills `out` (see the layouts above) and returns
 * in *handle what combine needs to send results back. Blocking, collective. */
ncclResult_t chorusEpDispatch(chorusEpBuffer_t buffer, const chorusEpDispatchArgs_t* args,
                              chorusEpDispatchOutput_t* out, chorusEpHandle_t* handle);

/* DeepEP's combine (normal mode): x [numRecvTokens, hidden] of datatype (ncclFloat32 or
 * ncclBfloat16) holds this rank's result for each token the dispatch of `handle` brought here
 * (in recvX's order); combinedX [numTokens, hidden] of datatype receives, for each token of this
 * rank, the sum of the rows the ranks it went to returned (float accumulation in ascending rank
 * order, one rounding). A token that went nowhere (all slots -1) gets zeros. With topkWeights
 * [numRecvTokens, topk] and combinedTopkWeights [numTokens, topk] (both NULL: no weights; an
 * array of no rows may be NULL), combinedTopkWeights receives the sum per token of the weight
 * rows the same way: the original weights, if recvTopkWeights is passed back. Every rank that
 * has tokens or received some passes weights, or none does. The handle may be combined any
 * number of times. Blocking, collective. */
ncclResult_t chorusEpCombine(chorusEpBuffer_t buffer, chorusEpHandle_t handle, const void* x,
                             ncclDataType_t datatype, const float* topkWeights, void* combinedX,
                             float* combinedTopkWeights);

/* Frees a handle (any time after its dispatch; not during a call using it). */
ncclResult_t chorusEpHandleDestroy(chorusEpHandle_t handle);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_EP_H_ */
