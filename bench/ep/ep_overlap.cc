// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/ep_overlap.cc
// ep_overlap: how much of MoE dispatch and combine hides under computation when they are queued
// on a host stream (chorusEpDispatchAsync / chorusEpCombineAsync, DeepEP's async_finish), the
// way a training step overlaps one micro-batch's communication with another's compute.
//
// Per iteration, with a barrier before each timed part, every rank times:
//   comm     the call alone, blocking (chorusEpDispatch, or chorusEpCombine)
//   compute  a fixed amount of arithmetic alone (calibrated once to last about as long as comm)
//   serial   the blocking call, then the compute
//   overlap  the call queued on a stream, the compute, then an event waited for
// and reports medians (max over ranks) and hidden = (serial - overlap) / min(comm, compute): the
// share of the shorter part that disappeared (1: all of it; 0: none). The outputs of the
// overlapped calls are compared bit for bit with the blocking ones' on every rank first.
// Compute and the library's copies share the CPU cores, so over shared memory on a machine with
// as many ranks as cores little can hide; across a link the call mostly waits, and it can.
//   chorus-run -n 2 ep_overlap [-T tokens] [-H hidden] [-n iters] [-w warmup]
#include <chorus/chorus.h>
#include <chorus/ep.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/coll/world.h"
#include "bench/ep/tokens.h"

namespace chorus::bench::ep {
namespace {

struct Options {
  Shape shape;  // BF16 dispatch and combine
  int iters = 10;
  int warmup = 2;
  uint64_t seed = 0;
};

[[noreturn]] void fail(int rank, const std::string& what) {
  std::fprintf(stderr, "ep_overlap: rank %d: %s\n", rank, what.c_str());
  std::exit(1);
}

void check(int rank, ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    fail(rank, fmt::format("{}: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr)));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Arithmetic that stays in the core's cache (it competes for cycles, not memory bandwidth):
// `passes` multiply-adds over a 16 KiB array. The result is returned so that none is skipped.
float compute(std::vector<float>& v, long passes) {
  for (long p = 0; p < passes; ++p)
    for (float& x : v) x = x * 0.999f + 0.001f;
  return v[0];
}

// The median of `v` (the upper one of an even count).
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct Rank {
  const Options& opt;
  ncclComm_t comm = nullptr;
  int rank = 0;
  int nranks = 0;
  void barrier() {
    float x = 0;
    check(rank, ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr), "barrier");
  }
  double max(double v) {
    check(rank, ncclAllReduce(&v, &v, 1, ncclFloat64, ncclMax, comm, nullptr), "ncclAllReduce");
    return v;
  }
};

// The four timings of one call kind, in seconds (median, max over ranks).
struct Times {
  double comm = 0, compute = 0, serial = 0, overlap = 0;
  double hidden() const { return (serial - overlap) / std::min(comm, compute); }
};

// Times `blocking` and `queued` (the same call, on `stream`) as described in the file comment.
Times measure(Rank& r, chorusStream_t stream, const std::function<void()>& blocking,
              const std::function<void()>& queued) {
  std::vector<float> work(4096, 1.0f);
  float sink = 0;
  // Calibration: passes for about the blocking call's time (the ranks take the largest count).
  r.barrier();
  auto t0 = std::chrono::steady_clock::now();
  blocking();
  const double comm_once = r.max(seconds_since(t0));
  t0 = std::chrono::steady_clock::now();
  sink += compute(work, 100);
  const double per_pass = seconds_since(t0) / 100;
  const auto passes = static_cast<long>(r.max(std::max(1.0, comm_once / per_pass)));

  chorusEvent_t done = nullptr;
  check(r.rank, chorusEventCreate(&done), "chorusEventCreate");
  std::vector<double> t[4];
  for (int it = 0; it < r.opt.warmup + r.opt.iters; ++it) {
    double s[4];
    r.barrier();
    t0 = std::chrono::steady_clock::now();
    blocking();
    s[0] = seconds_since(t0);
    r.barrier();
    t0 = std::chrono::steady_clock::now();
    sink += compute(work, passes);
    s[1] = seconds_since(t0);
    r.barrier();
    t0 = std::chrono::steady_clock::now();
    blocking();
    sink += compute(work, passes);
    s[2] = seconds_since(t0);
    r.barrier();
    t0 = std::chrono::steady_clock::now();
    queued();
    sink += compute(work, passes);
    check(r.rank, chorusEventRecord(done, stream), "chorusEventRecord");
    check(r.rank, chorusEventSynchronize(done), "chorusEventSynchronize");
    s[3] = seconds_since(t0);
    if (it >= r.opt.warmup)
      for (int i = 0; i < 4; ++i) t[i].push_back(s[i]);
  }
  check(r.rank, chorusEventDestroy(done), "chorusEventDestroy");
  if (sink == 12345.0f) std::printf(" ");  // keeps the arithmetic
  return {r.max(median(t[0])), r.max(median(t[1])), r.max(median(t[2])), r.max(median(t[3]))};
}

void run_rank(const Options& opt, const World& world) {
  Rank r{opt};
  r.rank = world.proc;
  r.nranks = world.nprocs;
  check(r.rank, ncclCommInitRank(&r.comm, r.nranks, world.id, r.rank), "ncclCommInitRank");
  const Shape& s = opt.shape;
  if (s.experts % r.nranks != 0)
    fail(r.rank, fmt::format("{} experts do not split over {} ranks", s.experts, r.nranks));
  size_t bytes = 0;
  check(r.rank, chorusEpBufferSizeHint(r.nranks, s.tokens, s.hidden, s.topk, &bytes), "size hint");
  chorusEpBuffer_t buffer = nullptr;
  check(r.rank, chorusEpBufferCreate(r.comm, bytes, &buffer), "chorusEpBufferCreate");
  chorusStream_t stream = nullptr;
  check(r.rank, chorusStreamCreate(&stream), "chorusStreamCreate");

  const RankTokens in = make_tokens(s, opt.seed, r.rank);
  const size_t capacity = s.tokens * static_cast<size_t>(r.nranks);
  const size_t row = row_bytes(s);
  const auto k = static_cast<size_t>(s.topk);
  chorusEpDispatchArgs_t a{};
  a.x = in.x.data();
  a.datatype = s.dtype;
  a.numTokens = s.tokens;
  a.hidden = s.hidden;
  a.topkIdx = in.topk_idx.data();
  a.topkWeights = in.topk_weights.data();
  a.topk = s.topk;
  a.numExperts = s.experts;
  a.expertAlignment = 1;
  // Two sets of outputs: the blocking calls' and the queued calls', compared after a first run.
  struct Outputs {
    std::vector<uint8_t> x;
    std::vector<int64_t> idx;
    std::vector<float> w;
    std::vector<uint16_t> combined;
    chorusEpDispatchOutput_t out{};
    chorusEpHandle_t handle = nullptr;
  } sync_out, async_out;
  for (Outputs* o : {&sync_out, &async_out}) {
    o->x.resize(capacity * row);
    o->idx.resize(capacity * k);
    o->w.resize(capacity * k);
    o->combined.resize(s.tokens * s.hidden);
    o->out.recvX = o->x.data();
    o->out.recvTopkIdx = o->idx.data();
    o->out.recvTopkWeights = o->w.data();
    o->out.recvCapacity = capacity;
  }
  const auto dispatch = [&](Outputs& o, chorusStream_t on) {
    if (o.handle != nullptr) chorusEpHandleDestroy(o.handle);
    o.handle = nullptr;
    check(r.rank, chorusEpDispatchAsync(buffer, &a, &o.out, &o.handle, on), "dispatch");
  };
  // Combine sends back the received rows as the experts' outputs (BF16 rows, any values do).
  const auto combine = [&](Outputs& o, chorusStream_t on) {
    check(r.rank,
          chorusEpCombineAsync(buffer, o.handle, o.x.data(), ncclBfloat16, nullptr,
                               o.combined.data(), nullptr, on),
          "combine");
  };

  dispatch(sync_out, nullptr);
  combine(sync_out, nullptr);
  dispatch(async_out, stream);
  combine(async_out, stream);
  check(r.rank, chorusStreamSynchronize(stream), "chorusStreamSynchronize");
  const size_t n = sync_out.out.numRecvTokens;
  double wrong = n != async_out.out.numRecvTokens ||
                 std::memcmp(sync_out.x.data(), async_out.x.data(), n * row) != 0 ||
                 sync_out.combined != async_out.combined;
  if (r.max(wrong) != 0) fail(r.rank, "queued and blocking calls disagree");

  const Times d = measure(
      r, stream, [&] { dispatch(sync_out, nullptr); }, [&] { dispatch(async_out, stream); });
  const Times c = measure(
      r, stream, [&] { combine(sync_out, nullptr); }, [&] { combine(async_out, stream); });
  if (r.rank == 0) {
    std::printf("# ep_overlap, Chorus %s\n", chorusBuildInfo());
    std::printf("# %d ranks, %zu tokens per rank, hidden %zu, top-%d of %d experts, bf16; "
                "median of %d iterations (max over ranks)\n",
                r.nranks, s.tokens, s.hidden, s.topk, s.experts, opt.iters);
    std::printf("%-9s %5s %10s %10s %10s %10s %8s\n", "#call", "ranks", "comm_ms", "compute_ms",
                "serial_ms", "overlap_ms", "hidden");
    for (const auto& [name, t] : {std::pair{"dispatch", d}, std::pair{"combine", c}})
      std::printf("%-9s %5d %10.2f %10.2f %10.2f %10.2f %8.2f\n", name, r.nranks, t.comm * 1e3,
                  t.compute * 1e3, t.serial * 1e3, t.overlap * 1e3, t.hidden());
  }
  for (Outputs* o : {&sync_out, &async_out})
    if (o->handle != nullptr) chorusEpHandleDestroy(o->handle);
  check(r.rank, chorusStreamDestroy(stream), "chorusStreamDestroy");
  check(r.rank, chorusEpBufferDestroy(buffer), "chorusEpBufferDestroy");
  check(r.rank, ncclCommDestroy(r.comm), "ncclCommDestroy");
}

int main_impl(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const long v = i + 1 < argc ? std::strtol(argv[i + 1], nullptr, 10) : 0;
    if ((flag == "-T" || flag == "--tokens") && v > 0) {
      opt.shape.tokens = static_cast<size_t>(v);
    } else if ((flag == "-H" || flag == "--hidden") && v > 0) {
      opt.shape.hidden = static_cast<size_t>(v);
    } else if ((flag == "-n" || flag == "--iters") && v > 0) {
      opt.iters = static_cast<int>(v);
    } else if ((flag == "-w" || flag == "--warmup") && v >= 0) {
      opt.warmup = static_cast<int>(v);
    } else {
      std::fprintf(stderr,
                   "usage: ep_overlap [-T|--tokens N] [-H|--hidden N] [-n|--iters N] "
                   "[-w|--warmup N]\n(defaults: 4096 tokens, hidden 7168, 10 iterations after "
                   "2; top-8 of 256 experts, bf16)\n");
      return flag == "-h" || flag == "--help" ? 0 : 2;
    }
    ++i;
  }
  JoinedWorld joined = join_world(&argc, &argv);
  if (!joined.error.empty()) {
    std::fprintf(stderr, "ep_overlap: %s\n", joined.error.c_str());
    return 1;
  }
  run_rank(opt, joined.world);
  leave_world(joined.world, false);
  return 0;
}

}  // namespace
}  // namespace chorus::bench::ep

int main(int argc, char** argv) { return chorus::bench::ep::main_impl(argc, argv); }
