// SPDX-License-Identifier: Apache-2.0
// Concurrency stress with ranks as threads: requests completed by one thread while their owner
// retires them on another (the use-after-free that the direct transport once had), streams and
// NULL-stream calls interleaved.
#include <catch2/catch.hpp>
#include <chorus/stream.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "support/rank_group.h"

namespace chorus::test {
namespace {

TEST_CASE("send/receive batches on host streams between NULL-stream collectives", "[ranks][stress]") {
  const int n = 8, iters = 150;
  RankGroup g(n);
  REQUIRE(g.init_error().empty());
  std::string f = g.run([&](int rank, ncclComm_t comm) -> std::string {
    const size_t max_count = 1 << 18;
    std::vector<float> send(max_count, static_cast<float>(rank)), recv(max_count);
    cudaStream_t stream;
    if (chorusStreamCreate(&stream) != ncclSuccess) return "stream";
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (int it = 0; it < iters; ++it) {
      int token = 1;
      if (ncclAllReduce(&token, &token, 1, ncclInt32, ncclSum, comm, nullptr) != ncclSuccess || token != n)
        return "allreduce at iteration " + std::to_string(it) + ": " + ncclGetLastError(nullptr);
      size_t count = max_count >> (it % 12);
      for (int k = 0; k < 5; ++k) {
        ncclGroupStart();
        ncclSend(send.data(), count, ncclFloat, next, comm, stream);
        ncclRecv(recv.data(), count, ncclFloat, prev, comm, stream);
        if (ncclGroupEnd() != ncclSuccess) return std::string("group: ") + ncclGetLastError(nullptr);
      }
      if (chorusStreamSynchronize(stream) != ncclSuccess)
        return "sync at iteration " + std::to_string(it) + ": " + ncclGetLastError(nullptr);
      if (recv[count - 1] != static_cast<float>(prev)) return "wrong data";
    }
    return chorusStreamDestroy(stream) == ncclSuccess ? "" : "destroy";
  });
  REQUIRE(f == "");
}

}  // namespace
}  // namespace chorus::test
