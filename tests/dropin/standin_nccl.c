/* SPDX-License-Identifier: Apache-2.0
 * File: tests/dropin/standin_nccl.c
 * A stand-in for a real NCCL: a libnccl.so.2 (same SONAME) whose every call fails. The drop-in
 * tests link their client against it, so the client can only work when Chorus's libnccl.so.2
 * is the one that answers (LD_PRELOAD ahead of it, or LD_LIBRARY_PATH instead of it). */
#include <nccl.h>
#include <stdio.h>

static ncclResult_t refuse(const char* name) {
  fprintf(stderr, "stand-in libnccl.so.2: %s called, failing\n", name);
  return ncclSystemError;
}

#define STANDIN(name, ...) \
  ncclResult_t name(__VA_ARGS__) { return refuse(#name); }

STANDIN(ncclGetVersion, int* version)
STANDIN(ncclGetUniqueId, ncclUniqueId* id)
STANDIN(ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId id, int rank)
STANDIN(ncclCommInitAll, ncclComm_t* comm, int ndev, const int* devlist)
STANDIN(ncclCommDestroy, ncclComm_t comm)
STANDIN(ncclCommCount, const ncclComm_t comm, int* count)
STANDIN(ncclCommUserRank, const ncclComm_t comm, int* rank)
STANDIN(ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
STANDIN(ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
STANDIN(ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
STANDIN(ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
        int root, ncclComm_t comm, cudaStream_t stream)
STANDIN(ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
        ncclComm_t comm, cudaStream_t stream)
STANDIN(ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
        ncclComm_t comm, cudaStream_t stream)
STANDIN(ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
        cudaStream_t stream)
STANDIN(ncclGroupStart, void)
STANDIN(ncclGroupEnd, void)

const char* ncclGetErrorString(ncclResult_t result) {
  (void)result;
  return "stand-in libnccl.so.2: no NCCL here";
}
