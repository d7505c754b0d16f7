/* SPDX-License-Identifier: Apache-2.0
 * File: examples/allreduce_env.c
 * One program for every launcher: the communicator comes from the launcher's environment
 * (chorusCommInitFromEnv), so the same binary runs under
 *   chorus-run -n 4 ./allreduce_env
 *   torchrun --nproc_per_node 4 --no_python ./allreduce_env     (python3 -m torch.distributed.run)
 *   mpirun -n 4 ./allreduce_env
 *   srun -n 4 ./allreduce_env
 * Every rank sums a vector of non-integer values across all ranks and checks every element
 * against the sum it computes itself.
 *   allreduce_env [count]        exit 0 when this rank's result is right */
#define _POSIX_C_SOURCE 200809L /* gethostname */
#include <chorus/launch.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CHECK(call)                                                                         \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "%s failed: %s: %s\n", #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

/* Element i of rank r: a non-integer, the same wherever it is computed. */
static double value(int r, size_t i) { return (r + 1) * 0.37 + (double)(i % 977) * 0.013; }

int main(int argc, char** argv) {
  size_t count = argc > 1 ? (size_t)atoll(argv[1]) : 100003;
  ncclComm_t comm;
  CHECK(chorusCommInitFromEnv(&comm, NULL));
  int rank = 0, nranks = 0;
  CHECK(ncclCommUserRank(comm, &rank));
  CHECK(ncclCommCount(comm, &nranks));
  double* x = malloc(count * sizeof(double));
  if (x == NULL) return 1;
  for (size_t i = 0; i < count; ++i) x[i] = value(rank, i);
  CHECK(ncclAllReduce(x, x, count, ncclDouble, ncclSum, comm, NULL));
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < nranks; ++r) want += value(r, i);
    if (fabs(x[i] - want) > 1e-12 * (1 + fabs(want))) ++wrong;
  }
  free(x);
  CHECK(ncclCommDestroy(comm));
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  printf("allreduce_env: rank %d of %d on %s: %zu doubles, %s\n", rank, nranks, host, count,
         wrong ? "WRONG" : "right");
  return wrong != 0;
}
