// SPDX-License-Identifier: Apache-2.0
// File: bench/rdma/sendrecv_lat.cc
// sendrecv_lat: the one-way latency of ncclSend/ncclRecv, measured as perftest's ib_send_lat
// measures a device's: a ping-pong between two ranks, rank 0 sends and then receives, rank 1
// receives and then sends back, and each round trip's time over two is one sample. Printed in
// ib_send_lat's columns (microseconds): bytes, iterations, t_min, t_max, t_typical (the median),
// t_avg, t_stdev, 99% and 99.9% percentiles. Every message carries non-integer values of its
// own iteration, checked on arrival; a wrong one fails the run.
//
// sendrecv_perf's time for the same size is something else: both ranks send and receive at once
// (a bidirectional exchange), so where the two ranks share CPUs it does twice a ping-pong's
// work per step. bench/rdma/perftest_ratio.sh prints both against ib_send_lat.
//
// -m bw and -m bibw measure bandwidth as perftest's ib_write_bw (and ib_write_bw -b) and the OSU
// benchmarks' osu_bw (osu_bibw) do: a stream of messages in one direction, a window of W sends
// posted at once (one ncclGroupStart/End) and received into W distinct buffers, then a 4-byte
// acknowledgement back; bibw: both ranks send a window and receive one at the same time. One
// sample is one window; printed in ib_write_bw's columns: bytes, iterations (windows x W), BW
// average in MB/s of 2^20 bytes (bibw: both directions summed, as ib_write_bw -b), message rate.
//
//   chorus-run -n 2 sendrecv_lat [-m lat|bw|bibw] [-s bytes] [-n iterations] [-w warmup]
//                                [-W window] [-R 0|1]
// -R 1: the buffers come from ncclMemAlloc and are registered with ncclCommRegister.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/coll/world.h"

namespace {

enum class Mode { kLatency, kBandwidth, kBidirectional };

struct Options {
  Mode mode = Mode::kLatency;
  int window = 16;  // bw, bibw: messages per sample
  size_t bytes = 8;
  int iters = 1000;
  int warmup = 50;
  bool registered = false;
};

bool parse_int(const char* text, long min, long max, long* out) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

// Returns an error message, or an empty string when the options are good.
std::string parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") return "help";
    if (i + 1 >= argc) return "option " + flag + " needs a value";
    long v = 0;
    const char* value = argv[++i];
    if (flag == "-m") {
      std::string m = value;
      if (m == "lat") {
        o->mode = Mode::kLatency;
      } else if (m == "bw") {
        o->mode = Mode::kBandwidth;
      } else if (m == "bibw") {
        o->mode = Mode::kBidirectional;
      } else {
        return "bad option -m " + m + " (lat, bw or bibw)";
      }
    } else if (flag == "-W" && parse_int(value, 1, 1024, &v)) {
      o->window = static_cast<int>(v);
    } else if (flag == "-s" && parse_int(value, 4, 1L << 30, &v) && v % 4 == 0) {
      o->bytes = static_cast<size_t>(v);
    } else if (flag == "-n" && parse_int(value, 1, 100000000, &v)) {
      o->iters = static_cast<int>(v);
    } else if (flag == "-w" && parse_int(value, 0, 100000000, &v)) {
      o->warmup = static_cast<int>(v);
    } else if (flag == "-R" && parse_int(value, 0, 1, &v)) {
      o->registered = v == 1;
    } else {
      return "bad option " + flag + " " + value + " (-s bytes, a multiple of 4; -n iterations >= 1;"
             " -w warmup >= 0; -W window 1-1024; -R 0|1)";
    }
  }
  return "";
}

bool ok(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return true;
  std::fprintf(stderr, "sendrecv_lat: %s failed: %s (%s)\n", what, ncclGetErrorString(r),
               comm != nullptr ? ncclGetLastError(comm) : "");
  return false;
}

// The value element e of the message that `rank` sends in iteration `it` carries: not an integer,
// different for every iteration, rank and element.
float value_of(int rank, int it, size_t e) {
  return static_cast<float>(it) * 0.25f + static_cast<float>(rank) * 0.5f +
         static_cast<float>(e % 1024) * 1.0f / 1024.0f + 0.125f;
}

void fill(float* p, size_t n, int rank, int it) {
  // Only the first and last elements change per iteration: filling a large message every
  // iteration would add the fill to the latency.
  p[0] = value_of(rank, it, 0);
  p[n - 1] = value_of(rank, it, n - 1);
}

bool check(const float* p, size_t n, int from, int it) {
  return p[0] == value_of(from, it, 0) && p[n - 1] == value_of(from, it, n - 1);
}

struct Buffer {
  void* ptr = nullptr;
  void* handle = nullptr;
  bool from_nccl = false;
};

bool allocate(ncclComm_t comm, size_t bytes, bool registered, Buffer* b) {
  if (registered) {
    if (!ok(ncclMemAlloc(&b->ptr, bytes), "ncclMemAlloc", comm)) return false;
    b->from_nccl = true;
    return ok(ncclCommRegister(comm, b->ptr, bytes, &b->handle), "ncclCommRegister", comm);
  }
  b->ptr = std::calloc(1, bytes);
  return b->ptr != nullptr;
}

void release(ncclComm_t comm, Buffer* b) {
  if (b->handle != nullptr) ncclCommDeregister(comm, b->handle);
  if (b->from_nccl) {
    ncclMemFree(b->ptr);
  } else {
    std::free(b->ptr);
  }
}

// Runs the ping-pong; rank 0 fills `samples` (microseconds, one way). Returns false on an error
// or a wrong message.
bool time_round_trips(ncclComm_t comm, int rank, const Options& o, float* send, float* recv,
               std::vector<double>* samples) {
  const size_t n = o.bytes / sizeof(float);
  const int peer = 1 - rank;
  for (int it = -o.warmup; it < o.iters; ++it) {
    auto start = std::chrono::steady_clock::now();
    if (rank == 0) {
      fill(send, n, rank, it + o.warmup);
      if (!ok(ncclSend(send, n, ncclFloat32, peer, comm, nullptr), "ncclSend", comm)) return false;
      if (!ok(ncclRecv(recv, n, ncclFloat32, peer, comm, nullptr), "ncclRecv", comm)) return false;
    } else {
      if (!ok(ncclRecv(recv, n, ncclFloat32, peer, comm, nullptr), "ncclRecv", comm)) return false;
      fill(send, n, rank, it + o.warmup);
      if (!ok(ncclSend(send, n, ncclFloat32, peer, comm, nullptr), "ncclSend", comm)) return false;
    }
    auto end = std::chrono::steady_clock::now();
    if (!check(recv, n, peer, it + o.warmup)) {
      std::fprintf(stderr, "sendrecv_lat: rank %d, iteration %d: wrong data from rank %d\n", rank,
                   it + o.warmup, peer);
      return false;
    }
    if (rank == 0 && it >= 0) {
      samples->push_back(std::chrono::duration<double, std::micro>(end - start).count() / 2);
    }
  }
  return true;
}

// Runs the bandwidth test (-m bw, bibw): each sample is one window of o.window messages from
// (and, bibw, to) distinct slices of `send` and `recv`, o.window * o.bytes each; bw ends a window
// with a 4-byte acknowledgement from rank 1 into `ack`. Rank 0 fills `samples` (microseconds per
// window). Returns false on an error or a wrong message.
bool time_windows(ncclComm_t comm, int rank, const Options& o, float* send, float* recv,
                  float* ack, std::vector<double>* samples) {
  const size_t n = o.bytes / sizeof(float);
  const int peer = 1 - rank;
  const bool both = o.mode == Mode::kBidirectional;
  const bool sends = both || rank == 0, recvs = both || rank == 1;
  for (int it = -o.warmup; it < o.iters; ++it) {
    const int first = (it + o.warmup) * o.window;  // the window's first message number
    auto start = std::chrono::steady_clock::now();
    if (!ok(ncclGroupStart(), "ncclGroupStart", comm)) return false;
    for (int w = 0; w < o.window && sends; ++w) {
      fill(send + w * n, n, rank, first + w);
      if (!ok(ncclSend(send + w * n, n, ncclFloat32, peer, comm, nullptr), "ncclSend", comm)) {
        return false;
      }
    }
    for (int w = 0; w < o.window && recvs; ++w) {
      if (!ok(ncclRecv(recv + w * n, n, ncclFloat32, peer, comm, nullptr), "ncclRecv", comm)) {
        return false;
      }
    }
    if (!ok(ncclGroupEnd(), "ncclGroupEnd", comm)) return false;
    if (!both) {  // the receiver says it has the whole window
      ncclResult_t r = rank == 1 ? ncclSend(ack, 1, ncclFloat32, peer, comm, nullptr)
                                 : ncclRecv(ack, 1, ncclFloat32, peer, comm, nullptr);
      if (!ok(r, "acknowledgement", comm)) return false;
    }
    auto end = std::chrono::steady_clock::now();
    for (int w = 0; w < o.window && recvs; ++w) {
      if (!check(recv + w * n, n, peer, first + w)) {
        std::fprintf(stderr, "sendrecv_lat: rank %d, message %d: wrong data from rank %d\n", rank,
                     first + w, peer);
        return false;
      }
    }
    if (rank == 0 && it >= 0) {
      samples->push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
  }
  return true;
}

// Bandwidth in ib_write_bw's columns: MB/s of 2^20 bytes, the peak from the fastest window.
void report_bandwidth(const Options& o, const std::vector<double>& s) {
  double sum = 0;
  for (double x : s) sum += x;
  const double fastest = *std::min_element(s.begin(), s.end());
  const double per_window =
      static_cast<double>(o.window) * (o.mode == Mode::kBidirectional ? 2 : 1);
  const double bytes = per_window * static_cast<double>(o.bytes);
  const double mib_per_us = bytes / 1048576.0;
  std::printf("# sendrecv_lat -m %s: %s of ncclSend/ncclRecv, windows of %d messages, %s buffers\n",
              o.mode == Mode::kBandwidth ? "bw" : "bibw",
              o.mode == Mode::kBandwidth ? "one-way bandwidth" : "bidirectional bandwidth (sum)",
              o.window, o.registered ? "registered" : "unregistered");
  std::printf(" %-10s %-12s %-18s %-21s %-14s\n", "#bytes", "#iterations", "BW peak[MB/sec]",
              "BW average[MB/sec]", "MsgRate[Mpps]");
  std::printf(" %-10zu %-12lld %-18.2f %-21.2f %-14.6f\n", o.bytes,
              static_cast<long long>(o.iters) * o.window, mib_per_us / fastest * 1e6,
              mib_per_us * static_cast<double>(s.size()) / sum * 1e6,
              per_window * static_cast<double>(s.size()) / sum);
}

void report(const Options& o, std::vector<double> s) {
  std::sort(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += x;
  const double avg = sum / static_cast<double>(s.size());
  double var = 0;
  for (double x : s) var += (x - avg) * (x - avg);
  auto pct = [&](double p) {
    size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(s.size()))) - 1;
    return s[std::min(i, s.size() - 1)];
  };
  std::printf("# sendrecv_lat: one-way latency of ncclSend/ncclRecv (round trip / 2), %s buffers\n",
              o.registered ? "registered" : "unregistered");
  std::printf(" %-10s %-12s %-10s %-10s %-14s %-10s %-12s %-10s %-10s\n", "#bytes",
              "#iterations", "t_min[us]", "t_max[us]", "t_typical[us]", "t_avg[us]",
              "t_stdev[us]", "99%[us]", "99.9%[us]");
  std::printf(" %-10zu %-12d %-10.2f %-10.2f %-14.2f %-10.2f %-12.2f %-10.2f %-10.2f\n", o.bytes,
              o.iters, s.front(), s.back(), s[s.size() / 2], avg,
              std::sqrt(var / static_cast<double>(s.size())), pct(0.99), pct(0.999));
}

}  // namespace

int main(int argc, char** argv) {
  using chorus::bench::join_world;
  using chorus::bench::leave_world;
  chorus::bench::JoinedWorld joined = join_world(&argc, &argv);
  Options o;
  std::string error = joined.error.empty() ? parse(argc, argv, &o) : joined.error;
  if (error.empty() && joined.world.nprocs != 2) {
    error = "needs exactly 2 processes (chorus-run -n 2), got " +
            std::to_string(joined.world.nprocs);
  }
  if (!error.empty()) {
    if (joined.world.proc == 0) {
      std::fprintf(stderr,
                   "%s%susage: chorus-run -n 2 sendrecv_lat [-m lat|bw|bibw] [-s bytes] "
                   "[-n iterations] [-w warmup] [-W window] [-R 0|1]\n",
                   error == "help" ? "" : ("sendrecv_lat: " + error).c_str(),
                   error == "help" ? "" : "\n");
    }
    leave_world(joined.world, error != "help");
    return error == "help" ? 0 : 2;
  }
  const int rank = joined.world.proc;
  ncclComm_t comm = nullptr;
  bool good = ok(ncclCommInitRank(&comm, 2, joined.world.id, rank), "ncclCommInitRank", nullptr);
  Buffer send, recv, ack;
  std::vector<double> samples;
  const bool streams = o.mode != Mode::kLatency;
  const size_t slices = streams ? static_cast<size_t>(o.window) : 1;
  good = good && allocate(comm, o.bytes * slices, o.registered, &send) &&
         allocate(comm, o.bytes * slices, o.registered, &recv) &&
         allocate(comm, sizeof(float), false, &ack);
  if (good && streams) {
    good = time_windows(comm, rank, o, static_cast<float*>(send.ptr),
                        static_cast<float*>(recv.ptr), static_cast<float*>(ack.ptr), &samples);
    if (good && rank == 0) report_bandwidth(o, samples);
  } else if (good) {
    good = time_round_trips(comm, rank, o, static_cast<float*>(send.ptr),
                            static_cast<float*>(recv.ptr), &samples);
    if (good && rank == 0) report(o, samples);
  }
  if (comm != nullptr) {
    release(comm, &send);
    release(comm, &recv);
    release(comm, &ack);
    good = ok(ncclCommFinalize(comm), "ncclCommFinalize", comm) && good;
    ncclCommDestroy(comm);
  }
  leave_world(joined.world, !good);
  return good ? 0 : 1;
}
