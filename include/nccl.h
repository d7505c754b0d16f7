/* SPDX-License-Identifier: Apache-2.0
 * File: include/nccl.h
 * The NCCL 2.28 C API, ABI-identical (enum values, struct layouts, 128-byte ncclUniqueId passed by
 * value, every function and its pnccl* profiling alias), implemented by Chorus on host memory.
 *
 * What differs from NCCL, by design:
 *  - Buffers are host memory. cudaStream_t is an opaque handle: NULL means "synchronous" (the call
 *    returns when the operation is complete); a stream from chorusStreamCreate()
 *    (<chorus/stream.h>) queues work that runs in issue order, asynchronously to the caller.
 *  - ncclCommCuDevice reports the rank's index among the ranks of its host (or the devlist entry
 *    given to ncclCommInitAll), since there is no CUDA device.
 *  - Every wait is bounded (CHORUS_TIMEOUT_MS): a dead or silent peer produces ncclRemoteError
 *    naming it, never a hang. ncclGetLastError explains every failure in words.
 *
 * Thread safety follows NCCL: calls on one communicator must not be made concurrently from
 * several threads, except ncclCommAbort and ncclCommGetAsyncError, which may be called at any
 * time. Collective calls must be made in the same order on every rank of a communicator.
 */
#ifndef NCCL_H_
#define NCCL_H_

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Without the CUDA runtime headers, a stream is an opaque pointer with CUDA's own tag, so code
 * compiled against NCCL's header and code compiled against this one agree on its type. */
#if !defined(__CUDA_RUNTIME_H__) && !defined(CUDART_VERSION)
typedef struct CUstream_st* cudaStream_t;
#endif

/* Opaque handle to a communicator. */
typedef struct ncclComm* ncclComm_t;
/* Opaque handle to a registered memory window. */
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
/* Identifies one communicator being created: the bootstrap root's address and a random secret.
 * Generate it once (ncclGetUniqueId) and give the same bytes to every rank. */
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Error type. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1, /* never returned by Chorus */
  ncclSystemError = 2,        /* a system call failed (the message says which, with errno) */
  ncclInternalError = 3,      /* a bug in Chorus */
  ncclInvalidArgument = 4,    /* a bad argument (the message says which) */
  ncclInvalidUsage = 5,       /* a call not valid in this state, or ranks that disagree */
  ncclRemoteError = 6,        /* a peer died, was unreachable, timed out or misbehaved */
  ncclInProgress = 7,         /* a non-blocking call has not completed yet */
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* Window registration flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02

#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* Performance policy (accepted and ignored by Chorus: there are no CTAs). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00 /* shrink the parent communicator */
#define NCCL_SHRINK_ABORT 0x01   /* first abort the parent's operations in flight, then shrink */

/* ncclCommRevoke flags. */
#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator configuration. Initialise with NCCL_CONFIG_INITIALIZER, then set fields.
 * A config that was not initialised that way (wrong magic) is rejected with
 * ncclInvalidArgument. Fields newer than the header a program was compiled with (told by
 * `size` and `version`) take their defaults, so old binaries keep working.
 * Chorus honours: blocking (0: calls may return ncclInProgress; poll ncclCommGetAsyncError),
 * commName (shown in logs), splitShare and shrinkShare (accepted). The CTA/NVLS/CollNet fields
 * are validated and otherwise ignored. */
typedef struct ncclConfig_v22800 {
  /* attributes that users should never touch. */
  size_t size;
  unsigned int magic;
  unsigned int version;
  /* attributes that users are able to customize. */
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                               \
  {                                                                           \
    sizeof(ncclConfig_t),                             /* size */              \
        0xcafebeef,                                   /* magic */             \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */       \
        NCCL_CONFIG_UNDEF_INT,                        /* blocking */          \
        NCCL_CONFIG_UNDEF_INT,                        /* cgaClusterSize */    \
        NCCL_CONFIG_UNDEF_INT,                        /* minCTAs */           \
        NCCL_CONFIG_UNDEF_INT,                        /* maxCTAs */           \
        NCCL_CONFIG_UNDEF_PTR,                        /* netName */           \
        NCCL_CONFIG_UNDEF_INT,                        /* splitShare */        \
        NCCL_CONFIG_UNDEF_INT,                        /* trafficClass */      \
        NCCL_CONFIG_UNDEF_PTR,                        /* commName */          \
        NCCL_CONFIG_UNDEF_INT,                        /* collnetEnable */     \
        NCCL_CONFIG_UNDEF_INT,                        /* CTAPolicy */         \
        NCCL_CONFIG_UNDEF_INT,                        /* shrinkShare */       \
        NCCL_CONFIG_UNDEF_INT,                        /* nvlsCTAs */          \
        NCCL_CONFIG_UNDEF_INT,                        /* nChannelsPerNetPeer */ \
        NCCL_CONFIG_UNDEF_INT,                        /* nvlinkCentricSched */ \
  }

/* Filled by ncclGroupSimulateEnd(). */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime; /* microseconds the group is expected to take */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                             \
  {                                                                           \
    sizeof(ncclSimInfo_t),                            /* size */              \
        0x74685283,                                   /* magic */             \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */       \
        NCCL_UNDEF_FLOAT                              /* estimated time */    \
  }

/* Allocates `size` bytes suited to every Chorus optimisation (page-aligned, shareable with the
 * other processes of the host). Free with ncclMemFree. ncclInvalidArgument if ptr is NULL;
 * ncclSystemError when memory is exhausted. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);

/* Frees memory from ncclMemAlloc. ncclInvalidArgument for any other pointer. */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* Stores NCCL_VERSION_CODE of the NCCL API this library implements. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Generates an Id for ncclCommInitRank: it starts, in this process, the bootstrap root that
 * the ranks contact. Call it once per communicator and give the Id to every rank. The root
 * listens on the interface chosen by CHORUS_SOCKET_IFNAME / NCCL_SOCKET_IFNAME and serves one
 * communicator; it gives up after CHORUS_BOOTSTRAP_TIMEOUT_MS. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* Creates a communicator of `nranks` ranks; this caller is `rank`. Blocks until every rank has
 * joined (bounded by CHORUS_BOOTSTRAP_TIMEOUT_MS), unless config->blocking is 0: then it may
 * return ncclInProgress with *comm already set, and ncclCommGetAsyncError(*comm) reports
 * ncclInProgress until initialisation ends. config may be NULL (defaults). Inside
 * ncclGroupStart/End, initialisation happens at ncclGroupEnd, so one thread can create the
 * communicators of several ranks. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/* ncclCommInitRankConfig with default configuration. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* Creates `ndev` communicators, the ranks 0..ndev-1 of one clique, all in this process.
 * comm must have room for ndev handles. devlist (may be NULL) gives each rank's "device"
 * number as reported by ncclCommCuDevice. The communicators may then be driven from one thread
 * inside ncclGroupStart/End, or from one thread each. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* Waits for every operation issued on comm to complete and quiesces it; afterwards only
 * ncclCommDestroy is valid. On a non-blocking communicator it may return ncclInProgress. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Frees the communicator and everything it owns (connections, shared memory, threads). Waits
 * (bounded) for operations still in flight. The handle is invalid afterwards; using it again
 * returns ncclInvalidArgument. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Stops every operation of comm now (they fail) and frees it. Safe from any thread, even while
 * other threads are blocked in calls on comm; returns promptly. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stops the operations in flight on comm; then only Destroy, Split and Shrink are valid.
 * revokeFlags must be NCCL_REVOKE_DEFAULT. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Collective over comm: the ranks passing the same color form a new communicator, ordered by
 * key (then by rank in comm). color NCCL_SPLIT_NOCOLOR leaves this rank out (*newcomm = NULL).
 * config NULL inherits comm's configuration. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/* Collective over the ranks of comm not listed in excludeRanksList: they form a new
 * communicator, keeping their relative order. Excluded ranks must not call it.
 * NCCL_SHRINK_ABORT first aborts comm's operations in flight (use it after a failure). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* ncclCommInitRankConfig with several Ids (the same nId Ids, in the same order, on every
 * rank): rank r contacts the root of commIds[r * nId / nranks], which spreads the bootstrap
 * load over several roots. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* A static string for each result code. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* What went wrong last, in words: the call, the rank, the peer and the cause. comm may be NULL
 * (the calling thread's last error). The string stays valid until the next call from this
 * thread. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Re-reads the logging environment variables (deprecated in NCCL, kept for the ABI). */
void ncclResetDebugInit(void);
void pncclResetDebugInit(void);

/* Stores comm's state in *asyncError: ncclSuccess, ncclInProgress (a non-blocking init or
 * operation still running), or the error that broke it (e.g. ncclRemoteError after a peer
 * died). Safe from any thread. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

/* Number of ranks in comm. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/* The "device" of comm: its index among the ranks on its host, or its ncclCommInitAll devlist
 * entry. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

/* This rank's index in comm. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* Registers [buff, buff+size) with comm for zero-copy use; *handle identifies the
 * registration for ncclCommDeregister. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

/* Removes a registration made by ncclCommRegister. */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* Registers a memory window (collective: every rank calls it). buff must be aligned to
 * NCCL_WIN_REQUIRED_ALIGNMENT. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                     ncclWindow_t* win, int winFlags);

/* Removes a window made by ncclCommWindowRegister. */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* Reduction operation selector. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* ncclNumOps: the number of built-in ncclRedOp_t values, and the least value of the
   * operators made by ncclRedOpCreate*** functions. */
  ncclNumOps = 5,
  /* ncclMaxRedOp: the largest valid ncclRedOp_t (keeps the enum 4 bytes wide). */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Data types. fp16, bf16 and both fp8 types are reduced in fp32 arithmetic. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  /* The scalar is read when each collective using the operator runs. */
  ncclScalarDevice = 0,
  /* The scalar is read before ncclRedOpCreatePreMulSum returns. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Creates an operator for comm and datatype that multiplies each rank's input by *scalar (of
 * type datatype; each rank may pass its own) and then sums. Destroy it with ncclRedOpDestroy. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/* Destroys an operator made by ncclRedOpCreatePreMulSum with the same comm. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/*
 * Collective communication operations.
 *
 * Every rank of the communicator calls each collective, in the same order. With the NULL
 * stream a call returns when its result is in the receive buffer; with a host stream it returns
 * once queued and the buffers must stay valid until the stream has executed it. One thread
 * driving several ranks must group its calls (ncclGroupStart/End). count 0 is valid and does
 * nothing. Errors: ncclInvalidArgument for a NULL comm, NULL buffers with count > 0, an unknown
 * datatype or op, a root out of range; the communicator stays usable after them.
 */

/* Reduces count elements of every rank's sendbuff with op into recvbuff on root. recvbuff is
 * only used on root. In place when sendbuff == recvbuff. */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* (deprecated) In-place broadcast of count elements of buff from root. */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/* Copies count elements of root's sendbuff into every rank's recvbuff. In place when
 * sendbuff == recvbuff. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

/* Reduces count elements of every rank's sendbuff with op; every recvbuff gets the result.
 * In place when sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* Reduces nranks*recvcount elements of every sendbuff with op; rank i's recvbuff gets block i
 * of the result. In place when recvbuff == sendbuff + rank*recvcount. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* Every rank's sendcount elements land at recvbuff + i*sendcount on every rank (i = sender).
 * In place when sendbuff == recvbuff + rank*sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Block j (count elements at sendbuff + j*count) goes to rank j, and the block from rank i
 * lands at recvbuff + i*count. In place when sendbuff == recvbuff. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Every rank's count elements land on root at recvbuff + i*count (i = sender). recvbuff is
 * only used on root. In place when sendbuff == recvbuff + root*count. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* Root's block i (count elements at sendbuff + i*count) goes to rank i's recvbuff. sendbuff
 * is only used on root. In place when recvbuff == sendbuff + root*count. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* Sends count elements to peer, which must post a matching ncclRecv (same count and
 * datatype). Sends and receives between a pair match in issue order. Several sends and
 * receives that must progress together go inside one group, in any order. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* Receives count elements from peer (see ncclSend). */
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/*
 * Group semantics.
 *
 * Calls between ncclGroupStart and ncclGroupEnd are collected and launched together at the
 * outermost ncclGroupEnd: this lets one thread drive several ranks, lets sends and receives
 * progress together in any order, and lets ncclCommInitRank calls of several ranks proceed
 * together. Groups nest. ncclGroupEnd returns the first error of the group; with NULL streams
 * it returns when every operation of the group is complete. A ncclGroupEnd without a matching
 * ncclGroupStart returns ncclInvalidUsage.
 */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Ends the group without running it and stores the estimated time in simInfo (which must be
 * initialised with NCCL_SIM_INFO_INITIALIZER). */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
