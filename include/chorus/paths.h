/* SPDX-License-Identifier: Apache-2.0
 * File: include/chorus/paths.h
 * The paths from a communicator's rank to its peers, and what moved on each: the counters of
 * the chunk layer that cuts large messages over several paths (one per channel, spread over
 * the rails: CHORUS_NCHANNELS, CHORUS_SOCKET_IFNAME) and routes them (CHORUS_ROUTE), and what
 * the network says of each path now. Any thread may read them while operations run; sampling
 * them now and then gives each path's throughput over time.
 */
#ifndef CHORUS_PATHS_H_
#define CHORUS_PATHS_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int peer;            /* the peer's rank */
  int path;            /* the path's index among the paths to that peer (channel order) */
  char transport[16];  /* "tcp", "shm", "ucx", "verbs" */
  char name[112];      /* where it runs (TCP: "local address -> peer address"); may be "" */
  int failed;          /* 1 once the path broke; 2: it broke and its traffic goes on another
                        * path to the same peer (TCP failover, CHORUS_TCP_FAILOVER) */
  /* Chunks of messages that were cut over several paths and completed on this one, both
   * directions, their bytes, and the sum of their times from posting to completion. */
  unsigned long long chunks;
  unsigned long long bytes;
  double busySeconds;
  unsigned long long sentChunks; /* of them, those this rank sent */
  unsigned long long sentBytes;
  /* Whole messages (one chunk: small ones, or one path only) posted on this path, both
   * directions, and their bytes (counted when posted). */
  unsigned long long messages;
  unsigned long long messageBytes;
  /* The router's estimate of the path's send rate (CHORUS_ROUTE=ADAPTIVE); 0 if none yet. */
  double routeBytesPerSecond;
  /* Now, where the transport can tell (TCP: SIOCOUTQ, TCP_INFO), else 0: bytes handed to the
   * network and not acknowledged, the rate the peer lately acknowledged at, the smoothed
   * round-trip time. */
  int networkKnown;
  unsigned long long unackedBytes;
  double deliveryBytesPerSecond;
  double rttSeconds;
} chorusPathStats_t;

/* The paths of `comm` to `peer` (-1: to every peer, in peer order): writes at most `maxPaths`
 * entries into `stats` (which may be NULL when maxPaths is 0) and the number there are into
 * `*nPaths`. A peer this rank has no connection to has none. */
ncclResult_t chorusCommGetPathStats(ncclComm_t comm, int peer, chorusPathStats_t* stats,
                                    int maxPaths, int* nPaths);

/* The same as text, one line per path, for logs (as chorusCommDumpFlightRecorder: at most
 * `size` bytes with the terminating NUL into `buffer`, the full length into `*needed`). */
ncclResult_t chorusCommDumpPaths(ncclComm_t comm, char* buffer, size_t size, size_t* needed);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_PATHS_H_ */
