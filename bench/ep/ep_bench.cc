// SPDX-License-Identifier: Apache-2.0
// File: bench/ep/ep_bench.cc
// ep_bench: MoE dispatch and combine in DeepEP's terms (bench/ep/README.md). For each dispatch
// datatype it times, in the same run and interleaved, chorusEpDispatch + chorusEpCombine
// (include/chorus/ep.h) and the AlltoAllv baseline users write without an EP library
// (baseline.h), after checking once that both give the same results on every rank. Ranks are
// processes (chorus-run, mpirun, torchrun) x threads (-t); rank 0 prints the table.
//
// Modes (--mode): "normal" (DeepEP's normal mode) is run_normal() here; "ll" (DeepEP's
// low-latency mode: 128 tokens, per-expert layout, FP8 cast in the dispatch, hooks) is
// run_low_latency() in low_latency.cc.
#include <chorus/chorus.h>
#include <chorus/ep.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench/coll/world.h"
#include "bench/ep/baseline.h"
#include "bench/ep/low_latency.h"
#include "bench/ep/rank.h"
#include "bench/ep/tokens.h"

namespace chorus::bench::ep {
namespace {

constexpr const char* kUsage =
    "usage: ep_bench [--mode normal|ll] [-T|--tokens N] [-H|--hidden N] [-k|--topk N]\n"
    "                [-E|--experts N] [-d|--dtype bf16,fp8] [-n|--iters N] [-w|--warmup N]\n"
    "                [-t|--nthreads N] [--seed N]\n"
    "defaults: normal mode, 4096 tokens per rank, hidden 7168, top-8 of 256 experts, bf16 and\n"
    "fp8 dispatch (combine in bf16), 20 timed iterations after 3 warm-up ones, 1 thread.\n"
    "--mode ll: DeepEP's low-latency mode, 128 tokens per rank unless -T is given.\n"
    "Ranks: processes (chorus-run -n P ep_bench) x threads (-t T).\n";

// Parses the command line; "" or the error.
std::string parse(int argc, char** argv, Options& o) {
  auto number = [](const char* flag, const char* v, long min, long& out) -> std::string {
    char* end = nullptr;
    out = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || out < min)
      return fmt::format("{}: '{}' is not an integer >= {}", flag, v, min);
    return "";
  };
  bool tokens_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") return "help";
    if (i + 1 >= argc) return fmt::format("{}: missing value (or unknown flag)", flag);
    const char* v = argv[++i];
    long n = 0;
    std::string err;
    if (flag == "--mode") {
      if (std::strcmp(v, "normal") == 0)
        o.mode = Mode::kNormal;
      else if (std::strcmp(v, "ll") == 0)
        o.mode = Mode::kLowLatency;
      else
        return fmt::format("--mode: '{}': normal or ll", v);
    } else if (flag == "-d" || flag == "--dtype") {
      o.dtypes.clear();
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string name = list.substr(at, comma - at);
        if (name == "bf16")
          o.dtypes.push_back(ncclBfloat16);
        else if (name == "fp8")
          o.dtypes.push_back(ncclFloat8e4m3);
        else
          return fmt::format("--dtype: '{}': bf16 or fp8", name);
        at = comma + 1;
      }
    } else if (flag == "-T" || flag == "--tokens") {
      err = number(flag.c_str(), v, 1, n);
      o.shape.tokens = static_cast<size_t>(n);
      tokens_given = true;
    } else if (flag == "-H" || flag == "--hidden") {
      err = number(flag.c_str(), v, 1, n);
      o.shape.hidden = static_cast<size_t>(n);
    } else if (flag == "-k" || flag == "--topk") {
      err = number(flag.c_str(), v, 1, n);
      o.shape.topk = static_cast<int>(std::min(n, 1024L));
    } else if (flag == "-E" || flag == "--experts") {
      err = number(flag.c_str(), v, 1, n);
      o.shape.experts = static_cast<int>(std::min(n, 1L << 20));
    } else if (flag == "-n" || flag == "--iters") {
      err = number(flag.c_str(), v, 1, n);
      o.iters = static_cast<int>(std::min(n, 1L << 20));
    } else if (flag == "-w" || flag == "--warmup") {
      err = number(flag.c_str(), v, 0, n);
      o.warmup = static_cast<int>(std::min(n, 1L << 20));
    } else if (flag == "-t" || flag == "--nthreads") {
      err = number(flag.c_str(), v, 1, n);
      o.nthreads = static_cast<int>(std::min(n, 1024L));
    } else if (flag == "--seed") {
      err = number(flag.c_str(), v, 0, n);
      o.seed = static_cast<uint64_t>(n);
    } else {
      return fmt::format("unknown flag '{}'", flag);
    }
    if (!err.empty()) return err;
  }
  if (o.mode == Mode::kLowLatency && !tokens_given) o.shape.tokens = kLowLatencyTokens;
  if (o.shape.topk > o.shape.experts) return "--topk: more than --experts";
  for (ncclDataType_t t : o.dtypes)
    if (t == ncclFloat8e4m3 && o.shape.hidden % kFp8Block != 0)
      return fmt::format("--hidden {}: fp8 needs a multiple of {}", o.shape.hidden, kFp8Block);
  return "";
}

// The four timed steps, in the order each iteration runs them.
enum Step { kEpDispatch, kEpCombine, kBaseDispatch, kBaseCombine, kNumSteps };

// One configuration's figures, the same on every rank.
struct Figures {
  double time_us[kNumSteps];    // median over iterations, max over ranks
  double gbps[kNumSteps];       // per rank DeepEP bytes / median, min over ranks
  double link_gbps[kNumSteps];  // bytes over the busiest host link / time_us; 0: one host
  int64_t recv_min, recv_max;   // tokens received by a rank
};

// Bytes leaving or entering the busiest host, per token row of `unit` bytes sent from rank s to
// rank d (tokens[s * n + d]); 0 when every rank is on one host.
double link_bytes(const Rank& r, const std::vector<int64_t>& tokens, size_t unit) {
  const auto n = static_cast<size_t>(r.nranks);
  int64_t busiest = 0;
  for (size_t h = 0; h < n; ++h) {  // hosts, named by their first rank
    int64_t out = 0, in = 0;
    for (size_t s = 0; s < n; ++s)
      for (size_t d = 0; d < n; ++d) {
        if (r.host[s] == r.host[d]) continue;
        if (r.host[s] == r.host[h]) out += tokens[s * n + d];
        if (r.host[d] == r.host[h]) in += tokens[s * n + d];
      }
    busiest = std::max({busiest, out, in});
  }
  return static_cast<double>(busiest) * static_cast<double>(unit);
}

// 1 if the arrays differ.
int64_t differ(const void* a, const void* b, size_t bytes) {
  return bytes > 0 && std::memcmp(a, b, bytes) != 0 ? 1 : 0;
}

// Arrays in which two dispatches' outputs differ (0: bit for bit the same).
int64_t differences(const Shape& s, size_t num_recv, const Received& a, const Received& b) {
  if (a.num_recv != num_recv || b.num_recv != num_recv) return 1;
  const auto k = static_cast<size_t>(s.topk);
  return differ(a.x.data(), b.x.data(), num_recv * row_bytes(s)) +
         differ(a.scales.data(), b.scales.data(), num_recv * scale_bytes(s)) +
         differ(a.topk_idx.data(), b.topk_idx.data(), num_recv * k * sizeof(int64_t)) +
         differ(a.topk_weights.data(), b.topk_weights.data(), num_recv * k * sizeof(float)) +
         (a.tokens_per_expert != b.tokens_per_expert);
}

// The figures of one configuration from this rank's step times (reordered), combined over the
// ranks. tokens[src * n + dst]: tokens sent from rank src to rank dst.
Figures summarize(Rank& r, const Shape& s, std::vector<double> (&seconds)[kNumSteps],
                  size_t num_recv, const std::vector<int64_t>& tokens) {
  // DeepEP's bytes: dispatch, the received rows (x and FP8 scales); combine, the same rows in BF16.
  const double dispatch_bytes = static_cast<double>(num_recv * (row_bytes(s) + scale_bytes(s)));
  const double combine_bytes = static_cast<double>(num_recv * combine_row_bytes(s));
  Figures f{};
  double inverse_gbps[kNumSteps];  // max over ranks of 1 / GB/s = min of GB/s
  for (int i = 0; i < kNumSteps; ++i) {
    auto& v = seconds[i];  // the median (the upper one of an even count)
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    const double median = v[v.size() / 2];
    f.time_us[i] = median * 1e6;
    const double bytes = i == kEpDispatch || i == kBaseDispatch ? dispatch_bytes : combine_bytes;
    inverse_gbps[i] = bytes > 0 ? median * 1e9 / bytes : 0;
  }
  r.all_reduce(f.time_us, kNumSteps, ncclFloat64, ncclMax);
  r.all_reduce(inverse_gbps, kNumSteps, ncclFloat64, ncclMax);
  const double link_dispatch = link_bytes(r, tokens, record_bytes(s));
  const double link_combine = link_bytes(r, tokens, combine_row_bytes(s));
  for (int i = 0; i < kNumSteps; ++i) {
    f.gbps[i] = inverse_gbps[i] > 0 ? 1 / inverse_gbps[i] : 0;
    const double link = i == kEpDispatch || i == kBaseDispatch ? link_dispatch : link_combine;
    f.link_gbps[i] = link / (f.time_us[i] * 1e3);
  }
  int64_t recv[2] = {static_cast<int64_t>(num_recv), -static_cast<int64_t>(num_recv)};
  r.all_reduce(recv, 2, ncclInt64, ncclMax);
  f.recv_max = recv[0];
  f.recv_min = -recv[1];
  return f;
}

// Dispatch + combine through chorus/ep.h, with this rank's inputs and output arrays.
struct EpRun {
  chorusEpBuffer_t buffer;
  chorusEpDispatchArgs_t args{};
  chorusEpDispatchOutput_t out{};
  chorusEpHandle_t handle = nullptr;

  EpRun(chorusEpBuffer_t b, const Shape& s, const RankTokens& in, Received& recv) : buffer(b) {
    args.x = in.x.data();
    args.xScales = in.scales.empty() ? nullptr : in.scales.data();
    args.datatype = s.dtype;
    args.numTokens = s.tokens;
    args.hidden = s.hidden;
    args.topkIdx = in.topk_idx.data();
    args.topkWeights = in.topk_weights.data();
    args.topk = s.topk;
    args.numExperts = s.experts;
    args.expertAlignment = 1;
    out.recvX = recv.x.data();
    out.recvXScales = recv.scales.empty() ? nullptr : recv.scales.data();
    out.recvTopkIdx = recv.topk_idx.data();
    out.recvTopkWeights = recv.topk_weights.data();
    out.recvCapacity = recv.x.size() / row_bytes(s);
    out.numRecvTokensPerExpert = recv.tokens_per_expert.data();
  }
  ~EpRun() {
    if (handle != nullptr) chorusEpHandleDestroy(handle);
  }
  EpRun(const EpRun&) = delete;
  EpRun& operator=(const EpRun&) = delete;
  ncclResult_t dispatch(Received& recv) {
    if (handle != nullptr) chorusEpHandleDestroy(handle);
    handle = nullptr;
    ncclResult_t r = chorusEpDispatch(buffer, &args, &out, &handle);
    recv.num_recv = out.numRecvTokens;
    return r;
  }
  ncclResult_t combine(const uint16_t* expert_out, uint16_t* combined) {
    return chorusEpCombine(buffer, handle, expert_out, ncclBfloat16, nullptr, combined, nullptr);
  }
};

// Normal mode, one shape: check once, then time the four steps interleaved.
Figures run_normal(Rank& r, chorusEpBuffer_t buffer, const Shape& s) {
  const auto n = static_cast<size_t>(r.nranks);
  const RankTokens in = make_tokens(s, r.opt.seed, r.rank);
  std::vector<int64_t> tokens(n * n);  // tokens[src * n + dst]
  check(r.rank,
        ncclAllGather(tokens_per_rank(s, in.topk_idx, r.nranks).data(), tokens.data(), n, ncclInt64,
                      r.comm, nullptr),
        "ncclAllGather of the token counts");
  size_t num_recv = 0;
  for (size_t src = 0; src < n; ++src)
    num_recv += static_cast<size_t>(tokens[src * n + static_cast<size_t>(r.rank)]);

  Received ep_recv(s, r.nranks, num_recv), base_recv(s, r.nranks, num_recv);
  EpRun ep(buffer, s, in, ep_recv);
  AlltoallvBaseline base(r.comm, r.rank, r.nranks, s, num_recv);
  const std::vector<uint16_t> expert_out =
      make_expert_output(num_recv, s.hidden, r.opt.seed, r.rank);
  std::vector<uint16_t> ep_combined(s.tokens * s.hidden), base_combined(s.tokens * s.hidden);
  const std::function<ncclResult_t()> steps[kNumSteps] = {
      [&] { return ep.dispatch(ep_recv); },
      [&] { return ep.combine(expert_out.data(), ep_combined.data()); },
      [&] { return base.dispatch(in, base_recv); },
      [&] { return base.combine(expert_out.data(), base_combined.data()); }};
  const char* names[kNumSteps] = {"chorusEpDispatch", "chorusEpCombine", "baseline dispatch",
                                  "baseline combine"};

  // The check: EP and the baseline agree on everything a dispatch returns, and on combine.
  for (int i = 0; i < kNumSteps; ++i) check(r.rank, steps[i](), names[i]);
  int64_t wrong = differences(s, num_recv, ep_recv, base_recv) + (ep_combined != base_combined);
  r.all_reduce(&wrong, 1, ncclInt64, ncclSum);
  if (wrong != 0)
    fail(r.rank, fmt::format("normal {}: EP and the baseline disagree ({} of the compared arrays "
                             "differ, summed over the ranks)",
                             dtype_name(s.dtype), wrong));

  for (int it = 0; it < r.opt.warmup; ++it)
    for (int i = 0; i < kNumSteps; ++i) check(r.rank, steps[i](), names[i]);
  std::vector<double> seconds[kNumSteps];
  for (int it = 0; it < r.opt.iters; ++it)
    for (int i = 0; i < kNumSteps; ++i) {
      r.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      check(r.rank, steps[i](), names[i]);
      seconds[i].push_back(seconds_since(t0));
    }

  return summarize(r, s, seconds, num_recv, tokens);
}

void print_header(const Options& o, const World& w, int nranks, size_t hosts) {
  std::printf("# ep_bench, Chorus %s\n", chorusBuildInfo());
  std::printf(
      "# %s mode, %d ranks (%d process%s x %d thread%s, %s) on %zu host%s; tokens %zu per "
      "rank, hidden %zu, top-%d of %d experts, %d timed iterations after %d warm-up, seed %llu\n",
      mode_name(o.mode), nranks, w.nprocs, w.nprocs == 1 ? "" : "es", o.nthreads,
      o.nthreads == 1 ? "" : "s", launcher_name(w.launcher), hosts, hosts == 1 ? "" : "s",
      o.shape.tokens, o.shape.hidden, o.shape.topk, o.shape.experts, o.iters, o.warmup,
      static_cast<unsigned long long>(o.seed));
  if (o.mode == Mode::kLowLatency) {
    print_low_latency_header();
    return;
  }
  std::printf(
      "# time: median over iterations, max over ranks; GB/s (1e9): received rows "
      "(DeepEP: recv x [+ fp8 scales]; combine: the same rows in bf16) / time, min over "
      "ranks; link GB/s: bytes over the busiest host's link / time\n");
  std::printf("%-7s %5s %5s %-11s %11s %12s %10s %12s %10s %10s %10s\n", "#mode", "ranks", "dtype",
              "impl", "recv_tok", "dispatch_us", "disp_GB/s", "combine_us", "comb_GB/s",
              "link_disp", "link_comb");
}

void print_rows(Mode mode, int nranks, ncclDataType_t t, const Figures& f) {
  auto link = [&](int i) {
    return f.link_gbps[i] > 0 ? fmt::format("{:.4f}", f.link_gbps[i]) : std::string("-");
  };
  const std::string recv = fmt::format("{}-{}", f.recv_min, f.recv_max);
  auto row = [&](const char* impl, int dispatch, int combine) {
    std::printf("%-7s %5d %5s %-11s %11s %12.1f %10.3f %12.1f %10.3f %10s %10s\n", mode_name(mode),
                nranks, dtype_name(t), impl, recv.c_str(), f.time_us[dispatch], f.gbps[dispatch],
                f.time_us[combine], f.gbps[combine], link(dispatch).c_str(), link(combine).c_str());
  };
  row("ep", kEpDispatch, kEpCombine);
  row("alltoallv", kBaseDispatch, kBaseCombine);
  std::printf("%-7s %5d %5s %-11s %11s %12s %9.2fx %12s %9.2fx %10s %10s\n", mode_name(mode),
              nranks, dtype_name(t), "ep/base", "", "", f.gbps[kEpDispatch] / f.gbps[kBaseDispatch],
              "", f.gbps[kEpCombine] / f.gbps[kBaseCombine], "", "");
  std::fflush(stdout);
}

int64_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = name; *c != '\0'; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

void run_rank(const Options& opt, const World& world, int local) {
  const int nranks = world.nprocs * opt.nthreads;
  const int rank = world.proc * opt.nthreads + local;
  if (opt.shape.experts % nranks != 0)
    fail(rank,
         fmt::format("--experts {} is not a multiple of the {} ranks", opt.shape.experts, nranks));
  Rank r{opt, nullptr, rank, nranks, std::vector<int64_t>(static_cast<size_t>(nranks))};
  check(rank, ncclCommInitRank(&r.comm, nranks, world.id, rank), "ncclCommInitRank");
  const int64_t mine = host_hash();
  check(rank, ncclAllGather(&mine, r.host.data(), 1, ncclInt64, r.comm, nullptr),
        "ncclAllGather of the host names");
  std::vector<int64_t> hosts = r.host;
  std::sort(hosts.begin(), hosts.end());
  const auto num_hosts =
      static_cast<size_t>(std::unique(hosts.begin(), hosts.end()) - hosts.begin());

  size_t bytes = 0;
  if (opt.mode == Mode::kLowLatency)
    check(rank,
          chorusEpLowLatencySizeHint(nranks, opt.shape.tokens, opt.shape.hidden, opt.shape.experts,
                                     opt.shape.topk, &bytes),
          "chorusEpLowLatencySizeHint");
  else
    check(
        rank,
        chorusEpBufferSizeHint(nranks, opt.shape.tokens, opt.shape.hidden, opt.shape.topk, &bytes),
        "chorusEpBufferSizeHint");
  chorusEpBuffer_t buffer = nullptr;
  check(rank, chorusEpBufferCreate(r.comm, bytes, &buffer), "chorusEpBufferCreate");
  if (rank == 0) print_header(opt, world, nranks, num_hosts);
  for (ncclDataType_t t : opt.dtypes) {
    Shape s = opt.shape;
    s.dtype = t;
    switch (opt.mode) {
      case Mode::kNormal: {
        const Figures f = run_normal(r, buffer, s);
        if (rank == 0) print_rows(opt.mode, nranks, t, f);
        break;
      }
      case Mode::kLowLatency: {
        const LowLatencyFigures f = run_low_latency(r, buffer, s);
        if (rank == 0) print_low_latency_rows(nranks, t, f);
        break;
      }
    }
  }
  check(rank, chorusEpBufferDestroy(buffer), "chorusEpBufferDestroy");
  check(rank, ncclCommDestroy(r.comm), "ncclCommDestroy");
}

int main_impl(int argc, char** argv) {
  Options opt;
  const std::string err = parse(argc, argv, opt);
  if (err == "help" || !err.empty()) {
    if (first_process_by_environment()) {
      if (err != "help") std::fprintf(stderr, "ep_bench: %s\n", err.c_str());
      std::fputs(kUsage, err == "help" ? stdout : stderr);
    }
    return err == "help" ? 0 : 2;
  }
  JoinedWorld joined = join_world(&argc, &argv);
  if (!joined.error.empty()) {
    std::fprintf(stderr, "ep_bench: %s\n", joined.error.c_str());
    return 1;
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < opt.nthreads; ++t)
    threads.emplace_back(run_rank, std::cref(opt), std::cref(joined.world), t);
  for (auto& th : threads) th.join();
  leave_world(joined.world, false);
  return 0;
}

}  // namespace
}  // namespace chorus::bench::ep

int main(int argc, char** argv) { return chorus::bench::ep::main_impl(argc, argv); }
