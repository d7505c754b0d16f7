// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/bench_coll_test.cc
// Unit tests of the *_perf tools' pure parts: command-line parsing and its errors, the size
// sequence, nccl-tests' counts and bandwidth formulas per collective, and the verifier's
// input/output extents. (The tools themselves run in the bench-smoke tests.)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench/coll/approx.h"
#include "bench/coll/args.h"
#include "bench/coll/collective.h"
#include "bench/common/verifiable.h"

namespace chorus::bench {
namespace {

using verify::Coll;

ParsedOptions parse(std::initializer_list<const char*> args) {
  std::vector<std::string> storage{"tool"};
  for (const char* a : args) storage.emplace_back(a);
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  return parse_options(static_cast<int>(storage.size()), argv.data());
}

TEST_CASE("defaults are nccl-tests'", "[unit][bench]") {
  ParsedOptions p = parse({});
  REQUIRE(p.error.empty());
  CHECK(p.options.min_bytes == 32u << 20);
  CHECK(p.options.max_bytes == 32u << 20);
  CHECK(p.options.iters == 20);
  CHECK(p.options.warmup_iters == 1);
  CHECK(p.options.check_iters == 1);
  CHECK(p.options.average == 1);
  CHECK(p.options.dtypes == std::vector<ncclDataType_t>{ncclFloat});
  CHECK(p.options.ops == std::vector<int>{ncclSum});
}

TEST_CASE("short, long and --name=value forms", "[unit][bench]") {
  ParsedOptions p = parse({"-b",  "8",   "--maxbytes", "64M", "--stepfactor=2",
                           "-t2", "-d",  "half,bf16",  "-o",  "all",
                           "-r",  "all", "-a",         "3",   "-z",
                           "1",   "-J",  "out.json",   "-T",  "30",
                           "-n",  "5",   "-w",         "0",   "-c",
                           "0",   "-g",  "1"});
  REQUIRE(p.error.empty());
  const Options& o = p.options;
  CHECK(o.min_bytes == 8);
  CHECK(o.max_bytes == 64u << 20);
  CHECK(o.step_factor == 2);
  CHECK(o.nthreads == 2);
  CHECK(o.dtypes == std::vector<ncclDataType_t>{ncclFloat16, ncclBfloat16});
  CHECK(o.ops.size() == 6);
  CHECK(o.ops.back() == verify::kPreMulSum);
  CHECK(o.root == kAllRoots);
  CHECK(o.average == 3);
  CHECK(o.blocking == 1);
  CHECK(o.output_file == "out.json");
  CHECK(o.timeout_s == 30);
  CHECK(o.iters == 5);
  CHECK(o.warmup_iters == 0);
  CHECK(o.check_iters == 0);
  CHECK(parse({"-d", "all"}).options.dtypes.size() == ncclNumTypes);
  CHECK(parse({"-b", "1.5K"}).options.min_bytes == 1536);
  CHECK(parse({"-b", "1g", "-e", "1G"}).options.min_bytes == size_t{1} << 30);
}

TEST_CASE("every mistake is named", "[unit][bench]") {
  auto error = [](std::initializer_list<const char*> args) { return parse(args).error; };
  CHECK(error({"--nope"}) == "unknown option '--nope'");
  CHECK(error({"-x"}) == "unknown option '-x'");
  CHECK(error({"-b"}) == "option '-b' needs a value");
  CHECK(error({"extra"}) == "unexpected argument 'extra'");
  CHECK(error({"-b", "12Q"}).find("-b/--minbytes: '12Q' is not a size") == 0);
  CHECK(error({"-b", "-5"}).find("is not a size") != std::string::npos);
  CHECK(error({"-n", "0"}).find("-n/--iters") == 0);
  CHECK(error({"-n", "3x"}).find("-n/--iters") == 0);
  CHECK(error({"-a", "4"}).find("-a/--average") == 0);
  CHECK(error({"-z", "2"}).find("-z/--blocking") == 0);
  CHECK(error({"-t", "0"}).find("-t/--nthreads") == 0);
  CHECK(error({"-g", "2"}).find("only 1 is valid") != std::string::npos);
  CHECK(error({"-d", "float,int7"}).find("unknown datatype 'int7'") != std::string::npos);
  CHECK(error({"-o", "xor"}).find("unknown operator 'xor'") != std::string::npos);
  CHECK(error({"-r", "x"}).find("-r/--root") == 0);
  CHECK(error({"-b", "2K", "-e", "1K"}).find("is larger than") != std::string::npos);
  CHECK(error({"-b", "1K", "-e", "2K", "-i", "0"}).find("never reach") != std::string::npos);
  CHECK(error({"-b", "0", "-e", "2K", "-f", "2"}).find("never grows") != std::string::npos);
  CHECK(parse({"-h"}).options.help);
  // The real range of -f, not just its lower end.
  CHECK(error({"-f", "0"}) == "-f/--stepfactor: '0' is not an integer factor in 1..1048576");
  CHECK(error({"-f", "2097152"}).find("in 1..1048576") != std::string::npos);
  CHECK(error({"-m", "0"}).find("-m/--agg_iters") == 0);
  CHECK(error({"-N", "0"}).find("-N/--run_cycles: 0 (run forever) is not supported") == 0);
  CHECK(error({"-N", "-1"}).find("-N/--run_cycles") == 0);
  CHECK(error({"-R", "3"}).find("-R/--local_register") == 0);
  CHECK(error({"-y", "2"}).find("-y/--stream_null") == 0);
  CHECK(error({"-C", "x"}).find("-C/--report_cputime") == 0);
  CHECK(error({"-M", "2"}).find("-M/--memory") == 0);
  CHECK(error({"-p", "2"}).find("-p/--parallel_init") == 0);
  CHECK(error({"-G", "-1"}).find("-G/--cudagraph") == 0);
}

TEST_CASE("nccl-tests options that scripts pass: -m -N -p -G -C -R -y -M", "[unit][bench]") {
  ParsedOptions p = parse({"-m", "4", "-N", "3", "-p", "1", "-G", "10", "-C", "1", "-R", "2",
                           "-y", "1", "-M", "1"});
  REQUIRE(p.error.empty());
  const Options& o = p.options;
  CHECK(o.agg_iters == 4);
  CHECK(o.run_cycles == 3);
  CHECK(o.parallel_init == 1);
  CHECK(o.cudagraph == 10);
  CHECK(o.report_cputime == 1);
  CHECK(o.local_register == 2);
  CHECK(o.stream_null == 1);
  CHECK(o.blocking == 0);
  CHECK(o.null_stream());
  CHECK(o.memory_report == 1);
  // nccl-tests' long names, and the defaults.
  ParsedOptions l = parse({"--agg_iters=2", "--run_cycles", "2", "--parallel_init", "0",
                           "--cudagraph", "0", "--report_cputime", "0", "--local_register",
                           "1", "--stream_null", "0", "--memory", "0"});
  REQUIRE(l.error.empty());
  CHECK(l.options.agg_iters == 2);
  CHECK(l.options.run_cycles == 2);
  CHECK(l.options.local_register == 1);
  CHECK_FALSE(l.options.null_stream());
  ParsedOptions d = parse({});
  CHECK(d.options.agg_iters == 1);
  CHECK(d.options.run_cycles == 1);
  CHECK(d.options.local_register == 0);
  CHECK(d.options.memory_report == 0);
  // Every one of them is in the help text.
  const std::string help = usage_text("tool");
  for (const char* name : {"-m, --agg_iters", "-N, --run_cycles", "-p, --parallel_init",
                           "-G, --cudagraph", "-C, --report_cputime", "-R, --local_register",
                           "-y, --stream_null", "-M, --memory", "1..1048576"})
    CHECK(help.find(name) != std::string::npos);
}

TEST_CASE("compression options: --compress and its companions", "[unit][bench]") {
  CHECK(!parse({}).options.compress.enabled);
  ParsedOptions p = parse({"--compress", "e5m2", "--compress-scale", "ue8m0", "--compress-block",
                           "32", "--compress-rounding", "stochastic", "--error-feedback",
                           "--compress-policy=auto", "-d", "bf16,half,float", "-o", "avg,max"});
  REQUIRE(p.error.empty());
  const CompressOptions& c = p.options.compress;
  CHECK(c.enabled);
  CHECK(c.format == chorusFp8E5M2);
  CHECK(c.scale == chorusScaleUe8m0);
  CHECK(c.block == 32);
  CHECK(c.rounding == chorusRoundStochastic);
  CHECK(c.error_feedback == 1);
  CHECK(c.policy == chorusCompressAuto);
  CHECK(compress_description(c) ==
        "FP8 E5M2, block 32, UE8M0 scales, round stochastic, error feedback on, policy auto");
  CHECK(parse({"--compress", "e4m3"}).options.compress.block == 128);
  auto error = [](std::initializer_list<const char*> args) { return parse(args).error; };
  CHECK(error({"--compress", "e3m4"}).find("--compress: 'e3m4' is not an FP8 format") == 0);
  CHECK(error({"--compress", "e4m3", "--compress-block", "0"}).find("--compress-block") == 0);
  CHECK(error({"--compress", "e4m3", "--compress-block", "65537"}).find("1..65536") !=
        std::string::npos);
  CHECK(error({"--compress-block", "64"}).find("need --compress") != std::string::npos);
  CHECK(error({"--error-feedback"}).find("need --compress") != std::string::npos);
  CHECK(error({"--compress", "e4m3", "-d", "int32"}).find("datatype int32 cannot") !=
        std::string::npos);
  CHECK(error({"--compress", "e4m3", "-o", "prod"}).find("operator prod cannot") !=
        std::string::npos);
  CHECK(collective(Coll::kAllReduce).issue_compressed != nullptr);
  CHECK(collective(Coll::kReduceScatter).issue_compressed != nullptr);
  CHECK(collective(Coll::kAllGather).issue_compressed != nullptr);
  CHECK(collective(Coll::kBroadcast).issue_compressed == nullptr);
}

// A model of one block-scaled quantization (fp32 scale = amax / FP8_MAX, round to nearest
// even), independent of the library's codec: the check's bound must hold for it, wherever the
// blocks start.
void quantize_model(std::vector<double>& x, size_t first, size_t n, size_t block, bool e4m3) {
  const int mantissa = e4m3 ? 3 : 2;
  const int min_exp = e4m3 ? -6 : -14;
  const double fp8_max = e4m3 ? 448.0 : 57344.0;
  for (size_t b = first; b < first + n; b += block) {
    const size_t end = std::min(first + n, b + block);
    double amax = 0;
    for (size_t i = b; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (amax == 0) continue;
    const double s = static_cast<float>(amax / fp8_max);
    for (size_t i = b; i < end; ++i) {
      const double y = x[i] / s;
      if (y == 0) continue;
      int e = 0;
      std::frexp(std::fabs(y), &e);
      const double spacing = std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa);
      x[i] = std::clamp(std::nearbyint(y / spacing) * spacing, -fp8_max, fp8_max) * s;
    }
  }
}

TEST_CASE("the compressed check's bound holds for a model codec", "[unit][bench]") {
  CompressOptions c;
  c.enabled = true;
  CHECK(ApproxChecker::unit_error(c) == 1.0 / 16);
  c.format = chorusFp8E5M2;
  CHECK(ApproxChecker::unit_error(c) == 1.0 / 8);
  c.rounding = chorusRoundStochastic;
  CHECK(ApproxChecker::unit_error(c) == 1.0 / 4);
  for (bool e4m3 : {true, false}) {
    for (size_t block : {size_t{1}, size_t{7}, size_t{128}, size_t{1000}}) {
      CompressOptions o;
      o.enabled = true;
      o.format = e4m3 ? chorusFp8E4M3 : chorusFp8E5M2;
      o.block = static_cast<unsigned int>(block);
      const int n = 3;
      const size_t count = 3000;  // shards of 1000: blocks start off the checker's chunks
      auto v = verify::Verifier::create({Coll::kAllReduce, ncclFloat, ncclSum, n, count, 0});
      ApproxChecker checker(*v, o);
      // Two stages as compress.h describes them: rank j owns shard j; the others' shards are
      // quantized, summed with j's exact one, the sum quantized once.
      std::vector<double> sum(count, 0.0);
      std::vector<float> in(count);
      for (int r = 0; r < n; ++r) {
        v->fill_input(r, in.data(), 0, count);
        std::vector<double> x(in.begin(), in.end());
        for (int j = 0; j < n; ++j)
          if (j != r) quantize_model(x, j * (count / n), count / n, block, e4m3);
        for (size_t i = 0; i < count; ++i) sum[i] += x[i];
      }
      for (int j = 0; j < n; ++j) quantize_model(sum, j * (count / n), count / n, block, e4m3);
      std::vector<float> got(sum.begin(), sum.end());
      INFO("e4m3 " << e4m3 << " block " << block);
      verify::Mismatch m = checker.check(1, got.data());
      CHECK(m.wrong == 0);
      CHECK(m.first.empty());
      // The bound for the generated inputs (0..15, 3 ranks, E4M3: 0.129 * 45 = 5.8).
      if (e4m3 && block == 128) CHECK(checker.tolerance(0, 10, 20.0) == Approx(5.80).epsilon(0.01));
      // Beyond the bound, and NaN, are wrong.
      got[17] += static_cast<float>(checker.tolerance(1, 17, got[17]) * 1.5 + 1);
      got[18] = std::nanf("");
      CHECK(checker.check(1, got.data()).wrong == 2);
    }
  }
  // AllGather quantizes once: u times the owner's magnitude (copies use integers below 2^20).
  CompressOptions o;
  o.enabled = true;
  auto ag = verify::Verifier::create({Coll::kAllGather, ncclFloat, ncclSum, 2, 512, 0});
  ApproxChecker agc(*ag, o);
  const double t = agc.tolerance(0, 600, 3.0);
  CHECK((t > 0.9 * 65536 && t < 65536 * 1.001));
  CHECK(hash_bytes("abcdefghij", 10) != hash_bytes("abcdefghik", 10));
  CHECK(hash_bytes("abcdefghij", 10) == hash_bytes("abcdefghij", 10));
}

TEST_CASE("message sizes step by factor or by bytes", "[unit][bench]") {
  Options o;
  o.min_bytes = 8;
  o.max_bytes = 64;
  o.step_factor = 2;
  CHECK(message_sizes(o) == std::vector<size_t>{8, 16, 32, 64});
  o.step_factor = 1;
  o.step_bytes = 20;
  CHECK(message_sizes(o) == std::vector<size_t>{8, 28, 48});
  o.min_bytes = o.max_bytes = 100;
  o.step_bytes = 0;
  CHECK(message_sizes(o) == std::vector<size_t>{100});
}

TEST_CASE("counts follow nccl-tests' getCollByteCount", "[unit][bench]") {
  // 1000 elements over 4 ranks.
  Layout ar = collective(Coll::kAllReduce).layout(1000, 4);
  CHECK((ar.send_count == 1000 && ar.recv_count == 1000 && ar.param_count == 1000));
  Layout ag = collective(Coll::kAllGather).layout(1000, 4);
  CHECK((ag.send_count == 250 && ag.recv_count == 1000 && ag.param_count == 250));
  CHECK((ag.send_inplace_offset == 250 && ag.recv_inplace_offset == 0));
  Layout rs = collective(Coll::kReduceScatter).layout(1002, 4);
  CHECK((rs.send_count == 1000 && rs.recv_count == 250 && rs.param_count == 250));
  CHECK((rs.send_inplace_offset == 0 && rs.recv_inplace_offset == 250));
  Layout a2a = collective(Coll::kAlltoAll).layout(1000, 4);
  CHECK((a2a.send_count == 1000 && a2a.recv_count == 1000 && a2a.param_count == 250));
  Layout g = collective(Coll::kGather).layout(1000, 4);
  CHECK((g.param_count == 250 && g.send_inplace_offset == 250));
  Layout s = collective(Coll::kScatter).layout(1000, 4);
  CHECK((s.param_count == 250 && s.recv_inplace_offset == 250));
  CHECK(collective(Coll::kAllGather).layout(3, 4).param_count == 0);
  CHECK(collective(Coll::kSendRecv).layout(7, 4).param_count == 7);
}

TEST_CASE("bandwidth formulas of PERFORMANCE.md", "[unit][bench]") {
  // 1e9 bytes in 1 s is 1 GB/s of algbw for whole-message collectives, n GB/s for the others.
  const size_t gb = 1000000000;
  CHECK(algbw_gbps(collective(Coll::kAllReduce), gb, 4, 1.0) == Approx(1.0));
  CHECK(collective(Coll::kAllReduce).bus_factor(4) == Approx(1.5));
  for (Coll c :
       {Coll::kReduceScatter, Coll::kAllGather, Coll::kAlltoAll, Coll::kGather, Coll::kScatter}) {
    CHECK(algbw_gbps(collective(c), gb, 4, 1.0) == Approx(4.0));
    CHECK(collective(c).bus_factor(4) == Approx(0.75));
  }
  for (Coll c : {Coll::kBroadcast, Coll::kReduce, Coll::kSendRecv}) {
    CHECK(algbw_gbps(collective(c), gb, 4, 2.0) == Approx(0.5));
    CHECK(collective(c).bus_factor(4) == Approx(1.0));
  }
  CHECK(collective(Coll::kAllReduce).bus_factor(1) == Approx(0.0));
  CHECK(!collective(Coll::kSendRecv).checks_in_place);
}

TEST_CASE("verifier extents and exact expectations", "[unit][bench]") {
  auto v = verify::Verifier::create({Coll::kScatter, ncclFloat, ncclSum, 4, 10, 2});
  REQUIRE(v != nullptr);
  CHECK(v->input_count(2) == 40);
  CHECK(v->input_count(1) == 0);
  CHECK(v->output_count(1) == 10);
  auto g = verify::Verifier::create({Coll::kGather, ncclInt32, ncclSum, 3, 5, 0});
  CHECK(g->output_count(0) == 15);
  CHECK(g->output_count(1) == 0);
  // An AllReduce's expected output is what summing every rank's input gives, exactly.
  auto ar = verify::Verifier::create({Coll::kAllReduce, ncclFloat, ncclSum, 3, 64, 0});
  std::vector<float> sum(64, 0.0f), in(64), want(64);
  for (int r = 0; r < 3; ++r) {
    ar->fill_input(r, in.data(), 0, 64);
    for (size_t i = 0; i < 64; ++i) sum[i] += in[i];
  }
  ar->fill_expected(0, want.data(), 0, 64);
  CHECK(want == sum);
  CHECK(ar->check(1, sum.data()).wrong == 0);
  sum[5] += 1;
  verify::Mismatch m = ar->check(1, sum.data());
  CHECK(m.wrong == 1);
  CHECK(m.first.find("[5]") != std::string::npos);
  CHECK(verify::Verifier::create({Coll::kAllReduce, static_cast<ncclDataType_t>(99), 0, 2, 1, 0}) ==
        nullptr);
}

}  // namespace
}  // namespace chorus::bench
