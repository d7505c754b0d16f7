/* SPDX-License-Identifier: Apache-2.0
 * File: examples/allreduce_mp.c
 * A multi-process AllReduce using only the NCCL API: the parent creates the unique id, forks
 * one process per further rank, and every rank sums a float vector across all of them.
 *
 *   allreduce_mp [nranks=4] [count=1048576]
 */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call,                   \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                        \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

static int run_rank(int rank, int nranks, ncclUniqueId id, size_t count) {
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  float* buf = (float*)malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) buf[i] = (float)(rank + 1) * (float)(i % 1000);
  /* NULL stream: the call returns with the result in buf. */
  CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
  float factor = (float)nranks * (float)(nranks + 1) / 2.0f; /* 1 + 2 + ... + nranks */
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    if (buf[i] != factor * (float)(i % 1000)) ++wrong;
  free(buf);
  CHECK(ncclCommDestroy(comm));
  if (wrong != 0) {
    fprintf(stderr, "rank %d: %zu of %zu elements wrong\n", rank, wrong, count);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  int rank = 0;
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  size_t count = argc > 2 ? (size_t)atoll(argv[2]) : (size_t)1 << 20;
  if (nranks < 1) {
    fprintf(stderr, "usage: %s [nranks>=1] [count]\n", argv[0]);
    return 2;
  }
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id)); /* starts the bootstrap root in this (parent) process */
  for (int r = 1; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(run_rank(r, nranks, id, count));
    if (pid < 0) {
      perror("fork");
      return 1;
    }
  }
  int failed = run_rank(0, nranks, id, count);
  for (int r = 1; r < nranks; ++r) {
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  printf("allreduce_mp: %d ranks, %zu floats: %s\n", nranks, count, failed ? "FAILED" : "OK");
  return failed;
}
