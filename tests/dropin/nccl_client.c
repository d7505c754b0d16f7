/* SPDX-License-Identifier: Apache-2.0
 * File: tests/dropin/nccl_client.c
 * A program written and linked against NCCL, and nothing else: it knows no Chorus header or
 * call. Ranks are processes; rank 0 publishes the unique id in a file the others wait for.
 * Every rank runs AllReduce, ReduceScatter, AllGather, Broadcast, AlltoAll and a ring of
 * Send/Recv in a group, on non-integer data, and checks its own results.
 *   nccl_client RANK NRANKS ID_FILE [COUNT]
 * Exit 0 when every result is right; prints which call failed otherwise. */
#include <nccl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    ncclResult_t r_ = (call);                                                            \
    if (r_ != ncclSuccess) {                                                             \
      fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, ncclGetErrorString(r_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static int g_rank;

/* Element i of rank r's input: a non-integer in [-1, 1), the same on every rank that asks. */
static float value(int r, size_t i) {
  uint64_t x = (uint64_t)r * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (float)((double)(x >> 40) / (double)(1ull << 23) - 1.0) + 1.0f / 3.0f;
}

static int wrong(const char* what, size_t i, double got, double want, double tol) {
  if (fabs(got - want) <= tol * (1.0 + fabs(want))) return 0;
  fprintf(stderr, "rank %d: %s[%zu] = %.9g, expected %.9g\n", g_rank, what, i, got, want);
  return 1;
}

static void read_id(const char* path, ncclUniqueId* id) {
  for (int tries = 0; tries < 3000; ++tries) { /* 30 s */
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t n = fread(id, 1, sizeof(*id), f);
      fclose(f);
      if (n == sizeof(*id)) return;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "rank %d: no unique id in %s after 30 s\n", g_rank, path);
  exit(1);
}

static void write_id(const char* path, const ncclUniqueId* id) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE* f = fopen(tmp, "wb");
  if (f == NULL || fwrite(id, 1, sizeof(*id), f) != sizeof(*id) || fclose(f) != 0 ||
      rename(tmp, path) != 0) {
    perror(path);
    exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s RANK NRANKS ID_FILE [COUNT]\n", argv[0]);
    return 2;
  }
  g_rank = atoi(argv[1]);
  int n = atoi(argv[2]);
  size_t count = argc > 4 ? (size_t)atoll(argv[4]) : 12345;
  int version = 0;
  CHECK(ncclGetVersion(&version));
  ncclUniqueId id;
  if (g_rank == 0) {
    CHECK(ncclGetUniqueId(&id));
    write_id(argv[3], &id);
  } else {
    read_id(argv[3], &id);
  }
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, g_rank));
  int c = 0, r = -1;
  CHECK(ncclCommCount(comm, &c));
  CHECK(ncclCommUserRank(comm, &r));
  if (c != n || r != g_rank) {
    fprintf(stderr, "rank %d: comm says rank %d of %d\n", g_rank, r, c);
    return 1;
  }

  size_t total = count * (size_t)n;
  float* in = malloc(total * sizeof(float));
  float* out = malloc(total * sizeof(float));
  int bad = 0;
  if (in == NULL || out == NULL) return 1;

  /* AllReduce: the sum of every rank's input. */
  for (size_t i = 0; i < count; ++i) in[i] = value(g_rank, i);
  CHECK(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count && !bad; ++i) {
    double want = 0;
    for (int k = 0; k < n; ++k) want += value(k, i);
    bad |= wrong("AllReduce", i, out[i], want, 1e-5);
  }

  /* ReduceScatter: block g_rank of the sum of every rank's n blocks. */
  for (size_t i = 0; i < total; ++i) in[i] = value(g_rank, i);
  CHECK(ncclReduceScatter(in, out, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count && !bad; ++i) {
    double want = 0;
    for (int k = 0; k < n; ++k) want += value(k, (size_t)g_rank * count + i);
    bad |= wrong("ReduceScatter", i, out[i], want, 1e-5);
  }

  /* AllGather: every rank's block, in rank order, bit for bit. */
  for (size_t i = 0; i < count; ++i) in[i] = value(g_rank, i);
  CHECK(ncclAllGather(in, out, count, ncclFloat, comm, NULL));
  for (size_t i = 0; i < total && !bad; ++i)
    bad |= wrong("AllGather", i, out[i], value((int)(i / count), i % count), 0);

  /* Broadcast from the last rank. */
  for (size_t i = 0; i < count; ++i) in[i] = value(g_rank, i);
  CHECK(ncclBroadcast(in, out, count, ncclFloat, n - 1, comm, NULL));
  for (size_t i = 0; i < count && !bad; ++i)
    bad |= wrong("Broadcast", i, out[i], value(n - 1, i), 0);

  /* AlltoAll: block k of the output is block g_rank of rank k's input. */
  for (size_t i = 0; i < total; ++i) in[i] = value(g_rank, i);
  CHECK(ncclAlltoAll(in, out, count, ncclFloat, comm, NULL));
  for (size_t i = 0; i < total && !bad; ++i) {
    int k = (int)(i / count);
    bad |= wrong("AlltoAll", i, out[i], value(k, (size_t)g_rank * count + i % count), 0);
  }

  /* A ring of Send/Recv in one group: receive the left neighbour's input. */
  int right = (g_rank + 1) % n, left = (g_rank + n - 1) % n;
  for (size_t i = 0; i < count; ++i) in[i] = value(g_rank, i);
  CHECK(ncclGroupStart());
  CHECK(ncclSend(in, count, ncclFloat, right, comm, NULL));
  CHECK(ncclRecv(out, count, ncclFloat, left, comm, NULL));
  CHECK(ncclGroupEnd());
  for (size_t i = 0; i < count && !bad; ++i) bad |= wrong("Send/Recv", i, out[i], value(left, i), 0);

  CHECK(ncclCommDestroy(comm));
  free(in);
  free(out);
  printf("rank %d of %d: NCCL API %d, 6 collectives %s\n", g_rank, n, version,
         bad ? "WRONG" : "right");
  return bad;
}
