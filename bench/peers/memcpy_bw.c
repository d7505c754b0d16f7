// SPDX-License-Identifier: Apache-2.0
// File: bench/peers/memcpy_bw.c
// Memory bandwidth of this machine, the limit that bench/compare/compare.py sets Chorus's
// shared-memory collectives against.
//
//   chorus_memcpy_bw [-s MIB] [-r REPS] [-t MAXTHREADS] [-J FILE]
//
// For 1..MAXTHREADS threads (default 2), each thread owns its own -s MiB source and destination
// (128 MiB, touched before timing), and each repetition every thread (started together at a
// barrier) does one memcpy of the whole buffer and one "triad" a[i] = b[i] + 3*c[i] over floats
// of the same -s MiB each (three arrays). Reported per thread count:
//   copy_gbps   bytes copied per second, summed over threads (wall time of the slowest thread);
//               the memory traffic of a copy is at least twice that (read + write)
//   triad_gbps  bytes of memory traffic per second of the triad: 2 arrays read + 1 written
// Best (the capability, as STREAM reports it) and median over -r repetitions (default 7) are
// printed. GB = 1e9 bytes. Exit status 0, or 1 if a buffer cannot be allocated.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  size_t bytes;
  unsigned char* src;
  unsigned char* dst;
  float* a;
  float* b;
  float* c;
  pthread_barrier_t* start;
  int reps;
  double* copy_s;   // per repetition, seconds
  double* triad_s;  // per repetition, seconds
} Worker;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void* xalloc(size_t bytes) {
  void* p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!p) {
    fprintf(stderr, "chorus_memcpy_bw: cannot allocate %zu bytes\n", bytes);
    exit(1);
  }
  memset(p, 1, bytes);
  return p;
}

static void* work(void* arg) {
  Worker* w = (Worker*)arg;
  size_t n = w->bytes / sizeof(float);
  for (int r = 0; r < w->reps; ++r) {
    pthread_barrier_wait(w->start);
    double t0 = now();
    memcpy(w->dst, w->src, w->bytes);
    w->copy_s[r] = now() - t0;
    __asm__ volatile("" ::: "memory");
    pthread_barrier_wait(w->start);
    t0 = now();
    float* restrict a = w->a;
    const float* restrict b = w->b;
    const float* restrict c = w->c;
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    w->triad_s[r] = now() - t0;
    __asm__ volatile("" ::: "memory");
  }
  return NULL;
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

int main(int argc, char** argv) {
  size_t mib = 128;
  int reps = 7, max_threads = 2;
  const char* json = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "-s") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-t") && i + 1 < argc) max_threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-J") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: chorus_memcpy_bw [-s MIB] [-r REPS] [-t MAXTHREADS] [-J FILE]\n");
      return 2;
    }
  }
  if (mib < 1 || reps < 1 || max_threads < 1 || max_threads > 64) {
    fprintf(stderr, "chorus_memcpy_bw: bad -s, -r or -t\n");
    return 2;
  }
  size_t bytes = mib << 20;
  Worker* ws = calloc((size_t)max_threads, sizeof(Worker));
  pthread_t* th = calloc((size_t)max_threads, sizeof(pthread_t));
  for (int t = 0; t < max_threads; ++t) {
    ws[t].bytes = bytes;
    ws[t].src = xalloc(bytes);
    ws[t].dst = xalloc(bytes);
    ws[t].a = xalloc(bytes);
    ws[t].b = xalloc(bytes);
    ws[t].c = xalloc(bytes);
    ws[t].reps = reps;
    ws[t].copy_s = calloc((size_t)reps, sizeof(double));
    ws[t].triad_s = calloc((size_t)reps, sizeof(double));
  }
  FILE* jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) perror(json);
  if (jf) fprintf(jf, "{\"tool\": \"chorus_memcpy_bw\", \"buffer_bytes\": %zu, \"reps\": %d, \"results\": [", bytes, reps);
  printf("# chorus_memcpy_bw: %zu MiB per buffer, %d repetitions, GB = 1e9 B\n", mib, reps);
  printf("# %7s  %14s  %14s  %15s  %15s\n", "threads", "copy best", "copy median",
         "triad best", "triad median");
  double* copy = calloc((size_t)reps, sizeof(double));
  double* triad = calloc((size_t)reps, sizeof(double));
  for (int nt = 1; nt <= max_threads; ++nt) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nt);
    for (int t = 0; t < nt; ++t) {
      ws[t].start = &start;
      pthread_create(&th[t], NULL, work, &ws[t]);
    }
    for (int t = 0; t < nt; ++t) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    for (int r = 0; r < reps; ++r) {
      double cs = 0, ts = 0;  // the slowest thread of the repetition sets its time
      for (int t = 0; t < nt; ++t) {
        if (ws[t].copy_s[r] > cs) cs = ws[t].copy_s[r];
        if (ws[t].triad_s[r] > ts) ts = ws[t].triad_s[r];
      }
      copy[r] = (double)bytes * nt / cs / 1e9;
      triad[r] = 3.0 * (double)bytes * nt / ts / 1e9;
    }
    qsort(copy, (size_t)reps, sizeof(double), cmp_double);
    qsort(triad, (size_t)reps, sizeof(double), cmp_double);
    double cb = copy[reps - 1], cm = copy[reps / 2], tb = triad[reps - 1], tm = triad[reps / 2];
    printf("  %7d  %9.2f GB/s  %9.2f GB/s  %10.2f GB/s  %10.2f GB/s\n", nt, cb, cm, tb, tm);
    if (jf)
      fprintf(jf,
              "%s\n  {\"threads\": %d, \"copy_gbps_best\": %.4f, \"copy_gbps_median\": %.4f, "
              "\"triad_gbps_best\": %.4f, \"triad_gbps_median\": %.4f}",
              nt == 1 ? "" : ",", nt, cb, cm, tb, tm);
  }
  if (jf) {
    fprintf(jf, "\n]}\n");
    fclose(jf);
  }
  return 0;
}
