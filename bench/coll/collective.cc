// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/collective.cc
// The nine descriptors. Counts and factors follow nccl-tests (src/<coll>.cu): vector
// collectives use count / nranks elements per rank, so the size column stays the total.
#include "bench/coll/collective.h"

namespace chorus::bench {

namespace {

using verify::Coll;

double factor_one(int) { return 1.0; }
double factor_ring(int n) { return static_cast<double>(n - 1) / n; }
double factor_allreduce(int n) { return 2.0 * (n - 1) / n; }

// Send and receive the whole message (AllReduce, Broadcast, Reduce, SendRecv).
Layout whole(size_t count, int) { return {count, count, count, 0, 0}; }

// Every rank sends count/n elements and receives n blocks (AllGather, Gather).
Layout gathering(size_t count, int n) {
  size_t block = count / static_cast<size_t>(n);
  return {block, block * n, block, block, 0};
}

// Every rank sends n blocks and receives one (ReduceScatter, Scatter).
Layout scattering(size_t count, int n) {
  size_t block = count / static_cast<size_t>(n);
  return {block * n, block, block, 0, block};
}

// n blocks each way, one per peer (AlltoAll).
Layout exchanging(size_t count, int n) {
  size_t block = count / static_cast<size_t>(n);
  return {block * n, block * n, block, 0, 0};
}

ncclResult_t send_recv(const CallArgs& a) {
  int next = (a.rank + 1) % a.nranks, prev = (a.rank + a.nranks - 1) % a.nranks;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = ncclSend(a.send, a.count, a.dtype, next, a.comm, a.stream);
  if (r == ncclSuccess) r = ncclRecv(a.recv, a.count, a.dtype, prev, a.comm, a.stream);
  ncclResult_t end = ncclGroupEnd();
  return r == ncclSuccess ? end : r;
}

const Collective kCollectives[] = {
    {Coll::kAllReduce, "all_reduce_perf", whole, false, factor_allreduce, true,
     [](const CallArgs& a) {
       return ncclAllReduce(a.send, a.recv, a.count, a.dtype, a.op, a.comm, a.stream);
     },
     [](const CallArgs& a) {
       return chorusAllReduceCompressed(a.send, a.recv, a.count, a.dtype, a.op, a.compressor,
                                        a.comm, a.stream);
     }},
    {Coll::kReduceScatter, "reduce_scatter_perf", scattering, true, factor_ring, true,
     [](const CallArgs& a) {
       return ncclReduceScatter(a.send, a.recv, a.count, a.dtype, a.op, a.comm, a.stream);
     },
     [](const CallArgs& a) {
       return chorusReduceScatterCompressed(a.send, a.recv, a.count, a.dtype, a.op, a.compressor,
                                            a.comm, a.stream);
     }},
    {Coll::kAllGather, "all_gather_perf", gathering, true, factor_ring, true,
     [](const CallArgs& a) {
       return ncclAllGather(a.send, a.recv, a.count, a.dtype, a.comm, a.stream);
     },
     [](const CallArgs& a) {
       return chorusAllGatherCompressed(a.send, a.recv, a.count, a.dtype, a.compressor, a.comm,
                                        a.stream);
     }},
    {Coll::kBroadcast, "broadcast_perf", whole, false, factor_one, true,
     [](const CallArgs& a) {
       return ncclBroadcast(a.send, a.recv, a.count, a.dtype, a.root, a.comm, a.stream);
     }, nullptr},
    {Coll::kReduce, "reduce_perf", whole, false, factor_one, true,
     [](const CallArgs& a) {
       return ncclReduce(a.send, a.recv, a.count, a.dtype, a.op, a.root, a.comm, a.stream);
     }, nullptr},
    {Coll::kAlltoAll, "alltoall_perf", exchanging, true, factor_ring, true,
     [](const CallArgs& a) {
       return ncclAlltoAll(a.send, a.recv, a.count, a.dtype, a.comm, a.stream);
     }, nullptr},
    {Coll::kGather, "gather_perf", gathering, true, factor_ring, true,
     [](const CallArgs& a) {
       return ncclGather(a.send, a.recv, a.count, a.dtype, a.root, a.comm, a.stream);
     }, nullptr},
    {Coll::kScatter, "scatter_perf", scattering, true, factor_ring, true,
     [](const CallArgs& a) {
       return ncclScatter(a.send, a.recv, a.count, a.dtype, a.root, a.comm, a.stream);
     }, nullptr},
    {Coll::kSendRecv, "sendrecv_perf", whole, false, factor_one, false, send_recv, nullptr},
};

}  // namespace

const Collective& collective(verify::Coll c) {
  for (const Collective& d : kCollectives)
    if (d.coll == c) return d;
  return kCollectives[0];  // unreachable: every Coll has a descriptor
}

double algbw_gbps(const Collective& c, size_t param_bytes, int nranks, double seconds) {
  if (seconds <= 0) return 0;
  double bytes = static_cast<double>(param_bytes);
  if (c.algbw_counts_all_ranks) bytes *= nranks;
  return bytes / 1.0e9 / seconds;
}

}  // namespace chorus::bench
