// SPDX-License-Identifier: Apache-2.0
// File: bench/route/path_timeline.cc
// Throughput of each path over time (issue 12, section 4): two ranks (chorus-run, one per host
// of the test bed) exchange BYTES each way in a loop (send/receive, or AllReduce) for SECONDS,
// while rank 0 samples chorusCommGetPathStats every INTERVAL ms from a thread of its own and
// writes the samples as CSV. bench/route/path_timeline.sh changes the links during the run
// (shapes a rail, loads it with iperf3) and plots the result.
//
//   path_timeline [-b BYTES] [-t SECONDS] [-i INTERVAL_MS] [-o OUT.csv] [--allreduce]
//
// CSV columns: wall-clock ns (CLOCK_REALTIME, to line up with the script's event times), path,
// bytes received on it so far (chunks, as completed), bytes sent, the router's rate estimate and
// TCP's delivery rate (bytes/s), bytes unacknowledged. The data is checked at the end: each
// rank's last received (or reduced) buffer against what the peer sent.
#include <chorus/chorus.h>
#include <chorus/launch.h>
#include <nccl.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

int64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void die(const std::string& what, ncclComm_t comm = nullptr) {
  std::fprintf(stderr, "path_timeline: %s%s%s\n", what.c_str(), comm != nullptr ? ": " : "",
               comm != nullptr ? ncclGetLastError(comm) : "");
  std::exit(1);
}

void check(ncclResult_t r, const char* call, ncclComm_t comm) {
  if (r != ncclSuccess) die(std::string(call) + " failed", comm);
}

struct Sample {
  int64_t t_ns;
  chorusPathStats_t path;
};

float value(int rank, size_t i) { return 0.25f * static_cast<float>(i % 977) + 0.5f * rank; }

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{64} << 20;
  double seconds = 10;
  int interval_ms = 20;
  std::string out_path = "path_timeline.csv";
  bool allreduce = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "-b") {
      bytes = std::stoull(next());
    } else if (a == "-t") {
      seconds = std::stod(next());
    } else if (a == "-i") {
      interval_ms = std::stoi(next());
    } else if (a == "-o") {
      out_path = next();
    } else if (a == "--allreduce") {
      allreduce = true;
    } else {
      die("unknown argument " + a + " (-b BYTES -t SECONDS -i INTERVAL_MS -o OUT.csv --allreduce)");
    }
  }
  const size_t count = bytes / sizeof(float);
  if (count == 0 || seconds <= 0 || interval_ms <= 0) die("need -b >= 4, -t > 0, -i > 0");

  ncclUniqueId id;
  int rank = 0, nranks = 0;
  if (chorusLaunchInfo(&id, &rank, &nranks) != ncclSuccess) die("start it with chorus-run");
  if (nranks != 2) die("needs exactly 2 ranks");
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank", comm);
  const int peer = 1 - rank;

  std::vector<float> send(count), recv(count);
  for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);

  std::vector<Sample> samples;
  std::atomic<bool> sampling{rank == 0};
  std::thread sampler;
  if (rank == 0) {
    samples.reserve(static_cast<size_t>(seconds * 1000 / interval_ms + 16) * 4);
    sampler = std::thread([&] {
      chorusPathStats_t paths[16];
      auto next = std::chrono::steady_clock::now();
      while (sampling.load(std::memory_order_relaxed)) {
        int n = 0;
        // Timed when the counters are read (the call waits while a pass of the driver runs).
        const bool ok = chorusCommGetPathStats(comm, peer, paths, 16, &n) == ncclSuccess;
        const int64_t t = wall_ns();
        if (ok) {
          for (int p = 0; p < n && p < 16; ++p) samples.push_back(Sample{t, paths[p]});
        }
        next += std::chrono::milliseconds(interval_ms);
        std::this_thread::sleep_until(next);
      }
    });
  }

  // Rounds go in batches of kBatch on a host stream, as nccl-tests queues its iterations, so
  // that the next round is queued while one runs; a 4-byte broadcast at the end of each batch
  // carries rank 0's decision to stop, so both ranks run as many.
  constexpr int kBatch = 4;
  chorusStream_t stream = nullptr;
  check(chorusStreamCreate(&stream), "chorusStreamCreate", comm);
  const auto start = std::chrono::steady_clock::now();
  int rounds = 0;
  for (int stop = 0; !stop;) {
    stop = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds;
    for (int k = 0; k < kBatch; ++k, ++rounds) {
      if (allreduce) {
        check(ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, stream),
              "ncclAllReduce", comm);
      } else {
        check(ncclGroupStart(), "ncclGroupStart", comm);
        check(ncclSend(send.data(), count, ncclFloat, peer, comm, stream), "ncclSend", comm);
        check(ncclRecv(recv.data(), count, ncclFloat, peer, comm, stream), "ncclRecv", comm);
        check(ncclGroupEnd(), "ncclGroupEnd", comm);
      }
    }
    check(ncclBroadcast(&stop, &stop, 1, ncclInt32, 0, comm, stream), "ncclBroadcast", comm);
    check(chorusStreamSynchronize(stream), "chorusStreamSynchronize", comm);
  }
  check(chorusStreamDestroy(stream), "chorusStreamDestroy", comm);
  if (rank == 0) {
    sampling.store(false, std::memory_order_relaxed);
    sampler.join();
  }

  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = allreduce ? value(0, i) + value(1, i) : value(peer, i);
    if (recv[i] != want) ++wrong;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("# rank %d: %d rounds of %zu bytes (%s) in %.2f s, %zu wrong elements\n", rank, rounds,
              bytes, allreduce ? "AllReduce" : "send/receive", elapsed, wrong);
  if (rank == 0) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) die("cannot write " + out_path);
    std::fprintf(f, "t_ns,path,recv_bytes,sent_bytes,route_Bps,delivery_Bps,unacked_bytes\n");
    for (const Sample& s : samples) {
      const chorusPathStats_t& p = s.path;
      std::fprintf(f, "%lld,%d,%llu,%llu,%.0f,%.0f,%llu\n", static_cast<long long>(s.t_ns), p.path,
                   p.bytes - p.sentBytes, p.sentBytes, p.routeBytesPerSecond,
                   p.deliveryBytesPerSecond, p.unackedBytes);
    }
    std::fclose(f);
    char dump[4096];
    if (chorusCommDumpPaths(comm, dump, sizeof(dump), nullptr) == ncclSuccess) std::printf("%s", dump);
  }
  ncclCommDestroy(comm);
  return wrong == 0 ? 0 : 2;
}
