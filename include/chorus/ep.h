/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/ep.h
 * MoE expert parallelism: DeepEP-style dispatch and combine of tokens between the ranks that
 * hold the experts (DeepEP's "normal" mode, on host memory; its low-latency mode further below).
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
 * travel back per rank. The staging area is registered with the communicator where a transport
 * makes registration keys (verbs, UCX): over verbs, dispatch messages of at least
 * CHORUS_IB_RDV_BYTES are RDMA-written straight into the receiver's staging area (zero copy);
 * combine's rows, sent from the caller's x, and smaller messages go through the transport's
 * rings. A blocking call posts its messages to other hosts first and writes the same-host
 * records while they travel. CHORUS_EP_MAP=0, or a CHORUS_TRANSPORT that
 * forces a transport without shared memory, sends every token through the communicator.
 *
 * Calls are collective, and blocking unless queued on a host stream (see "Asynchronous calls"
 * below): every rank of the communicator calls chorusEpDispatch (and
 * chorusEpCombine) the same number of times in the same order, each with its own tokens (0 is
 * allowed). A buffer and its handles are used by one thread at a time, and the communicator
 * carries no other work during a call. Every argument is checked, and the ranks agree on the
 * verdict before any token moves: a call refused on one rank is refused on every rank (the
 * others return ncclInvalidArgument naming the refusing ranks), nothing was sent, and the
 * buffer and communicator are usable afterwards. Exception: a NULL or dead buffer handle is
 * refused at once, without communication.
 *
 * Asynchronous calls (DeepEP's async_finish, on a host stream of include/chorus/stream.h):
 * chorusEpDispatchAsync and chorusEpCombineAsync take a stream. The call itself does what needs
 * every rank now: the routing (topkIdx and the layout are read during the call), the count
 * exchange, the outputs' allocation (out->allocate, if set) and the agreement, so a refused call
 * fails at once as above, and a dispatch returns its handle, out->numRecvTokens and
 * out->numRecvTokensPerExpert (DeepEP's CPU-side counts of received tokens, which it exchanges in
 * its notify_dispatch, as Chorus does). The data movement is queued on the stream, behind the work
 * queued there before: x, xScales and topkWeights are read, and the other outputs written, when the
 * stream gets there. Record an event after the call (chorusEventRecord) to wait for it
 * (chorusEventSynchronize), or make another stream wait for it (chorusStreamWaitEvent), or
 * synchronise the stream; until then the call's arrays must stay valid and untouched. The calling
 * thread is free meanwhile: the tokens are written, forwarded, unpacked and reduced by a thread of
 * the buffer (one per buffer), the messages to other hosts by Chorus's progress thread. A buffer
 * runs one call at a time: any next call on it (of either mode, or its destruction) first waits for
 * the work the previous call queued, so a combine may follow its dispatch at once (it starts when
 * the dispatch's outputs are written). A failure of the queued work (a dead peer, a timeout) is the
 * stream's error, naming the peer. NULL streams make the calls blocking: chorusEpDispatch(...) is
 * chorusEpDispatchAsync(..., NULL).
 *
 * Errors: ncclInvalidArgument for an expert index outside [-1, numExperts) (naming the token and
 * slot), numExperts not a multiple of nranks, a hidden size not a multiple of 128 with FP8, a
 * datatype not supported, a layout that does not match topkIdx, more tokens than the buffer
 * allows (naming the size hint needed), outputs too small for what arrives (naming the count
 * needed), a handle of another buffer or a destroyed one; a failed allocate callback
 * (chorusEpDispatchOutput_t) refuses the call on every rank too. A dead peer fails the call with
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

typedef struct chorusEpDispatchOutput {
  void* recvX;               /* [recvCapacity, hidden] of the dispatch datatype */
  float* recvXScales;        /* FP8: [recvCapacity, hidden / 128]; NULL otherwise */
  int64_t* recvTopkIdx;      /* [recvCapacity, topk], or NULL (not wanted) */
  float* recvTopkWeights;    /* [recvCapacity, topk], or NULL */
  size_t recvCapacity;       /* rows of the arrays above; a rank receives at most the sum of
                                all ranks' numTokens */
  int* numRecvTokensPerExpert; /* [numExperts / nranks], or NULL */
  size_t numRecvTokens;      /* out: rows written */
  /* Optional (NULL: the arrays above are given): allocates the outputs once the number of
   * arriving rows is known, during the call, see below. */
  int (*allocate)(void* allocateCtx, size_t numRecvTokens, struct chorusEpDispatchOutput* out);
  void* allocateCtx;         /* passed to allocate as is */
} chorusEpDispatchOutput_t;

/* Outputs allocated during the call (DeepEP allocates its outputs after its count exchange):
 * with `allocate` set, recvX, recvXScales, recvTopkIdx, recvTopkWeights and recvCapacity are not
 * read on entry (they may be NULL and 0). Instead dispatch calls
 *   allocate(allocateCtx, numRecvTokens, out)
 * once, in the calling thread, after the count exchange has told this rank how many rows arrive
 * (numRecvTokens, 0 included) and before the ranks agree on the call, so before any token moves;
 * also for chorusEpDispatchAsync, whose outputs are then written when the stream gets there. It is
 * not called when this rank has already refused the call (bad arguments, a buffer too small), and
 * it may be called in a call that another rank refuses: what it allocated is then not written,
 * and is the caller's to free as always. It returns 0 after filling, in *out (`out` is the
 * caller's struct), recvX [numRecvTokens, hidden] of the dispatch datatype, recvXScales
 * [numRecvTokens, hidden / 128] with FP8 (NULL otherwise), recvTopkIdx and recvTopkWeights (each
 * [numRecvTokens, topk], or NULL: not wanted) and recvCapacity >= numRecvTokens (an array of no
 * rows may be NULL); it may also set numRecvTokensPerExpert, read after it. It must not call
 * Chorus on this buffer or its communicator, nor throw (C++: catch and return non-zero).
 * Failure refuses the call on every rank, and nothing is sent; the buffer and communicator stay
 * usable: a non-zero return gives ncclSystemError on this rank (naming the rank, the count and
 * the value returned), outputs that do not fit (recvCapacity too small, a NULL recvX or
 * recvXScales for rows that arrive, recvXScales without FP8) ncclInvalidArgument on this rank
 * naming the field; the other ranks return ncclInvalidArgument naming this rank. */

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

/* chorusEpDispatch and chorusEpCombine whose data movement is queued on a host stream
 * (chorusStream_t; NULL: blocking), see "Asynchronous calls" above. */
ncclResult_t chorusEpDispatchAsync(chorusEpBuffer_t buffer, const chorusEpDispatchArgs_t* args,
                                   chorusEpDispatchOutput_t* out, chorusEpHandle_t* handle,
                                   cudaStream_t stream);
ncclResult_t chorusEpCombineAsync(chorusEpBuffer_t buffer, chorusEpHandle_t handle, const void* x,
                                  ncclDataType_t datatype, const float* topkWeights,
                                  void* combinedX, float* combinedTopkWeights,
                                  cudaStream_t stream);

/* Frees a handle (any time after its dispatch; a call that uses it keeps what it needs). NULL
 * is allowed and does nothing (ncclSuccess), as free(NULL) does. */
ncclResult_t chorusEpHandleDestroy(chorusEpHandle_t handle);

/* ---- Low-latency mode (DeepEP's low_latency_dispatch / low_latency_combine) ----
 *
 * For decoding: every rank dispatches at most maxTokensPerRank tokens (the same bound on every
 * rank), and what arrives is laid out per local expert in fixed-size arrays, so nothing depends
 * on counts exchanged beforehand. Use:
 *   1. chorusEpLowLatencySizeHint(nranks, maxTokensPerRank, hidden, numExperts, topk, &bytes),
 *      chorusEpBufferCreate(comm, bytes, &buffer) (a buffer may serve both modes if sized for
 *      both: the larger hint);
 *   2. chorusEpLowLatencyDispatch -> per local expert e, recvCount[e] tokens in
 *      recvX[e, 0 .. recvCount[e]); the caller runs expert e on them and writes its outputs in the
 *      same rows of its own [L, nranks * maxTokensPerRank, hidden] array;
 *      chorusEpLowLatencyCombine(handle) sends each row back to the token's rank, which sums
 *      them weighted by topkWeights;
 *   3. chorusEpHandleDestroy(handle).
 *
 * Layouts (R = nranks * maxTokensPerRank rows per local expert; L = numExperts / nranks):
 *   x           [numTokens, hidden] of ncclBfloat16 or ncclFloat32
 *   recvX       [L, R, hidden]: uint8 FP8 E4M3 codes with useFp8, else the dispatch datatype
 *   recvXScales useFp8: [L, R, hidden / 128], float, or uint8 (UE8M0) with useUe8m0
 *   recvCount   [L] int: rows of each local expert that hold tokens (the rest are not written)
 *   recvSrcInfo [L, R] int64 (optional): srcRank * maxTokensPerRank + token index at the source
 * Each (token, expert) pair reaches the expert once: a token with three experts on a rank fills a
 * row of each of the three (slots of -1 are skipped; a token may not name an expert twice). The
 * rows of an expert are ordered by source rank, then by token index at the source: deterministic,
 * unlike DeepEP's arrival order.
 *
 * FP8 (useFp8, hidden % 128 == 0): the dispatch casts each 128 channels of a token with the
 * library's block codec (kernels/compress): amax = the block's largest |x| (BF16 widened
 * exactly), scale s = max(amax / 448, FLT_MIN) and codes = E4M3(x * (1 / s)) rounded to nearest
 * even (saturating); a row decodes as code * s. roundScale: s = 2^e, e the smallest integer with
 * amax <= 448 * 2^e (clamped to [-127, 127]), so x * 2^-e is exact before the cast; useUe8m0
 * (which implies roundScale) delivers e + 127 as one byte instead of the float s. An all-zero
 * block gets s = FLT_MIN (roundScale: 2^-127, the byte 0) and decodes to zeros; a block holding
 * Inf or NaN gets a NaN scale (the byte 0xff) and NaN codes. Each decoded value x' is within
 * E4M3's bound of x: |x' - x| <= (2^-4 + 2^-20) |x| + 2^-10 s + 2^-149.
 *
 * Combine: x [L, R, hidden] of ncclBfloat16 or ncclFloat32 (any of the two, whatever the dispatch
 * sent) holds expert e's output for token row j < recvCount[e] in row [e, j]; combinedX
 * [numTokens, hidden] of the same datatype receives for each token t
 *   combined[t] = sum over its slots k = 0 .. topk-1 with topkIdx[t, k] != -1, in that order, of
 *                 topkWeights[t, k] * row(t, k)
 * in float: acc = 0, then acc = acc + fl(w * v) per slot (each product and sum rounded to float,
 * no fused multiply-add), rounded once to the datatype at the end; a token with no experts gets
 * zeros. topkIdx is the dispatch's (the handle keeps it); topkWeights [numTokens, topk].
 *
 * Hooks (DeepEP's return_recv_hook). With returnRecvHook = 0 a call is blocking: it returns with
 * its outputs complete. With returnRecvHook != 0 it only checks, agrees, packs and posts its
 * sends and receives (on a host stream of its own, include/chorus/stream.h), and returns a hook;
 * the data moves in the background while the caller computes, and chorusEpHookWait(hook) waits
 * for arrival, writes the outputs and frees the hook. Until then the call's output arrays must
 * stay valid and untouched (the hook keeps what else it needs: its handle may be destroyed); its
 * inputs may be reused at once, and a dispatch's handle is usable only once its hook has run.
 * Two calls may be in flight per buffer (two micro-batches: dispatch A, dispatch B, hook A,
 * hook B, and likewise for combine): the buffer holds two slots (DeepEP's double buffering), and
 * a call finding both taken is refused (on every rank). The agreement of a call runs in the
 * communicator's issue order, after the transfers posted before it on this rank: a second call
 * returns once the first's data has moved here (not once its hook ran). Normal-mode calls are
 * refused on a buffer with a hook pending. The hook keeps the buffer's memory alive: destroying
 * the buffer first is allowed. A hook's errors (a dead peer, a timeout) are the transfer's,
 * naming the peer; the communicator is then broken.
 *
 * Cost. The receiver cannot size a receive before the data comes, so dispatch sends every peer
 * a fixed message of 8 + maxTokensPerRank * record bytes, record = 8-byte aligned (token bytes
 * (hidden * 2 or 4, or hidden + hidden / 128 * 4 or 1 with FP8) + 4 + 4 * topk), whatever the
 * number of tokens for that peer: nranks * that per dispatch, sent and received, with each token
 * travelling once per rank (not once per expert) and fanned out to the rank's experts on
 * arrival. Combine knows its counts from the handle and sends exactly one row per (token,
 * expert) pair. Both write what is for the rank itself, and for each same-host rank whose buffer
 * they map (shared memory: not with CHORUS_EP_MAP=0 or a forced transport without it), straight
 * into the receiver's buffer instead of sending it, as long as every rank holds the same slot for
 * the call (hooks waited in different orders can leave ranks on different slots: that call sends
 * everything but a rank's own part through the communicator).
 *
 * Checks and errors follow the normal mode's rules (agreement before any token moves; a call
 * refused on one rank is refused on every rank; the communicator stays usable): more than
 * maxTokensPerRank tokens, an expert outside [-1, numExperts) or named twice by one token (naming
 * the token and slot), hidden not a multiple of 128 with FP8, a buffer smaller than the hint
 * (naming the hint), maxTokensPerRank, hidden, topk, numExperts, datatype or the FP8 options
 * differing between ranks: ncclInvalidArgument. Both slots taken, a normal-mode call with a hook
 * pending, combining a handle whose dispatch hook has not run: ncclInvalidUsage on the rank
 * concerned (ncclInvalidArgument naming it on the others).
 */

/* A buffer size for low-latency calls of up to maxTokensPerRank tokens per rank of `hidden`
 * channels, numExperts experts and topk slots, two in flight. Local, no communication. */
ncclResult_t chorusEpLowLatencySizeHint(int nranks, size_t maxTokensPerRank, size_t hidden,
                                        int numExperts, int topk, size_t* bytes);

typedef struct chorusEpHook* chorusEpHook_t;

typedef struct {
  const void* x;             /* [numTokens, hidden] of datatype (NULL only if numTokens == 0) */
  ncclDataType_t datatype;   /* ncclBfloat16 or ncclFloat32 */
  size_t numTokens;          /* 0 .. maxTokensPerRank */
  size_t hidden;             /* the same on every rank, > 0; a multiple of 128 with useFp8 */
  const int64_t* topkIdx;    /* [numTokens, topk]: experts in [0, numExperts), or -1 */
  int topk;                  /* 1..1024, the same on every rank */
  int numExperts;            /* a multiple of nranks, the same on every rank */
  size_t maxTokensPerRank;   /* > 0, the same on every rank */
  int useFp8;                /* cast to FP8 E4M3, one scale per 128 channels */
  int roundScale;            /* useFp8: scales rounded up to powers of two */
  int useUe8m0;              /* useFp8: scales as UE8M0 bytes (implies roundScale) */
} chorusEpLowLatencyDispatchArgs_t;

typedef struct {
  void* recvX;               /* [L, R, hidden] (see the layouts above) */
  void* recvXScales;         /* useFp8: [L, R, hidden / 128] float or uint8; else NULL */
  int* recvCount;            /* [L] */
  int64_t* recvSrcInfo;      /* [L, R], or NULL (not wanted) */
} chorusEpLowLatencyDispatchOutput_t;

/* DeepEP's low_latency_dispatch: sends each token to the ranks of its experts and lays out what
 * arrives per local expert (see above); *handle receives what combine needs. With returnRecvHook
 * the outputs are written by chorusEpHookWait(*hook); without, *hook is set to NULL (hook may
 * then be NULL). Collective. */
ncclResult_t chorusEpLowLatencyDispatch(chorusEpBuffer_t buffer,
                                        const chorusEpLowLatencyDispatchArgs_t* args,
                                        chorusEpLowLatencyDispatchOutput_t* out,
                                        int returnRecvHook, chorusEpHandle_t* handle,
                                        chorusEpHook_t* hook);

/* DeepEP's low_latency_combine: x [L, R, hidden] of datatype (ncclBfloat16 or ncclFloat32) ->
 * combinedX [numTokens, hidden] of datatype, the weighted sum above with topkWeights
 * [numTokens, topk] (read during the call). The handle may be combined any number of times.
 * With returnRecvHook combinedX is written by chorusEpHookWait(*hook). Collective. */
ncclResult_t chorusEpLowLatencyCombine(chorusEpBuffer_t buffer, chorusEpHandle_t handle,
                                       const void* x, ncclDataType_t datatype,
                                       const float* topkWeights, void* combinedX,
                                       int returnRecvHook, chorusEpHook_t* hook);

/* Waits for the data of the call that returned `hook`, writes that call's outputs and frees
 * the hook (also when it fails). Waits are bounded by the communicator's timeout; a dead peer
 * fails it with ncclRemoteError/ncclSystemError naming the peer. Local. */
ncclResult_t chorusEpHookWait(chorusEpHook_t hook);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_EP_H_ */
