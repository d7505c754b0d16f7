// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/collective.h
// One descriptor per benchmarked collective: its tool name, how a message size becomes the
// send/receive/argument counts and in-place offsets (nccl-tests' getCollByteCount), the
// bandwidth formulas (nccl-tests' PERFORMANCE.md) and how to make the call.
#pragma once

#include <chorus/compress.h>
#include <nccl.h>

#include <cstddef>

#include "bench/common/verifiable.h"

namespace chorus::bench {

// The counts of one call at one message size, in elements of the datatype.
struct Layout {
  size_t send_count = 0;           // elements of the send buffer the call reads
  size_t recv_count = 0;           // elements of the receive buffer it writes
  size_t param_count = 0;          // the count argument of the call
  size_t send_inplace_offset = 0;  // in place: sendbuff = buffer + rank * this
  size_t recv_inplace_offset = 0;  // in place: recvbuff = buffer + rank * this
};

// The arguments of one call on one rank.
struct CallArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  int rank = 0;
  int nranks = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  chorusCompressor_t compressor = nullptr;  // --compress: the rank's compressor
};

struct Collective {
  verify::Coll coll;
  const char* tool;  // "all_reduce_perf"
  // The counts of a message of `count` elements (size / datatype size) over nranks ranks.
  Layout (*layout)(size_t count, int nranks);
  // algbw = param_count * type size * (nranks if this is set, else 1) / time
  bool algbw_counts_all_ranks;
  // busbw = algbw * bus_factor(nranks)
  double (*bus_factor)(int nranks);
  // Whether the in-place result is checked. SendRecv's "in place" sends and receives the same
  // buffer, which nccl.h leaves undefined: like nccl-tests, it is timed but shows N/A.
  bool checks_in_place;
  // Issues the call (for SendRecv: a group of one send to rank+1 and one receive from rank-1).
  ncclResult_t (*issue)(const CallArgs& a);
  // The chorus*Compressed call through a.compressor (--compress); nullptr when the collective
  // has no compressed variant.
  ncclResult_t (*issue_compressed)(const CallArgs& a);
};

const Collective& collective(verify::Coll c);

// GB/s (1e9 bytes per second) of one call of param_count elements taking `seconds`.
double algbw_gbps(const Collective& c, size_t param_bytes, int nranks, double seconds);

}  // namespace chorus::bench
