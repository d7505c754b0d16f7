/* SPDX-License-Identifier: Apache-2.0
 * File: tests/dropin/nccl_dlopen_client.c
 * How several frameworks reach NCCL: dlopen("libnccl.so.2") at run time and dlsym what they
 * need, with no link-time dependency. Every name given on the command line must resolve; then
 * the client runs an AllReduce over NRANKS ranks (ncclCommInitAll, one thread per rank) through
 * the resolved pointers and checks every rank's result.
 *   nccl_dlopen_client NRANKS SYMBOL...  */
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef ncclResult_t (*InitAllFn)(ncclComm_t*, int, const int*);
typedef ncclResult_t (*AllReduceFn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                    ncclComm_t, cudaStream_t);
typedef ncclResult_t (*DestroyFn)(ncclComm_t);
typedef const char* (*ErrorStringFn)(ncclResult_t);

enum { kCount = 4097 };
static AllReduceFn all_reduce;
static ErrorStringFn error_string;

struct Rank {
  ncclComm_t comm;
  int rank, nranks, bad;
};

static void* run(void* arg) {
  struct Rank* me = arg;
  double* buf = malloc(kCount * sizeof(double));
  for (int i = 0; i < kCount; ++i) buf[i] = (me->rank + 1) * 0.1 + i * 1e-3;
  ncclResult_t r = all_reduce(buf, buf, kCount, ncclDouble, ncclSum, me->comm, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclAllReduce: %s\n", me->rank, error_string(r));
    me->bad = 1;
  }
  for (int i = 0; i < kCount && !me->bad; ++i) {
    double want = 0;
    for (int k = 0; k < me->nranks; ++k) want += (k + 1) * 0.1 + i * 1e-3;
    if (fabs(buf[i] - want) > 1e-12 * (1 + fabs(want))) {
      fprintf(stderr, "rank %d: element %d = %.17g, expected %.17g\n", me->rank, i, buf[i], want);
      me->bad = 1;
    }
  }
  free(buf);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NRANKS SYMBOL...\n", argv[0]);
    return 2;
  }
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen(libnccl.so.2): %s\n", dlerror());
    return 1;
  }
  int missing = 0;
  for (int i = 2; i < argc; ++i) {
    if (dlsym(lib, argv[i]) == NULL) {
      fprintf(stderr, "dlsym(%s): not found\n", argv[i]);
      missing = 1;
    }
  }
  if (missing) return 1;
  InitAllFn init_all = (InitAllFn)dlsym(lib, "ncclCommInitAll");
  DestroyFn destroy = (DestroyFn)dlsym(lib, "ncclCommDestroy");
  all_reduce = (AllReduceFn)dlsym(lib, "ncclAllReduce");
  error_string = (ErrorStringFn)dlsym(lib, "ncclGetErrorString");
  if (!init_all || !destroy || !all_reduce || !error_string) {
    fprintf(stderr, "the functions this client calls are not all there\n");
    return 1;
  }
  int n = atoi(argv[1]);
  ncclComm_t comms[64];
  struct Rank ranks[64];
  pthread_t threads[64];
  if (n < 1 || n > 64) return 2;
  ncclResult_t r = init_all(comms, n, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll: %s\n", error_string(r));
    return 1;
  }
  for (int k = 0; k < n; ++k) {
    ranks[k] = (struct Rank){comms[k], k, n, 0};
    pthread_create(&threads[k], NULL, run, &ranks[k]);
  }
  int bad = 0;
  for (int k = 0; k < n; ++k) {
    pthread_join(threads[k], NULL);
    bad |= ranks[k].bad;
    destroy(comms[k]);
  }
  printf("dlopen client: %d symbols resolved, AllReduce on %d ranks %s\n", argc - 2, n,
         bad ? "WRONG" : "right");
  dlclose(lib);
  return bad;
}
