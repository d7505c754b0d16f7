// SPDX-License-Identifier: Apache-2.0
// File: bench/peers/mpi_coll_bench.c
// The MPI peer of bench/coll/*_perf for bench/compare/compare.py and latency.sh: MPI_Allreduce,
// MPI_Reduce_scatter_block, MPI_Allgather, MPI_Alltoall, MPI_Bcast, MPI_Reduce, MPI_Gather and
// MPI_Scatter on float/sum, measured the way nccl-tests (and Chorus's tools) measure, with
// nccl-tests' size, count, algbw and busbw.
//
//   mpirun -np 2 [--mca ...] chorus_mpi_coll_bench [-b 8] [-e 128M] [-f 2] [-n 20] [-w 1]
//          [-c 1] [-a 1] [-o allreduce,reduce_scatter,allgather,alltoall,bcast,...] [-r 0]
//          [-J FILE]
//
// Per collective, -w warm-up calls at the largest and at the smallest size, then per size
// (out of place only): one untimed call, MPI_Barrier, -n timed calls (MPI_Wtime from the first
// call to the return of the last), time per call = elapsed / -n on each rank, combined over ranks
// per -a exactly as nccl-tests' -a: 0 rank 0's, 1 the mean over ranks (nccl-tests' default and
// this tool's), 2 the minimum, 3 the maximum. The JSON also carries the maximum over ranks
// (time_max_us) whatever -a is. Successive timed calls use successive slices of -e-byte buffers
// (as nccl-tests and bench/coll do) so that a small size is not always the same cache lines.
//
// Sizes and formulas (nccl-tests src/*.cu; n ranks, t seconds per call, GB = 1e9 B):
//   allreduce       count = size/4            algbw = count*4/t    busbw = algbw*2(n-1)/n
//   reduce_scatter  count = size/(4n) (recv)  algbw = count*4*n/t  busbw = algbw*(n-1)/n
//   allgather       count = size/(4n) (send)  algbw = count*4*n/t  busbw = algbw*(n-1)/n
//   alltoall        count = size/(4n) (peer)  algbw = count*4*n/t  busbw = algbw*(n-1)/n
//   bcast           count = size/4            algbw = count*4/t    busbw = algbw
//   reduce          count = size/4            algbw = count*4/t    busbw = algbw
//   gather          count = size/(4n) (send)  algbw = count*4*n/t  busbw = algbw*(n-1)/n
//   scatter         count = size/(4n) (recv)  algbw = count*4*n/t  busbw = algbw*(n-1)/n
// (-r ROOT for bcast, reduce, gather and scatter.)
// The size column is the larger of one rank's send and receive bytes; a size that does not give
// every rank one element prints no row. -c N checks N calls after timing (inputs are small
// integers, so float sums are exact) and reports the wrong elements summed over ranks.
// Exit status: 0 on success, 1 if any element was wrong or a call failed, 2 on a usage error.
#define _GNU_SOURCE
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kAllreduce, kReduceScatter, kAllgather, kAlltoall, kBcast, kReduce, kGather, kScatter,
       kNumColls };
static const char* const kCollNames[kNumColls] = {"allreduce", "reduce_scatter", "allgather",
                                                  "alltoall",  "bcast",          "reduce",
                                                  "gather",    "scatter"};
static const char* const kCollCalls[kNumColls] = {
    "MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Alltoall",
    "MPI_Bcast",     "MPI_Reduce",               "MPI_Gather",    "MPI_Scatter"};
// Reduction collectives print "sum", the rooted ones their root.
static int reduces(int coll) {
  return coll == kAllreduce || coll == kReduceScatter || coll == kReduce;
}
static int rooted(int coll) {
  return coll == kBcast || coll == kReduce || coll == kGather || coll == kScatter;
}

typedef struct {
  size_t min_bytes, max_bytes, step_factor;
  int iters, warmup, check, average, root;
  int colls[kNumColls];
  const char* json;
} Options;

typedef struct {
  int rank, nranks;
  float* send;
  float* recv;
  size_t buf_bytes;
} Ctx;

static int parse_size(const char* s, size_t* out) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return 0;
  unsigned long long mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm') mul = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g') mul = 1ull << 30, ++end;
  if (*end != '\0') return 0;
  *out = (size_t)(v * mul);
  return 1;
}

static int parse_int(const char* s, int lo, int hi, int* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

static int parse_colls(const char* list, int* colls) {
  for (int c = 0; c < kNumColls; ++c) colls[c] = 0;
  const char* p = list;
  while (*p) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int found = 0;
    if (len == 3 && strncmp(p, "all", 3) == 0) {
      for (int c = 0; c < kNumColls; ++c) colls[c] = 1;
      found = 1;
    }
    for (int c = 0; c < kNumColls && !found; ++c)
      if (strlen(kCollNames[c]) == len && strncmp(p, kCollNames[c], len) == 0) colls[c] = found = 1;
    if (!found) return 0;
    p += len;
    if (*p == ',') ++p;
  }
  return 1;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: chorus_mpi_coll_bench [-b SIZE] [-e SIZE] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
          "       [-c CHECKS] [-a 0|1|2|3] [-r ROOT] [-o COLL[,COLL...]|all] [-J FILE]\n"
          "  -b, -e  smallest and largest message (bytes, K/M/G suffixes; 8, 128M)\n"
          "  -f      size multiplier (2); -n timed calls per size (20); -w warm-up calls (1)\n"
          "  -c      checked calls after timing (1; 0 disables)\n"
          "  -a      time reported: 0 rank 0's, 1 mean over ranks (default), 2 min, 3 max\n"
          "  -o      allreduce, reduce_scatter, allgather, alltoall, bcast, reduce, gather,\n"
          "          scatter or all (all)\n"
          "  -r      root of bcast, reduce, gather and scatter (0)\n"
          "  -J      also write the results as JSON to FILE\n");
}

// Returns 1 on success, 0 to exit 0 (help), -1 on a usage error.
static int parse_args(int argc, char** argv, Options* o) {
  o->min_bytes = 8;
  o->max_bytes = (size_t)128 << 20;
  o->step_factor = 2;
  o->iters = 20;
  o->warmup = 1;
  o->check = 1;
  o->average = 1;
  o->root = 0;
  o->json = NULL;
  for (int c = 0; c < kNumColls; ++c) o->colls[c] = 1;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 0;
    if (i + 1 >= argc) {
      fprintf(stderr, "chorus_mpi_coll_bench: '%s' needs a value or is unknown\n", a);
      return -1;
    }
    const char* v = argv[++i];
    int ok = 0;
    if (!strcmp(a, "-b")) ok = parse_size(v, &o->min_bytes);
    else if (!strcmp(a, "-e")) ok = parse_size(v, &o->max_bytes);
    else if (!strcmp(a, "-f")) ok = parse_size(v, &o->step_factor) && o->step_factor >= 2;
    else if (!strcmp(a, "-n")) ok = parse_int(v, 1, 1 << 30, &o->iters);
    else if (!strcmp(a, "-w")) ok = parse_int(v, 0, 1 << 30, &o->warmup);
    else if (!strcmp(a, "-c")) ok = parse_int(v, 0, 1 << 20, &o->check);
    else if (!strcmp(a, "-a")) ok = parse_int(v, 0, 3, &o->average);
    else if (!strcmp(a, "-r")) ok = parse_int(v, 0, 1 << 20, &o->root);
    else if (!strcmp(a, "-o")) ok = parse_colls(v, o->colls);
    else if (!strcmp(a, "-J")) ok = 1, o->json = v;
    else {
      fprintf(stderr, "chorus_mpi_coll_bench: unknown option '%s'\n", a);
      return -1;
    }
    if (!ok) {
      fprintf(stderr, "chorus_mpi_coll_bench: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  if (o->min_bytes < 1 || o->min_bytes > o->max_bytes) {
    fprintf(stderr, "chorus_mpi_coll_bench: -b must be between 1 and -e\n");
    return -1;
  }
  return 1;
}

// Counts of one call: *count is the count argument, *send_elems / *recv_elems one rank's
// buffers in elements. Returns 0 when the size gives some rank no element.
static int layout(int coll, size_t bytes, int n, size_t* count, size_t* send_elems,
                  size_t* recv_elems) {
  size_t elems = bytes / sizeof(float);
  switch (coll) {
    case kAllreduce:
    case kBcast:
    case kReduce:
      *count = elems;
      *send_elems = *recv_elems = elems;
      break;
    case kReduceScatter:
    case kScatter:
      *count = elems / (size_t)n;
      *send_elems = *count * (size_t)n;
      *recv_elems = *count;
      break;
    case kAllgather:
    case kGather:
      *count = elems / (size_t)n;
      *send_elems = *count;
      *recv_elems = *count * (size_t)n;
      break;
    default:  // kAlltoall: count per peer
      *count = elems / (size_t)n;
      *send_elems = *recv_elems = *count * (size_t)n;
      break;
  }
  return *count > 0;
}

static double bus_factor(int coll, int n) {
  switch (coll) {
    case kAllreduce: return 2.0 * (n - 1) / n;
    case kBcast:
    case kReduce: return 1.0;
    default: return (double)(n - 1) / n;
  }
}

static int call(const Ctx* x, int coll, size_t count, const float* send, float* recv, int root) {
  int c = (int)count;  // sizes here stay far below 2^31 elements
  switch (coll) {
    case kAllreduce: return MPI_Allreduce(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case kReduceScatter:
      return MPI_Reduce_scatter_block(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case kAllgather:
      return MPI_Allgather(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD);
    case kAlltoall: return MPI_Alltoall(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD);
    case kReduce: return MPI_Reduce(send, recv, c, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
    case kGather:
      return MPI_Gather(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, root, MPI_COMM_WORLD);
    case kScatter:
      return MPI_Scatter(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, root, MPI_COMM_WORLD);
    default:  // kBcast, out of place as nccl-tests: the root sends from send, every rank gets recv
      if (x->rank == root && recv != send) memcpy(recv, send, count * sizeof(float));
      return MPI_Bcast(recv, c, MPI_FLOAT, root, MPI_COMM_WORLD);
  }
}

// Timed call `iteration` uses the iteration-th slice of the buffers (wrapping).
static void place(const Ctx* x, size_t send_elems, size_t recv_elems, int iteration,
                  const float** send, float** recv) {
  size_t total = (send_elems > recv_elems ? send_elems : recv_elems) * sizeof(float);
  size_t slots = total > 0 ? x->buf_bytes / total : 1;
  if (slots < 1) slots = 1;
  size_t shift = total * ((size_t)iteration % slots);
  *send = (const float*)((const char*)x->send + shift);
  *recv = (float*)((char*)x->recv + shift);
}

static float input(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 13)) % 16); }

// One checked call; returns the number of wrong elements on this rank.
static long long check_once(const Ctx* x, int coll, size_t count, size_t send_elems,
                            size_t recv_elems, int root) {
  for (size_t i = 0; i < send_elems; ++i) x->send[i] = input(x->rank, i);
  for (size_t i = 0; i < recv_elems; ++i) x->recv[i] = -1.0f;
  if (call(x, coll, count, x->send, x->recv, root) != MPI_SUCCESS) return (long long)recv_elems;
  long long wrong = 0;
  int n = x->nranks;
  for (size_t i = 0; i < recv_elems; ++i) {
    float want = 0.0f;
    // Reduce and Gather fill the root's buffer only; the others' stays as it was.
    if ((coll == kReduce || coll == kGather) && x->rank != root) {
      if (x->recv[i] != -1.0f) ++wrong;
      continue;
    }
    switch (coll) {
      case kAllreduce:
        for (int r = 0; r < n; ++r) want += input(r, i);
        break;
      case kReduce:
        for (int r = 0; r < n; ++r) want += input(r, i);
        break;
      case kReduceScatter:
        for (int r = 0; r < n; ++r) want += input(r, (size_t)x->rank * count + i);
        break;
      case kScatter: want = input(root, (size_t)x->rank * count + i); break;
      case kGather: want = input((int)(i / count), i % count); break;
      case kAllgather: want = input((int)(i / count), i % count); break;
      case kAlltoall: want = input((int)(i / count), (size_t)x->rank * count + i % count); break;
      default: want = input(root, i); break;
    }
    if (x->recv[i] != want) ++wrong;
  }
  return wrong;
}

typedef struct {
  size_t bytes, count;
  double time_us, time_max_us, algbw, busbw;
  long long wrong;
} Row;

static double combine(double mine, int average, int nranks) {
  double out = mine;
  switch (average) {
    case 0: MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); break;
    case 2: MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); break;
    case 3: MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); break;
    default:
      MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      out /= nranks;
      break;
  }
  return out;
}

// Runs one collective over the size range; returns the number of rows written to rows[].
static int run_coll(const Ctx* x, const Options* o, int coll, Row* rows, int max_rows, int* failed) {
  size_t count, se, re;
  const float* s;
  float* r;
  // Warm-up at the largest and at the smallest size that has elements.
  size_t ends[2] = {o->max_bytes, o->min_bytes};
  for (int e = 0; e < 2; ++e) {
    if (!layout(coll, ends[e], x->nranks, &count, &se, &re)) continue;
    for (int w = 0; w < o->warmup; ++w) {
      place(x, se, re, w, &s, &r);
      if (call(x, coll, count, s, r, o->root) != MPI_SUCCESS) *failed = 1;
    }
  }
  int nrows = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && nrows < max_rows;) {
    if (layout(coll, bytes, x->nranks, &count, &se, &re)) {
      place(x, se, re, 0, &s, &r);
      if (call(x, coll, count, s, r, o->root) != MPI_SUCCESS) *failed = 1;  // untimed
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int it = 0; it < o->iters; ++it) {
        place(x, se, re, it, &s, &r);
        if (call(x, coll, count, s, r, o->root) != MPI_SUCCESS) *failed = 1;
      }
      double mine = (MPI_Wtime() - t0) / o->iters;
      Row* row = &rows[nrows++];
      row->bytes = (se > re ? se : re) * sizeof(float);
      row->count = count;
      double t = combine(mine, o->average, x->nranks);
      double tmax = combine(mine, 3, x->nranks);
      row->time_us = t * 1e6;
      row->time_max_us = tmax * 1e6;
      double data = (double)count * sizeof(float) *
                    ((coll == kAllreduce || coll == kBcast || coll == kReduce) ? 1 : x->nranks);
      row->algbw = data / t / 1e9;
      row->busbw = row->algbw * bus_factor(coll, x->nranks);
      long long wrong = 0;
      for (int c = 0; c < o->check; ++c) wrong += check_once(x, coll, count, se, re, o->root);
      long long total = 0;
      MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      row->wrong = o->check > 0 ? total : -1;
      if (x->rank == 0) {
        char wbuf[32];
        if (row->wrong < 0) snprintf(wbuf, sizeof wbuf, "N/A");
        else snprintf(wbuf, sizeof wbuf, "%lld", row->wrong);
        printf("%12zu  %12zu  %8s  %6s  %6d  %9.2f  %7.3f  %7.3f  %6s\n", row->bytes, row->count,
               "float", reduces(coll) ? "sum" : "none", rooted(coll) ? o->root : -1, row->time_us,
               row->algbw, row->busbw, wbuf);
        fflush(stdout);
      }
      if (row->wrong > 0) *failed = 1;
    }
    if (bytes > o->max_bytes / o->step_factor) break;
    bytes *= o->step_factor;
  }
  return nrows;
}

int main(int argc, char** argv) {
  // MPI_THREAD_MULTIPLE (THREAD_MULTIPLE=1 in the environment): the library makes its calls
  // thread-safe, as a Chorus or NCCL communicator's are, and pays for the locks.
  const char* multiple = getenv("THREAD_MULTIPLE");
  if (multiple != NULL && strcmp(multiple, "1") == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
      fprintf(stderr, "chorus_mpi_coll_bench: MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
      MPI_Finalize();
      return 2;
    }
  } else {
    MPI_Init(&argc, &argv);
  }
  Ctx x;
  MPI_Comm_rank(MPI_COMM_WORLD, &x.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &x.nranks);
  Options o;
  int p = parse_args(argc, argv, &o);
  if (p <= 0) {
    if (x.rank == 0) usage(p == 0 ? stdout : stderr);
    MPI_Finalize();
    return p == 0 ? 0 : 2;
  }
  if (o.root >= x.nranks) {
    if (x.rank == 0) fprintf(stderr, "chorus_mpi_coll_bench: root %d is not a rank\n", o.root);
    MPI_Finalize();
    return 2;
  }
  size_t page = 4096;
  x.buf_bytes = (o.max_bytes + page - 1) / page * page;
  x.send = aligned_alloc(page, x.buf_bytes);
  x.recv = aligned_alloc(page, x.buf_bytes);
  if (!x.send || !x.recv) {
    fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes\n", x.rank, x.buf_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(x.send, 0, x.buf_bytes);  // touched once before any timing
  memset(x.recv, 0, x.buf_bytes);

  int version, subversion, len;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  MPI_Get_version(&version, &subversion);
  MPI_Get_library_version(lib, &len);
  char* nl = strchr(lib, '\n');
  if (nl) *nl = '\0';
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  if (x.rank == 0) {
    printf("# chorus_mpi_coll_bench: %s (MPI %d.%d)\n", lib, version, subversion);
    printf("#  nranks %d  minBytes %zu  maxBytes %zu  step: %zu(factor)  warmup iters: %d  "
           "iters: %d  validation: %d  average: %d  host %s\n",
           x.nranks, o.min_bytes, o.max_bytes, o.step_factor, o.warmup, o.iters, o.check,
           o.average, host);
  }

  FILE* jf = NULL;
  if (x.rank == 0 && o.json) {
    jf = fopen(o.json, "w");
    if (!jf) fprintf(stderr, "chorus_mpi_coll_bench: cannot write %s: %s\n", o.json, strerror(errno));
  }
  if (jf) {
    fprintf(jf, "{\"tool\": \"chorus_mpi_coll_bench\", \"library\": \"");
    for (const char* c = lib; *c; ++c) {
      if (*c == '"' || *c == '\\') fputc('\\', jf);
      if ((unsigned char)*c >= 0x20) fputc(*c, jf);
    }
    fprintf(jf, "\", \"nranks\": %d, \"iters\": %d, \"warmup\": %d, \"average\": %d, "
                "\"placement\": \"out_of_place\", \"results\": [",
            x.nranks, o.iters, o.warmup, o.average);
  }
  int failed = 0, first = 1;
  enum { kMaxRows = 128 };
  Row rows[kMaxRows];
  for (int c = 0; c < kNumColls; ++c) {
    if (!o.colls[c]) continue;
    if (x.rank == 0) {
      printf("#\n# %s (%s)\n#%11s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", kCollNames[c],
             kCollCalls[c], "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
             "#wrong");
      printf("#%11s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s\n", "(B)", "(elements)", "", "", "",
             "(us)", "(GB/s)", "(GB/s)", "");
    }
    int n = run_coll(&x, &o, c, rows, kMaxRows, &failed);
    for (int i = 0; jf && i < n; ++i, first = 0) {
      fprintf(jf,
              "%s\n  {\"collective\": \"%s\", \"size\": %zu, \"count\": %zu, \"time_us\": %.4f, "
              "\"time_max_us\": %.4f, \"algbw\": %.6f, \"busbw\": %.6f, \"nwrong\": %lld}",
              first ? "" : ",", kCollNames[c], rows[i].bytes, rows[i].count, rows[i].time_us,
              rows[i].time_max_us, rows[i].algbw, rows[i].busbw, rows[i].wrong);
    }
  }
  if (jf) {
    fprintf(jf, "\n], \"ok\": %s}\n", failed ? "false" : "true");
    fclose(jf);
  }
  if (x.rank == 0) printf("# %s\n", failed ? "FAILED" : "OK");
  free(x.send);
  free(x.recv);
  MPI_Finalize();
  return failed ? 1 : 0;
}
