// SPDX-License-Identifier: Apache-2.0
// File: bench/peers/tcp_bw.c
// Loopback TCP throughput between two processes, the limit that bench/compare/compare.py sets
// TCP collectives against.
//
//   chorus_tcp_bw [-s BYTES] [-c CHUNK] [-r REPS] [-a ADDRESS] [-J FILE]
//
// The process forks; the parent listens on ADDRESS (127.0.0.1) with an ephemeral port and the
// child connects: one TCP connection, default socket options (kernel autotuning) plus TCP_NODELAY.
// Each repetition (default 3) runs two tests:
//   one_way   the child sends -s bytes (1 GiB) in -c byte writes (1 MiB), the parent receives;
//             time from a start byte to the parent's receipt of the last byte;
//   both_ways each process sends -s bytes and receives -s bytes at once (a sender thread and a
//             receiving loop per process); time until both have received everything;
//             throughput is reported as the sum of both directions (2*S / t) and per direction.
// Reported: best and median over repetitions, GB/s (GB = 1e9 B). Exit status 0, or 1 on error.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static size_t g_bytes = (size_t)1 << 30;
static size_t g_chunk = (size_t)1 << 20;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char* what) {
  fprintf(stderr, "chorus_tcp_bw: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void send_all(int fd, const void* buf, size_t n) {
  const char* p = buf;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("send");
    p += w;
    n -= (size_t)w;
  }
}

static void recv_all(int fd, void* buf, size_t n) {
  char* p = buf;
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die(r == 0 ? "recv (peer closed)" : "recv");
    p += r;
    n -= (size_t)r;
  }
}

// Streams g_bytes in g_chunk writes from one buffer.
static void stream_out(int fd, const char* buf) {
  for (size_t left = g_bytes; left > 0;) {
    size_t n = left < g_chunk ? left : g_chunk;
    send_all(fd, buf, n);
    left -= n;
  }
}

// Receives g_bytes into one chunk-sized buffer (overwritten, as a socket sink).
static void stream_in(int fd, char* buf) {
  for (size_t left = g_bytes; left > 0;) {
    ssize_t r = recv(fd, buf, left < g_chunk ? left : g_chunk, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die(r == 0 ? "recv (peer closed)" : "recv");
    left -= (size_t)r;
  }
}

typedef struct {
  int fd;
  const char* buf;
} Sender;

static void* sender(void* arg) {
  Sender* s = arg;
  stream_out(s->fd, s->buf);
  return NULL;
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

int main(int argc, char** argv) {
  int reps = 3;
  const char* addr = "127.0.0.1";
  const char* json = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "-s") && i + 1 < argc) g_bytes = (size_t)strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "-c") && i + 1 < argc) g_chunk = (size_t)strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-a") && i + 1 < argc) addr = argv[++i];
    else if (!strcmp(argv[i], "-J") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: chorus_tcp_bw [-s BYTES] [-c CHUNK] [-r REPS] [-a ADDRESS] [-J FILE]\n");
      return 2;
    }
  }
  if (g_bytes < 1 || g_chunk < 1 || reps < 1 || reps > 1000) {
    fprintf(stderr, "chorus_tcp_bw: bad -s, -c or -r\n");
    return 2;
  }
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
    fprintf(stderr, "chorus_tcp_bw: bad address %s\n", addr);
    return 2;
  }
  if (bind(lfd, (struct sockaddr*)&sa, sizeof sa) != 0) die("bind");
  if (listen(lfd, 1) != 0) die("listen");
  socklen_t sl = sizeof sa;
  if (getsockname(lfd, (struct sockaddr*)&sa, &sl) != 0) die("getsockname");

  char* buf = malloc(g_chunk);
  char* sink = malloc(g_chunk);
  if (!buf || !sink) die("malloc");
  memset(buf, 0x5a, g_chunk);
  memset(sink, 0, g_chunk);

  pid_t child = fork();
  if (child < 0) die("fork");
  int one = 1;
  if (child == 0) {  // the child: connects, then follows the parent's start bytes
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int r = 0; r < reps; ++r) {
      char go;
      recv_all(fd, &go, 1);
      stream_out(fd, buf);  // one way
      recv_all(fd, &go, 1);
      Sender s = {fd, buf};
      pthread_t t;
      if (pthread_create(&t, NULL, sender, &s) != 0) die("pthread_create");
      stream_in(fd, sink);  // both ways
      pthread_join(t, NULL);
      send_all(fd, "d", 1);
    }
    close(fd);
    _exit(0);
  }
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  double* one_way = calloc((size_t)reps, sizeof(double));
  double* both = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    send_all(fd, "g", 1);
    stream_in(fd, sink);
    one_way[r] = (double)g_bytes / (now() - t0) / 1e9;
    t0 = now();
    send_all(fd, "g", 1);
    Sender s = {fd, buf};
    pthread_t t;
    if (pthread_create(&t, NULL, sender, &s) != 0) die("pthread_create");
    stream_in(fd, sink);
    pthread_join(t, NULL);
    char done;
    recv_all(fd, &done, 1);  // the child has received everything too
    both[r] = 2.0 * (double)g_bytes / (now() - t0) / 1e9;
  }
  int status = 0;
  waitpid(child, &status, 0);
  close(fd);
  close(lfd);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "chorus_tcp_bw: the child failed\n");
    return 1;
  }
  qsort(one_way, (size_t)reps, sizeof(double), cmp_double);
  qsort(both, (size_t)reps, sizeof(double), cmp_double);
  double ob = one_way[reps - 1], om = one_way[reps / 2], bb = both[reps - 1], bm = both[reps / 2];
  printf("# chorus_tcp_bw: %s, %zu bytes per direction in %zu-byte writes, %d repetitions, GB = 1e9 B\n",
         addr, g_bytes, g_chunk, reps);
  printf("  one way:   best %.3f GB/s  median %.3f GB/s\n", ob, om);
  printf("  both ways: best %.3f GB/s  median %.3f GB/s (sum of both directions; per direction %.3f)\n",
         bb, bm, bm / 2);
  if (json) {
    FILE* jf = fopen(json, "w");
    if (!jf) die(json);
    fprintf(jf,
            "{\"tool\": \"chorus_tcp_bw\", \"address\": \"%s\", \"bytes\": %zu, \"chunk\": %zu, "
            "\"reps\": %d, \"one_way_gbps_best\": %.4f, \"one_way_gbps_median\": %.4f, "
            "\"both_ways_gbps_best\": %.4f, \"both_ways_gbps_median\": %.4f}\n",
            addr, g_bytes, g_chunk, reps, ob, om, bb, bm);
    fclose(jf);
  }
  return 0;
}
