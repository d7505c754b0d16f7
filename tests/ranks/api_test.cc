// SPDX-License-Identifier: Apache-2.0
// The communicator and group API with ranks as threads: the ways to create communicators (by
// rank, all at once, in a group from one thread, scalable, non-blocking), split and shrink,
// queries, groups driven from one thread, send/receive patterns, host streams, memory.
#include <catch2/catch.hpp>
#include <chorus/chorus.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "support/coll_check.h"
#include "support/rank_group.h"
#include "support/scoped_env.h"

namespace chorus::test {
namespace {

std::string err(ncclResult_t r, const char* what) {
  return r == ncclSuccess ? "" : std::string(what) + ": " + ncclGetLastError(nullptr);
}

// Sum-AllReduce of (rank+1) on every comm given, from one thread inside a group.
std::string allreduce_from_one_thread(const std::vector<ncclComm_t>& comms) {
  int n = static_cast<int>(comms.size());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(1000));
  for (int r = 0; r < n; ++r) std::fill(bufs[r].begin(), bufs[r].end(), static_cast<float>(r + 1));
  if (ncclGroupStart() != ncclSuccess) return "group start";
  for (int r = 0; r < n; ++r)
    ncclAllReduce(bufs[r].data(), bufs[r].data(), 1000, ncclFloat, ncclSum, comms[r], nullptr);
  if (ncclGroupEnd() != ncclSuccess) return std::string("group end: ") + ncclGetLastError(nullptr);
  float want = n * (n + 1) / 2.0f;
  for (int r = 0; r < n; ++r)
    for (float v : bufs[r])
      if (v != want) return "wrong sum " + std::to_string(v);
  return "";
}

TEST_CASE("version, error strings and unique ids", "[ranks][api]") {
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  REQUIRE(v == NCCL_VERSION_CODE);
  REQUIRE(v == 22809);
  REQUIRE(std::string(ncclGetErrorString(ncclRemoteError)) ==
          "remote process exited or there was a network error");
  REQUIRE(std::string(ncclGetErrorString(static_cast<ncclResult_t>(77))) == "unknown result code");
  ncclUniqueId a, b;
  REQUIRE(ncclGetUniqueId(&a) == ncclSuccess);
  REQUIRE(ncclGetUniqueId(&b) == ncclSuccess);
  REQUIRE(std::memcmp(&a, &b, sizeof(a)) != 0);
  int cv = 0;
  REQUIRE(chorusGetVersion(&cv) == ncclSuccess);
  REQUIRE(cv == CHORUS_VERSION_CODE);
  REQUIRE(std::string(chorusBuildInfo()).find("nccl-api 2.28.9") != std::string::npos);
}

TEST_CASE("ncclCommInitRank from one thread per rank, and the queries", "[ranks][api]") {
  const int n = 3;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(n);
  std::vector<ncclResult_t> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { results[r] = ncclCommInitRank(&comms[r], n, id, r); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    REQUIRE(results[r] == ncclSuccess);
    int count = 0, rank = -1, dev = -1;
    REQUIRE(ncclCommCount(comms[r], &count) == ncclSuccess);
    REQUIRE(ncclCommUserRank(comms[r], &rank) == ncclSuccess);
    REQUIRE(ncclCommCuDevice(comms[r], &dev) == ncclSuccess);
    REQUIRE(count == n);
    REQUIRE(rank == r);
    REQUIRE(dev == r);  // its index among the ranks of this host
    ncclResult_t async = ncclInternalError;
    REQUIRE(ncclCommGetAsyncError(comms[r], &async) == ncclSuccess);
    REQUIRE(async == ncclSuccess);
  }
  REQUIRE(allreduce_from_one_thread(comms) == "");
  for (auto c : comms) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}

TEST_CASE("one thread creates and drives every rank inside groups", "[ranks][api]") {
  const int n = 4;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(n);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) REQUIRE(ncclCommInitRank(&comms[r], n, id, r) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(allreduce_from_one_thread(comms) == "");
  // Nested groups launch at the outermost end.
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  std::vector<std::vector<int>> bufs(n, std::vector<int>(10, 1));
  for (int r = 0; r < n; ++r)
    REQUIRE(ncclAllReduce(bufs[r].data(), bufs[r].data(), 10, ncclInt, ncclSum, comms[r], nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(bufs[0][0] == 1);  // not run yet: still inside the outer group
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  for (auto& b : bufs) REQUIRE(b[9] == n);
  for (auto c : comms) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}

TEST_CASE("ncclCommInitAll with a device list", "[ranks][api]") {
  ncclComm_t comms[3];
  int devs[3] = {7, 3, 5};
  REQUIRE(ncclCommInitAll(comms, 3, devs) == ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    int dev = -1;
    REQUIRE(ncclCommCuDevice(comms[r], &dev) == ncclSuccess);
    REQUIRE(dev == devs[r]);
  }
  REQUIRE(allreduce_from_one_thread({comms[0], comms[1], comms[2]}) == "");
  for (auto c : comms) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}

TEST_CASE("ncclCommInitRankScalable with several ids", "[ranks][api]") {
  const int n = 5;
  ncclUniqueId ids[2];
  REQUIRE(ncclGetUniqueId(&ids[0]) == ncclSuccess);
  REQUIRE(ncclGetUniqueId(&ids[1]) == ncclSuccess);
  std::vector<ncclComm_t> comms(n);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r)
    REQUIRE(ncclCommInitRankScalable(&comms[r], n, r, 2, ids, nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(allreduce_from_one_thread(comms) == "");
  for (auto c : comms) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}

TEST_CASE("non-blocking communicators report progress through ncclCommGetAsyncError", "[ranks][api]") {
  const int n = 2;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "nonblocking";
  std::vector<ncclComm_t> comms(n);
  for (int r = 0; r < n; ++r) {
    ncclResult_t res = ncclCommInitRankConfig(&comms[r], n, id, r, &config);
    REQUIRE((res == ncclSuccess || res == ncclInProgress));
    REQUIRE(comms[r] != nullptr);
  }
  auto wait_ready = [&](ncclComm_t c) {
    ncclResult_t state = ncclInProgress;
    for (int i = 0; i < 20000 && state == ncclInProgress; ++i) {
      REQUIRE(ncclCommGetAsyncError(c, &state) == ncclSuccess);
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return state;
  };
  for (auto c : comms) REQUIRE(wait_ready(c) == ncclSuccess);
  // A NULL-stream collective may return ncclInProgress; completion shows in the async state.
  std::vector<std::vector<double>> bufs(n, std::vector<double>(100000, 2.0));
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r)
    ncclAllReduce(bufs[r].data(), bufs[r].data(), bufs[r].size(), ncclDouble, ncclSum, comms[r], nullptr);
  ncclResult_t end = ncclGroupEnd();
  REQUIRE((end == ncclSuccess || end == ncclInProgress));
  for (auto c : comms) REQUIRE(wait_ready(c) == ncclSuccess);
  for (auto& b : bufs) REQUIRE(b[99999] == 4.0);
  for (auto c : comms) {
    ncclResult_t fin = ncclCommFinalize(c);
    REQUIRE((fin == ncclSuccess || fin == ncclInProgress));
    REQUIRE(wait_ready(c) == ncclSuccess);
    REQUIRE(ncclCommDestroy(c) == ncclSuccess);
  }
}

TEST_CASE("ncclCommSplit by color and key, and NCCL_SPLIT_NOCOLOR", "[ranks][api]") {
  const int n = 6;
  RankGroup g(n);
  std::vector<ncclComm_t> subs(n, nullptr);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    int color = r == 5 ? NCCL_SPLIT_NOCOLOR : r % 2;
    int key = -r;  // reversed order inside each color
    ncclResult_t res = ncclCommSplit(comm, color, key, &subs[r], nullptr);
    if (res != ncclSuccess) return err(res, "split");
    if (r == 5) return subs[r] == nullptr ? "" : "NOCOLOR must give NULL";
    int count = 0, rank = 0;
    ncclCommCount(subs[r], &count);
    ncclCommUserRank(subs[r], &rank);
    // color 0: ranks {0,2,4} ordered by key -> 4,2,0; color 1: {1,3} -> 3,1
    int want_count = r % 2 == 0 ? 3 : 2;
    int want_rank = r % 2 == 0 ? (4 - r) / 2 : (3 - r) / 2;
    if (count != want_count || rank != want_rank)
      return "got rank " + std::to_string(rank) + "/" + std::to_string(count);
    std::vector<int> v(64, r);
    res = ncclAllReduce(v.data(), v.data(), 64, ncclInt, ncclSum, subs[r], nullptr);
    if (res != ncclSuccess) return err(res, "allreduce on split");
    int want = r % 2 == 0 ? 0 + 2 + 4 : 1 + 3;
    return v[63] == want ? "" : "wrong sum " + std::to_string(v[63]);
  });
  REQUIRE(f == "");
  for (auto c : subs)
    if (c) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
  // The parent is still usable.
  Case c;
  c.count = 1000;
  REQUIRE(g.run([&](int, ncclComm_t comm) { return run_case(comm, c); }) == "");
}

TEST_CASE("ncclCommShrink without the excluded ranks", "[ranks][api]") {
  const int n = 4;
  RankGroup g(n);
  std::vector<ncclComm_t> subs(n, nullptr);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    if (r == 1) return "";  // excluded: does not call
    int excluded[] = {1};
    ncclResult_t res = ncclCommShrink(comm, excluded, 1, &subs[r], nullptr, NCCL_SHRINK_DEFAULT);
    if (res != ncclSuccess) return err(res, "shrink");
    int count = 0, rank = 0;
    ncclCommCount(subs[r], &count);
    ncclCommUserRank(subs[r], &rank);
    if (count != 3 || rank != (r == 0 ? 0 : r - 1)) return "bad rank/count";
    Case c;
    c.coll = Coll::kAllGather;
    c.dtype = ncclInt64;
    c.count = 777;
    return run_case(subs[r], c);
  });
  REQUIRE(f == "");
  for (auto c : subs)
    if (c) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}

TEST_CASE("sends and receives in any order within a group, including to oneself", "[ranks][api]") {
  const int n = 4;
  RankGroup g(n);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    // Every rank sends a distinct block to every rank (itself included) and receives from all,
    // posting in an order that differs per rank.
    const size_t count = 4099;
    std::vector<std::vector<int>> out(n, std::vector<int>(count)), in(n, std::vector<int>(count, -1));
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) out[p][i] = static_cast<int>(r * 1000000 + p * 10000 + i);
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    if (r % 2) std::reverse(order.begin(), order.end());
    ncclGroupStart();
    for (int p : order) {
      if (r == 2) {  // receives first
        ncclRecv(in[p].data(), count, ncclInt, p, comm, nullptr);
        ncclSend(out[p].data(), count, ncclInt, p, comm, nullptr);
      } else {
        ncclSend(out[p].data(), count, ncclInt, p, comm, nullptr);
        ncclRecv(in[p].data(), count, ncclInt, p, comm, nullptr);
      }
    }
    ncclResult_t res = ncclGroupEnd();
    if (res != ncclSuccess) return err(res, "group");
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i)
        if (in[p][i] != static_cast<int>(p * 1000000 + r * 10000 + i)) return "wrong data from " + std::to_string(p);
    return "";
  });
  REQUIRE(f == "");
}

TEST_CASE("sends grouped on one side match receives spread over several calls on the other",
          "[ranks][api]") {
  // Between a pair, the k-th send matches the k-th receive whatever the groups: rank 0 sends
  // three messages in one group, rank 1 receives them with three separate calls.
  RankGroup g(2);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    const size_t counts[3] = {7, 300000, 1};
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 3; ++k) {
      bufs.emplace_back(counts[k]);
      for (size_t i = 0; i < counts[k]; ++i) bufs[k][i] = r == 0 ? 0.25f * k + 1e-3f * i : -1.0f;
    }
    if (r == 0) {
      ncclGroupStart();
      for (int k = 0; k < 3; ++k) ncclSend(bufs[k].data(), counts[k], ncclFloat, 1, comm, nullptr);
      ncclResult_t res = ncclGroupEnd();
      return res == ncclSuccess ? "" : err(res, "group of sends");
    }
    for (int k = 0; k < 3; ++k) {
      ncclResult_t res = ncclRecv(bufs[k].data(), counts[k], ncclFloat, 0, comm, nullptr);
      if (res != ncclSuccess) return err(res, "receive");
      for (size_t i = 0; i < counts[k]; ++i)
        if (bufs[k][i] != 0.25f * k + 1e-3f * i) return "wrong data in message " + std::to_string(k);
    }
    return "";
  });
  REQUIRE(f == "");
}

TEST_CASE("small sends and receives match in order whether queued on a stream, grouped or alone",
          "[ranks][api]") {
  // Small blocking calls on an idle comm take the express path (src/core/express_p2p.cc), calls
  // on a stream are queued operations: between a pair, the k-th send still matches the k-th
  // receive. One rank sends 10 messages and the other receives them, each side mixing the paths
  // its own way; then the other way round. (A send may wait for its receive, as NCCL's: so one
  // direction at a time.)
  RankGroup g(2);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    const int peer = 1 - r, kMessages = 10;
    auto count = [](int k) { return static_cast<size_t>(5 + 3 * k); };
    auto value = [](int from, int k, size_t i) { return 0.5f * k + 1e-3f * i + 0.25f * from; };
    cudaStream_t stream = nullptr;
    if (ncclResult_t res = chorusStreamCreate(&stream); res != ncclSuccess) return err(res, "stream");
    std::string failure;
    for (int sender = 0; sender < 2 && failure.empty(); ++sender) {
      std::vector<std::vector<float>> bufs;
      for (int k = 0; k < kMessages; ++k) {
        bufs.emplace_back(count(k), -1.0f);
        if (r == sender)
          for (size_t i = 0; i < count(k); ++i) bufs[k][i] = value(r, k, i);
      }
      auto call = [&](int k, cudaStream_t s) {
        return r == sender ? ncclSend(bufs[k].data(), count(k), ncclFloat, peer, comm, s)
                           : ncclRecv(bufs[k].data(), count(k), ncclFloat, peer, comm, s);
      };
      auto grouped = [&](int k) {
        ncclGroupStart();
        call(k, nullptr);
        call(k + 1, nullptr);
        return ncclGroupEnd();
      };
      ncclResult_t res = ncclSuccess;
      if (r == sender) {
        // 0-3 on the stream, 4-7 alone and blocking, 8-9 as one blocking group.
        for (int k = 0; k < 4 && res == ncclSuccess; ++k) res = call(k, stream);
        for (int k = 4; k < 8 && res == ncclSuccess; ++k) res = call(k, nullptr);
        if (res == ncclSuccess) res = grouped(8);
      } else if (sender == 0) {
        // 0-5 alone, 6-7 as a group, 8-9 on the stream.
        for (int k = 0; k < 6 && res == ncclSuccess; ++k) res = call(k, nullptr);
        if (res == ncclSuccess) res = grouped(6);
        for (int k = 8; k < 10 && res == ncclSuccess; ++k) res = call(k, stream);
      } else {
        // 0-1 on the stream (waited for), the rest alone.
        for (int k = 0; k < 2 && res == ncclSuccess; ++k) res = call(k, stream);
        if (res == ncclSuccess) res = chorusStreamSynchronize(stream);
        for (int k = 2; k < 10 && res == ncclSuccess; ++k) res = call(k, nullptr);
      }
      if (res == ncclSuccess) res = chorusStreamSynchronize(stream);
      if (res != ncclSuccess) {
        failure = err(res, r == sender ? "sends" : "receives");
        break;
      }
      if (r == sender) continue;
      for (int k = 0; k < kMessages && failure.empty(); ++k)
        for (size_t i = 0; i < count(k); ++i)
          if (bufs[k][i] != value(peer, k, i)) {
            failure = "wrong data in message " + std::to_string(k);
            break;
          }
    }
    chorusStreamDestroy(stream);
    return failure;
  });
  REQUIRE(f == "");
}

TEST_CASE("host streams run work in order, asynchronously", "[ranks][api][stream]") {
  const int n = 3;
  RankGroup g(n);
  std::string f = g.run([&](int, ncclComm_t comm) -> std::string {
    cudaStream_t s;
    if (chorusStreamCreate(&s) != ncclSuccess) return "create";
    const size_t count = 1 << 20;
    std::vector<float> a(count, 1.0f), b(count);
    std::atomic<int> callbacks{0};
    // Three dependent operations and a host function, queued without waiting.
    ncclAllReduce(a.data(), a.data(), count, ncclFloat, ncclSum, comm, s);  // a = n
    ncclBroadcast(a.data(), b.data(), count, ncclFloat, 0, comm, s);         // b = n
    ncclAllReduce(b.data(), b.data(), count, ncclFloat, ncclSum, comm, s);  // b = n*n
    chorusLaunchHostFunc(s, [](void* arg) { static_cast<std::atomic<int>*>(arg)->fetch_add(1); },
                         &callbacks);
    ncclResult_t q = chorusStreamQuery(s);
    if (q != ncclSuccess && q != ncclInProgress) return err(q, "query");
    if (chorusStreamSynchronize(s) != ncclSuccess) return err(ncclInternalError, "sync");
    if (chorusStreamQuery(s) != ncclSuccess) return "query after sync";
    if (callbacks.load() != 1) return "host function did not run once";
    if (b[count - 1] != static_cast<float>(n * n) || a[0] != static_cast<float>(n)) return "wrong result";
    // Work queued on a stream may also be consumed by NULL-stream calls that follow it.
    ncclAllReduce(a.data(), a.data(), count, ncclFloat, ncclSum, comm, s);
    ncclAllReduce(a.data(), a.data(), count, ncclFloat, ncclSum, comm, nullptr);
    if (a[7] != static_cast<float>(n * n * n)) return "stream then NULL stream: wrong order";
    return chorusStreamDestroy(s) == ncclSuccess ? "" : "destroy";
  });
  REQUIRE(f == "");
}

TEST_CASE("host events order work across streams", "[ranks][api][stream][event]") {
  const int n = 2;
  RankGroup g(n);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    chorusStream_t producer = nullptr, consumer = nullptr;
    chorusEvent_t ev = nullptr, never = nullptr;
    if (chorusStreamCreate(&producer) != ncclSuccess || chorusStreamCreate(&consumer) != ncclSuccess ||
        chorusEventCreate(&ev) != ncclSuccess || chorusEventCreate(&never) != ncclSuccess)
      return "create";
    if (chorusEventQuery(never) != ncclSuccess) return "an event never recorded is not complete";
    // The producer's work ends with a slow host function; without the wait, the consumer's
    // host function would run first and see `produced` unset.
    std::atomic<int> produced{0}, seen{-1};
    const size_t count = 4099;
    std::vector<float> a(count, 0.5f * static_cast<float>(r + 1)), b(count, 0.0f);
    ncclAllReduce(a.data(), a.data(), count, ncclFloat, ncclSum, comm, producer);  // a = 1.5
    chorusLaunchHostFunc(
        producer,
        [](void* arg) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          static_cast<std::atomic<int>*>(arg)->store(1);
        },
        &produced);
    if (chorusEventRecord(ev, producer) != ncclSuccess) return "record";
    if (chorusStreamWaitEvent(consumer, ev) != ncclSuccess) return "wait event";
    struct Seen {
      std::atomic<int>* produced;
      std::atomic<int>* seen;
    } arg{&produced, &seen};
    chorusLaunchHostFunc(
        consumer, [](void* p) { auto* s = static_cast<Seen*>(p); s->seen->store(s->produced->load()); },
        &arg);
    ncclBroadcast(a.data(), b.data(), count, ncclFloat, 1, comm, consumer);  // b = a (1.5)
    if (chorusStreamSynchronize(consumer) != ncclSuccess) return "sync consumer";
    if (seen.load() != 1) return "the consumer stream ran before the event's work completed";
    if (chorusEventQuery(ev) != ncclSuccess) return "event not complete after the consumer ran";
    if (chorusEventSynchronize(ev) != ncclSuccess) return "event synchronize";
    for (size_t i = 0; i < count; i += 97)
      if (b[i] != 1.5f) return "wrong data after the wait";
    // Bad handles are refused; the NULL stream records nothing pending and waits at once.
    if (chorusEventQuery(nullptr) != ncclInvalidArgument) return "NULL event accepted";
    if (chorusEventRecord(ev, reinterpret_cast<chorusStream_t>(b.data())) != ncclInvalidArgument)
      return "unknown stream accepted";
    if (chorusEventRecord(ev, nullptr) != ncclSuccess || chorusEventQuery(ev) != ncclSuccess)
      return "NULL-stream record";
    if (chorusStreamWaitEvent(nullptr, ev) != ncclSuccess) return "NULL-stream wait";
    if (chorusEventDestroy(ev) != ncclSuccess || chorusEventDestroy(never) != ncclSuccess)
      return "destroy";
    if (chorusEventQuery(ev) != ncclInvalidArgument) return "destroyed event accepted";
    if (chorusStreamDestroy(producer) != ncclSuccess || chorusStreamDestroy(consumer) != ncclSuccess)
      return "stream destroy";
    return "";
  });
  REQUIRE(f == "");
}

TEST_CASE("PreMulSum reads a device-resident scalar when the collective runs", "[ranks][api]") {
  const int n = 2;
  RankGroup g(n);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    float scalar = 1.0f;
    ncclRedOp_t op;
    if (ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarDevice, comm) != ncclSuccess) return "create";
    scalar = static_cast<float>(r + 2);  // changed after creation: must be used
    std::vector<float> v(100, 1.0f);
    ncclResult_t res = ncclAllReduce(v.data(), v.data(), 100, ncclFloat, op, comm, nullptr);
    ncclRedOpDestroy(op, comm);
    if (res != ncclSuccess) return err(res, "allreduce");
    return v[50] == 2.0f + 3.0f ? "" : "scalar not read at run time";
  });
  REQUIRE(f == "");
}

TEST_CASE("memory allocation, registration and windows", "[ranks][api]") {
  RankGroup g(1);
  void* p = nullptr;
  REQUIRE(ncclMemAlloc(&p, 1000) == ncclSuccess);
  REQUIRE(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  std::memset(p, 1, 1000);
  void* handle = nullptr;
  REQUIRE(ncclCommRegister(g.comm(0), p, 1000, &handle) == ncclSuccess);
  REQUIRE(ncclCommDeregister(g.comm(0), handle) == ncclSuccess);
  ncclWindow_t win = nullptr;
  REQUIRE(ncclCommWindowRegister(g.comm(0), p, 4096, &win, NCCL_WIN_COLL_SYMMETRIC) == ncclSuccess);
  REQUIRE(ncclCommWindowDeregister(g.comm(0), win) == ncclSuccess);
  REQUIRE(ncclMemFree(p) == ncclSuccess);
}

TEST_CASE("finalize, revoke, then destroy", "[ranks][api]") {
  ncclComm_t comms[2];
  REQUIRE(ncclCommInitAll(comms, 2, nullptr) == ncclSuccess);
  REQUIRE(allreduce_from_one_thread({comms[0], comms[1]}) == "");
  REQUIRE(ncclCommFinalize(comms[0]) == ncclSuccess);
  float x = 0;
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comms[0], nullptr) == ncclInvalidUsage);
  REQUIRE(ncclCommRevoke(comms[1], NCCL_REVOKE_DEFAULT) == ncclSuccess);
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comms[1], nullptr) == ncclInvalidUsage);
  REQUIRE(ncclCommDestroy(comms[0]) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comms[1]) == ncclSuccess);
}

// A small blocking call on an idle comm runs from the caller's frame (src/core/express.cc) and is
// recorded once it ends; one that waits for a late peer shows as running while it waits.
TEST_CASE("a small blocking call waiting for a late peer is in the flight recorder",
          "[ranks][api][flight]") {
  RankGroup group(2);
  REQUIRE(group.init_error().empty());
  std::string seen;
  std::string failures = group.run([&](int rank, ncclComm_t comm) -> std::string {
    float x = static_cast<float>(rank) + 0.5f;
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      char text[8192];
      if (chorusCommDumpFlightRecorder(group.comm(0), text, sizeof(text), nullptr) != ncclSuccess)
        return "dump failed";
      seen = text;
    }
    if (ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess)
      return std::string("allreduce: ") + ncclGetLastError(comm);
    return x == 2.0f ? "" : "wrong sum " + std::to_string(x);
  });
  REQUIRE(failures.empty());
  INFO(seen);
  CHECK(seen.find("running AllReduce #0 (count 1, float, sum), 4 bytes") != std::string::npos);
  char text[8192];
  REQUIRE(chorusCommDumpFlightRecorder(group.comm(0), text, sizeof(text), nullptr) == ncclSuccess);
  INFO(text);
  CHECK(std::string(text).find("done AllReduce #0 (count 1, float, sum)") != std::string::npos);
}

TEST_CASE("ncclGroupSimulateEnd estimates without running", "[ranks][api]") {
  RankGroup g(1);
  std::vector<float> v(1 << 20, 1.0f);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, g.comm(0), nullptr) == ncclSuccess);
  REQUIRE(ncclGroupSimulateEnd(&sim) == ncclSuccess);
  REQUIRE(sim.estimatedTime > 0);
}

TEST_CASE("chorusCommSetTimeout bounds the waits of a comm, and its splits inherit it",
          "[ranks][api][timeout]") {
  RankGroup g(2);
  REQUIRE(g.init_error().empty());
  int64_t ms = 0;
  REQUIRE(chorusCommGetTimeout(g.comm(0), &ms) == ncclSuccess);
  CHECK(ms == params::kTimeoutMs.get());
  CHECK(chorusCommSetTimeout(g.comm(0), 0) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("timeoutMs is 0") != std::string::npos);
  CHECK(chorusCommSetTimeout(nullptr, 100) == ncclInvalidArgument);
  CHECK(chorusCommGetTimeout(g.comm(0), nullptr) == ncclInvalidArgument);

  // Two children per rank, split after the parent's timeout is set: the small call (the
  // express path) and the large one (a queued operation) each break their own child.
  std::vector<ncclComm_t> small(2, nullptr), large(2, nullptr);
  std::atomic<bool> rank0_done{false};
  std::vector<std::string> errors(2);
  std::string f = g.run([&](int r, ncclComm_t comm) -> std::string {
    if (ncclResult_t res = chorusCommSetTimeout(comm, 400); res != ncclSuccess)
      return err(res, "set timeout");
    if (ncclResult_t res = ncclCommSplit(comm, 0, r, &small[r], nullptr); res != ncclSuccess)
      return err(res, "split");
    if (ncclResult_t res = ncclCommSplit(comm, 0, r, &large[r], nullptr); res != ncclSuccess)
      return err(res, "split");
    int64_t inherited = 0;
    chorusCommGetTimeout(large[r], &inherited);
    if (inherited != 400) return "the split's timeout is " + std::to_string(inherited);
    if (r == 1) {  // silent until rank 0 gave up on both
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return "";
    }
    float x = 0.5f;
    if (ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, small[r], nullptr) != ncclRemoteError)
      return "the small AllReduce did not fail";
    errors[0] = ncclGetLastError(small[r]);
    std::vector<float> v(1 << 20, 0.25f);
    if (ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, large[r], nullptr) !=
        ncclRemoteError)
      return "the large AllReduce did not fail";
    errors[1] = ncclGetLastError(large[r]);
    rank0_done = true;
    return "";
  });
  REQUIRE(f.empty());
  for (const std::string& e : errors) {
    INFO(e);
    CHECK(e.find("(timeout 400 ms)") != std::string::npos);
    CHECK(e.find("waiting for rank 1") != std::string::npos);
  }
  for (int r = 0; r < 2; ++r) {
    REQUIRE(ncclCommAbort(small[r]) == ncclSuccess);
    REQUIRE(ncclCommAbort(large[r]) == ncclSuccess);
  }
  // The parent is untouched.
  Case c;
  c.count = 1000;
  REQUIRE(g.run([&](int, ncclComm_t comm) { return run_case(comm, c); }) == "");
}

}  // namespace
}  // namespace chorus::test

// Transports come from the registry: CHORUS_TRANSPORT names one of them (any case), and a
// name the build does not have is a clear usage error listing those it has.
TEST_CASE("CHORUS_TRANSPORT forces a registered transport or names the ones there are",
          "[ranks][api][transport]") {
  for (const char* name : {"direct", "SHM", "Tcp"}) {
    chorus::test::ScopedEnv env("CHORUS_TRANSPORT", name);
    chorus::test::RankGroup group(3);
    INFO(name << ": " << group.init_error());
    REQUIRE(group.init_error().empty());
    std::string failures = group.run([](int rank, ncclComm_t comm) -> std::string {
      std::vector<float> buf(1000, 0.25f * static_cast<float>(rank + 1));
      if (ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr) !=
          ncclSuccess)
        return ncclGetLastError(comm);
      for (float v : buf)
        if (v != 1.5f) return "wrong sum " + std::to_string(v);
      return "";
    });
    CHECK(failures.empty());
  }
  chorus::test::ScopedEnv env("CHORUS_TRANSPORT", "carrier-pigeon");
  chorus::test::RankGroup group(2);
  CHECK_THAT(group.init_error(), Catch::Contains("CHORUS_TRANSPORT=carrier-pigeon names no "
                                                 "transport") &&
                                     Catch::Contains("direct, shm, tcp"));
}

// The per-path counters (include/chorus/paths.h): two TCP paths to the peer, an 8 MiB message
// each way cut into chunks over them; every byte is counted on some path, both directions.
TEST_CASE("chorusCommGetPathStats counts every chunk on its path", "[ranks][api][paths]") {
  chorus::test::ScopedEnv transport("CHORUS_TRANSPORT", "TCP");
  chorus::test::ScopedEnv channels("CHORUS_NCHANNELS", "2");
  chorus::test::RankGroup group(2);
  REQUIRE(group.init_error().empty());
  constexpr size_t kCount = size_t{2} << 20;  // 8 MiB of floats
  std::string failures = group.run([](int rank, ncclComm_t comm) -> std::string {
    const int peer = 1 - rank;
    std::vector<float> out(kCount), in(kCount, 0.0f);
    for (size_t i = 0; i < kCount; ++i) out[i] = 0.37f * static_cast<float>(i % 1013) + rank;
    ncclGroupStart();
    ncclSend(out.data(), kCount, ncclFloat, peer, comm, nullptr);
    ncclRecv(in.data(), kCount, ncclFloat, peer, comm, nullptr);
    if (ncclGroupEnd() != ncclSuccess) return ncclGetLastError(comm);
    for (size_t i = 0; i < kCount; ++i)
      if (in[i] != 0.37f * static_cast<float>(i % 1013) + peer) return "wrong data";

    chorusPathStats_t stats[4];
    int n = -1;
    if (chorusCommGetPathStats(comm, peer, stats, 4, &n) != ncclSuccess) return ncclGetLastError(comm);
    if (n != 2) return "paths to the peer: " + std::to_string(n);
    unsigned long long sent = 0, received = 0;
    for (int p = 0; p < n; ++p) {
      const chorusPathStats_t& s = stats[p];
      if (s.peer != peer || s.path != p || std::string(s.transport) != "tcp" ||
          std::string(s.name).find(" -> ") == std::string::npos || s.failed != 0 ||
          s.networkKnown != 1 || s.busySeconds < 0)
        return "path " + std::to_string(p) + " described wrongly: " + s.transport + " " + s.name;
      sent += s.sentBytes;
      received += s.bytes - s.sentBytes;
    }
    if (sent != kCount * sizeof(float) || received != kCount * sizeof(float))
      return "bytes on the paths: sent " + std::to_string(sent) + ", received " + std::to_string(received);
    int all = -1;
    if (chorusCommGetPathStats(comm, -1, nullptr, 0, &all) != ncclSuccess || all != 2)
      return "paths to every peer: " + std::to_string(all);
    if (chorusCommGetPathStats(comm, rank, nullptr, 0, &all) != ncclSuccess || all != 0)
      return "paths to itself: " + std::to_string(all);
    if (chorusCommGetPathStats(comm, 2, nullptr, 0, &all) != ncclInvalidArgument ||
        std::string(ncclGetLastError(comm)).find("peer 2") == std::string::npos)
      return "peer 2 of 2 ranks was not refused";
    if (chorusCommGetPathStats(comm, peer, nullptr, 1, &all) != ncclInvalidArgument)
      return "stats NULL with maxPaths 1 was not refused";
    size_t needed = 0;
    if (chorusCommDumpPaths(comm, nullptr, 0, &needed) != ncclSuccess || needed < 2)
      return "dump length " + std::to_string(needed);
    std::string text(needed, '\0');
    if (chorusCommDumpPaths(comm, text.data(), text.size(), nullptr) != ncclSuccess)
      return ncclGetLastError(comm);
    if (text.find("peer " + std::to_string(peer) + " path 1 tcp") == std::string::npos)
      return "dump: " + text;
    return "";
  });
  CHECK(failures.empty());
}

// Send/receive pairs and collectives number their messages apart: over several paths a small
// Broadcast #k may arrive while the chunks of SendRecv #k still come in on another path, and
// must not be taken for a piece of it (it once failed as a mismatch).
TEST_CASE("a collective and a send/receive of one sequence number do not mix over several paths",
          "[ranks][api][paths]") {
  chorus::test::ScopedEnv transport("CHORUS_TRANSPORT", "TCP");
  chorus::test::ScopedEnv channels("CHORUS_NCHANNELS", "2");
  chorus::test::RankGroup group(2);
  REQUIRE(group.init_error().empty());
  constexpr size_t kCount = size_t{1} << 20;  // 4 MiB of floats: chunks over both paths
  std::string failures = group.run([](int rank, ncclComm_t comm) -> std::string {
    const int peer = 1 - rank;
    std::vector<float> out(kCount, 0.5f + rank), in(kCount);
    for (int round = 0; round < 12; ++round) {
      ncclGroupStart();
      ncclSend(out.data(), kCount, ncclFloat, peer, comm, nullptr);
      ncclRecv(in.data(), kCount, ncclFloat, peer, comm, nullptr);
      if (ncclGroupEnd() != ncclSuccess) return ncclGetLastError(comm);
      if (in.front() != 0.5f + peer || in.back() != 0.5f + peer) return "wrong data";
      int flag = rank == 0 ? round : -1;
      if (ncclBroadcast(&flag, &flag, 1, ncclInt32, 0, comm, nullptr) != ncclSuccess)
        return ncclGetLastError(comm);
      if (flag != round) return "broadcast gave " + std::to_string(flag);
    }
    return "";
  });
  CHECK(failures.empty());
}
