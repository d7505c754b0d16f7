// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/args.cc
// Command-line parsing of the *_perf tools with getopt_long, strict value parsers (a whole
// argument must parse, within range), and the cross-checks between options.
#include "bench/coll/args.h"

#include <fmt/format.h>
#include <getopt.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <string_view>

#include "bench/common/verifiable.h"

namespace chorus::bench {

namespace {

struct Named {
  const char* name;
  int value;
};

constexpr Named kDtypeNames[] = {
    {"int8", ncclInt8},
    {"uint8", ncclUint8},
    {"int32", ncclInt32},
    {"uint32", ncclUint32},
    {"int64", ncclInt64},
    {"uint64", ncclUint64},
    {"half", ncclFloat16},
    {"float", ncclFloat32},
    {"double", ncclFloat64},
    {"bfloat16", ncclBfloat16},
    {"f8e4m3", ncclFloat8e4m3},
    {"f8e5m2", ncclFloat8e5m2},
    // Aliases, accepted on input only.
    {"char", ncclInt8},
    {"int", ncclInt32},
    {"float16", ncclFloat16},
    {"fp16", ncclFloat16},
    {"float32", ncclFloat32},
    {"float64", ncclFloat64},
    {"bf16", ncclBfloat16},
    {"fp8e4m3", ncclFloat8e4m3},
    {"fp8e5m2", ncclFloat8e5m2},
};
constexpr int kNumCanonicalDtypes = 12;

constexpr Named kOpNames[] = {
    {"sum", ncclSum},
    {"prod", ncclProd},
    {"max", ncclMax},
    {"min", ncclMin},
    {"avg", ncclAvg},
    {"mulsum", verify::kPreMulSum},
    {"premulsum", verify::kPreMulSum},
};
constexpr int kNumCanonicalOps = 6;

std::optional<size_t> parse_size(const char* text) {
  // A decimal number (fraction allowed, as nccl-tests reads it with %lf), then K, M or G.
  const char* p = text;
  if (*p < '0' || *p > '9') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(p, &end);
  if (errno != 0 || end == p || !std::isfinite(v)) return std::nullopt;
  double unit = 1;
  if (*end != '\0') {
    switch (*end) {
      case 'k':
      case 'K': unit = 1024.0; break;
      case 'm':
      case 'M': unit = 1024.0 * 1024; break;
      case 'g':
      case 'G': unit = 1024.0 * 1024 * 1024; break;
      default: return std::nullopt;
    }
    if (end[1] != '\0') return std::nullopt;
  }
  double bytes = v * unit;
  if (bytes > 0x1p62) return std::nullopt;
  return static_cast<size_t>(bytes);
}

std::optional<long> parse_long(const char* text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return std::nullopt;
  return v;
}

// A comma-separated list of names from `table` (or "all": its first `canonical` entries).
// On failure, *unknown is the first item that is not a name.
std::optional<std::vector<int>> parse_names(const char* text, const Named* table, int size,
                                            int canonical, std::string* unknown) {
  std::vector<int> out;
  if (std::strcmp(text, "all") == 0) {
    for (int i = 0; i < canonical; ++i) out.push_back(table[i].value);
    return out;
  }
  std::string_view rest(text);
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    const Named* found = nullptr;
    for (int i = 0; i < size && found == nullptr; ++i)
      if (item == table[i].name) found = &table[i];
    if (found == nullptr) {
      *unknown = item;
      return std::nullopt;
    }
    out.push_back(found->value);
    if (comma == std::string_view::npos) return out;
    rest.remove_prefix(comma + 1);
  }
}

std::string name_list(const Named* table, int canonical) {
  std::string s;
  for (int i = 0; i < canonical; ++i) s += fmt::format("{}{}", i ? "," : "", table[i].name);
  return s;
}

// Long-only options (no short letter: nccl-tests owns those).
enum : int {
  kOptCompress = 256,
  kOptCompressScale,
  kOptCompressBlock,
  kOptCompressRounding,
  kOptErrorFeedback,
  kOptCompressPolicy,
};

const option kLongOptions[] = {
    {"nthreads", required_argument, nullptr, 't'},
    {"ngpus", required_argument, nullptr, 'g'},
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"iters", required_argument, nullptr, 'n'},
    {"agg_iters", required_argument, nullptr, 'm'},
    {"run_cycles", required_argument, nullptr, 'N'},
    {"warmup_iters", required_argument, nullptr, 'w'},
    {"check", required_argument, nullptr, 'c'},
    {"op", required_argument, nullptr, 'o'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"average", required_argument, nullptr, 'a'},
    {"blocking", required_argument, nullptr, 'z'},
    {"stream_null", required_argument, nullptr, 'y'},
    {"local_register", required_argument, nullptr, 'R'},
    {"parallel_init", required_argument, nullptr, 'p'},
    {"cudagraph", required_argument, nullptr, 'G'},
    {"report_cputime", required_argument, nullptr, 'C'},
    {"memory", required_argument, nullptr, 'M'},
    {"output_file", required_argument, nullptr, 'J'},
    {"timeout", required_argument, nullptr, 'T'},
    {"compress", required_argument, nullptr, kOptCompress},
    {"compress-scale", required_argument, nullptr, kOptCompressScale},
    {"compress-block", required_argument, nullptr, kOptCompressBlock},
    {"compress-rounding", required_argument, nullptr, kOptCompressRounding},
    {"error-feedback", no_argument, nullptr, kOptErrorFeedback},
    {"compress-policy", required_argument, nullptr, kOptCompressPolicy},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};
constexpr const char* kShortOptions = ":t:g:b:e:i:f:n:m:N:w:c:o:d:r:a:z:y:R:p:G:C:M:J:T:h";
// The largest -f: beyond it the second size already passes any -e that parse_size accepts.
constexpr long kMaxStepFactor = 1L << 20;

// The spelling of option `c` for messages: "-b/--minbytes".
std::string spelling(int c) {
  for (const option* o = kLongOptions; o->name != nullptr; ++o) {
    if (o->val != c) continue;
    if (c >= kOptCompress) return fmt::format("--{}", o->name);
    return fmt::format("-{}/--{}", static_cast<char>(c), o->name);
  }
  return fmt::format("-{}", static_cast<char>(c));
}

// -o and -d: a list of operator or datatype names.
std::string apply_names(Options& o, int c, const char* v) {
  const bool ops = c == 'o';
  const Named* table = ops ? kOpNames : kDtypeNames;
  const int size =
      ops ? static_cast<int>(std::size(kOpNames)) : static_cast<int>(std::size(kDtypeNames));
  const int canonical = ops ? kNumCanonicalOps : kNumCanonicalDtypes;
  std::string unknown;
  auto values = parse_names(v, table, size, canonical, &unknown);
  if (!values) {
    return fmt::format("{}: unknown {} '{}' (known: {}, or all)", spelling(c),
                       ops ? "operator" : "datatype", unknown, name_list(table, canonical));
  }
  if (ops) {
    o.ops = *values;
  } else {
    o.dtypes.clear();
    for (int t : *values) o.dtypes.push_back(static_cast<ncclDataType_t>(t));
  }
  return "";
}

// The --compress options; returns an error message, or "" when it was accepted.
std::string apply_compress(CompressOptions& o, int c, const char* v) {
  auto bad = [&](std::string_view expected) {
    return fmt::format("{}: '{}' is not {}", spelling(c), v, expected);
  };
  auto is = [&](const char* a, const char* b = nullptr) {
    return std::strcmp(v, a) == 0 || (b != nullptr && std::strcmp(v, b) == 0);
  };
  if (c != kOptCompress) o.details_given = true;
  switch (c) {
    case kOptCompress:
      if (is("e4m3", "fp8_e4m3")) {
        o.format = chorusFp8E4M3;
      } else if (is("e5m2", "fp8_e5m2")) {
        o.format = chorusFp8E5M2;
      } else {
        return bad("an FP8 format: e4m3 or e5m2");
      }
      o.enabled = true;
      return "";
    case kOptCompressScale:
      if (is("fp32", "float32")) {
        o.scale = chorusScaleFloat32;
      } else if (is("ue8m0")) {
        o.scale = chorusScaleUe8m0;
      } else {
        return bad("a scale kind: fp32 or ue8m0");
      }
      return "";
    case kOptCompressBlock: {
      auto n = parse_long(v, 1, 65536);
      if (!n) return bad("a block size in 1..65536 elements");
      o.block = static_cast<unsigned int>(*n);
      return "";
    }
    case kOptCompressRounding:
      if (is("nearest", "rne")) {
        o.rounding = chorusRoundNearestEven;
      } else if (is("stochastic")) {
        o.rounding = chorusRoundStochastic;
      } else {
        return bad("a rounding: nearest or stochastic");
      }
      return "";
    case kOptErrorFeedback: o.error_feedback = 1; return "";
    case kOptCompressPolicy:
      if (is("always")) {
        o.policy = chorusCompressAlways;
      } else if (is("auto")) {
        o.policy = chorusCompressAuto;
      } else {
        return bad("a policy: always or auto");
      }
      return "";
  }
  return fmt::format("internal error: option {} has no handler", c);
}

// Applies one option; returns an error message, or "" when it was accepted.
std::string apply(Options& o, int c, const char* v) {
  if (c >= kOptCompress) return apply_compress(o.compress, c, v);
  auto bad = [&](std::string_view expected) {
    return fmt::format("{}: '{}' is not {}", spelling(c), v, expected);
  };
  auto set_int = [&](int& field, long lo, long hi, std::string_view expected) -> std::string {
    auto n = parse_long(v, lo, hi);
    if (!n) return bad(expected);
    field = static_cast<int>(*n);
    return "";
  };
  switch (c) {
    case 't': return set_int(o.nthreads, 1, 1024, "a thread count in 1..1024");
    case 'g':
      if (std::strcmp(v, "1") == 0) return "";
      return fmt::format(
          "{}: Chorus ranks are host threads, not GPUs: only 1 is valid (use -t "
          "for more ranks per process)",
          spelling(c));
    case 'n': return set_int(o.iters, 1, 1 << 30, "an iteration count >= 1");
    case 'w': return set_int(o.warmup_iters, 0, 1 << 30, "an iteration count >= 0");
    case 'c': return set_int(o.check_iters, 0, 1 << 30, "a check count >= 0");
    case 'a': return set_int(o.average, 0, 3, "0 (rank 0), 1 (mean), 2 (min) or 3 (max)");
    case 'z': return set_int(o.blocking, 0, 1, "0 (host stream) or 1 (NULL stream)");
    case 'm': return set_int(o.agg_iters, 1, 1 << 20, "an aggregated call count in 1..1048576");
    case 'N':
      // nccl-tests reads 0 as "cycle forever"; a tool that never exits is no use in a script
      // or a test, so say so instead of running until killed.
      if (std::strcmp(v, "0") == 0)
        return fmt::format("{}: 0 (run forever) is not supported: give a cycle count in 1..{}",
                           spelling(c), 1 << 20);
      return set_int(o.run_cycles, 1, 1 << 20, "a cycle count in 1..1048576");
    case 'y': return set_int(o.stream_null, 0, 1, "0 (host stream) or 1 (NULL stream)");
    case 'R':
      return set_int(o.local_register, 0, 2,
                     "0 (plain memory), 1 (registered) or 2 (symmetric window)");
    case 'p': return set_int(o.parallel_init, 0, 1, "0 or 1");
    case 'G': return set_int(o.cudagraph, 0, 1 << 30, "a number of graph launches >= 0");
    case 'C': return set_int(o.report_cputime, 0, 1, "0 or 1");
    case 'M': return set_int(o.memory_report, 0, 1, "0 or 1");
    case 'T': return set_int(o.timeout_s, 0, 1 << 30, "a number of seconds >= 0");
    case 'J': o.output_file = v; return o.output_file.empty() ? bad("a file name") : "";
    case 'f': {
      auto n = parse_long(v, 1, kMaxStepFactor);
      if (!n) return bad(fmt::format("an integer factor in 1..{}", kMaxStepFactor));
      o.step_factor = static_cast<size_t>(*n);
      return "";
    }
    case 'b':
    case 'e':
    case 'i': {
      auto n = parse_size(v);
      if (!n) return bad("a size (bytes, optionally with a K, M or G suffix)");
      (c == 'b' ? o.min_bytes : c == 'e' ? o.max_bytes : o.step_bytes) = *n;
      return "";
    }
    case 'o':
    case 'd': return apply_names(o, c, v);
    case 'r': {
      if (std::strcmp(v, "all") == 0 || std::strcmp(v, "-1") == 0) {
        o.root = kAllRoots;
        return "";
      }
      return set_int(o.root, 0, 1 << 20, "a rank >= 0 or 'all'");
    }
  }
  return fmt::format("internal error: option -{} has no handler", static_cast<char>(c));
}

std::string cross_check(const Options& o) {
  if (o.min_bytes > o.max_bytes)
    return fmt::format("-b/--minbytes ({}) is larger than -e/--maxbytes ({})", o.min_bytes,
                       o.max_bytes);
  if (o.step_factor <= 1 && o.step_bytes == 0 && o.min_bytes < o.max_bytes)
    return "-i/--stepbytes 0 without -f/--stepfactor would never reach -e/--maxbytes";
  if (o.step_factor > 1 && o.min_bytes == 0 && o.max_bytes > 0)
    return "-b/--minbytes 0 with -f/--stepfactor never grows: start from 1 byte or more";
  if (o.compress.details_given && !o.compress.enabled)
    return "--compress-scale, --compress-block, --compress-rounding, --error-feedback and "
           "--compress-policy need --compress e4m3|e5m2";
  if (o.compress.enabled) {
    for (ncclDataType_t t : o.dtypes)
      if (t != ncclFloat32 && t != ncclFloat16 && t != ncclBfloat16)
        return fmt::format("--compress: datatype {} cannot be compressed (float, half or bfloat16)",
                           dtype_name(t));
    for (int op : o.ops)
      if (op != ncclSum && op != ncclAvg && op != ncclMax && op != ncclMin)
        return fmt::format("--compress: operator {} cannot be compressed (sum, avg, max or min)",
                           op_name(op));
  }
  return "";
}

}  // namespace

ParsedOptions parse_options(int argc, char** argv_in) {
  ParsedOptions r;
  // getopt_long permutes its argv: work on a copy, so the caller's stays as typed.
  std::vector<char*> copy(argv_in, argv_in + argc);
  copy.push_back(nullptr);
  char** argv = copy.data();
  opterr = 0;
  optind = 0;  // glibc: also resets getopt's internal state
  while (true) {
    int c = getopt_long(argc, argv, kShortOptions, kLongOptions, nullptr);
    if (c == -1) break;
    const char* arg = argv[optind - 1];
    if (c == '?') {
      r.error = optopt != 0 ? fmt::format("unknown option '-{}'", static_cast<char>(optopt))
                            : fmt::format("unknown option '{}'", arg);
      return r;
    }
    if (c == ':') {
      r.error = fmt::format("option '{}' needs a value", arg);
      return r;
    }
    if (c == 'h') {
      r.options.help = true;
      continue;
    }
    r.error = apply(r.options, c, optarg);
    if (!r.error.empty()) return r;
  }
  if (optind < argc) {
    r.error = fmt::format("unexpected argument '{}'", argv[optind]);
    return r;
  }
  r.error = cross_check(r.options);
  return r;
}

std::string compress_description(const CompressOptions& c) {
  return fmt::format("FP8 {}, block {}, {} scales, round {}, error feedback {}, policy {}",
                     c.format == chorusFp8E4M3 ? "E4M3" : "E5M2", c.block,
                     c.scale == chorusScaleFloat32 ? "fp32" : "UE8M0",
                     c.rounding == chorusRoundNearestEven ? "nearest-even" : "stochastic",
                     c.error_feedback ? "on" : "off",
                     c.policy == chorusCompressAlways ? "always" : "auto");
}

std::vector<size_t> message_sizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t size = o.min_bytes; size <= o.max_bytes;) {
    sizes.push_back(size);
    size_t next = o.step_factor > 1 ? size * o.step_factor : size + o.step_bytes;
    if (next <= size) break;  // overflow, or a step of 0 with min == max
    size = next;
  }
  return sizes;
}

const char* dtype_name(ncclDataType_t t) {
  for (int i = 0; i < kNumCanonicalDtypes; ++i)
    if (kDtypeNames[i].value == t) return kDtypeNames[i].name;
  return "?";
}

const char* op_name(int op) {
  for (int i = 0; i < kNumCanonicalOps; ++i)
    if (kOpNames[i].value == op) return kOpNames[i].name;
  return "none";
}

std::string usage_text(const char* program) {
  return fmt::format(
      "usage: {} [options]\n"
      "nccl-tests-compatible benchmark of Chorus (host memory). Ranks = processes x threads:\n"
      "processes from chorus-run, or mpirun when built with MPI, else 1.\n"
      "  -t, --nthreads N        ranks as threads of each process (1)\n"
      "  -b, --minbytes SIZE     smallest message, K/M/G suffixes allowed (32M)\n"
      "  -e, --maxbytes SIZE     largest message (32M)\n"
      "  -i, --stepbytes SIZE    increment between sizes when -f is not given (1M)\n"
      "  -f, --stepfactor N      multiply sizes by N (1..1048576) instead (off)\n"
      "  -n, --iters N           timed iterations per size (20)\n"
      "  -m, --agg_iters M       calls per timed iteration, issued in one ncclGroupStart/\n"
      "                          ncclGroupEnd; the time is per call (1)\n"
      "  -N, --run_cycles N      run the whole size sweep N times, a table row per size\n"
      "                          and cycle (1; nccl-tests' 0 = forever is refused)\n"
      "  -w, --warmup_iters N    warm-up iterations at the largest and smallest size (1, as\n"
      "                          current nccl-tests; older versions used 5)\n"
      "  -c, --check N           correctness checks per size after timing, 0 = off (1)\n"
      "  -o, --op OP             {}, or all (sum); a comma list works too\n"
      "  -d, --datatype TYPE     a datatype, or all (float); a comma list works too:\n"
      "                          {}\n"
      "  -r, --root R            root rank of rooted collectives, or all for each in turn (0)\n"
      "  -a, --average A         time reported: 0 rank 0, 1 mean, 2 min, 3 max over ranks (1)\n"
      "  -z, --blocking Z        0: issue on a Chorus host stream, then synchronize;\n"
      "                          1: NULL stream, every call completes before returning (0)\n"
      "  -y, --stream_null Y     1: NULL stream, as -z 1 (0)\n"
      "  -R, --local_register R  1: buffers from ncclMemAlloc, registered with\n"
      "                          ncclCommRegister (same-host peers then copy once);\n"
      "                          2: also ncclCommWindowRegister, symmetric windows (0)\n"
      "  -J, --output_file FILE  also write every row as JSON (FILE.N if FILE exists)\n"
      "  -T, --timeout S         fail if one size takes longer than S seconds (0: never)\n"
      "  -M, --memory M          1: after the table, the buffer bytes each rank allocated\n"
      "                          and the process's peak resident memory (0)\n"
      "  -C, --report_cputime C  1: label the time column \"cputime\", as nccl-tests; the\n"
      "                          times are host (CPU) wall-clock times either way (0)\n"
      "  -g, --ngpus 1           accepted for compatibility (only 1)\n"
      "  -p, --parallel_init P   accepted for compatibility: every rank thread always calls\n"
      "                          ncclCommInitRank on its own, in parallel\n"
      "  -G, --cudagraph N       accepted and ignored: no CUDA graphs on host memory\n"
      "  --compress e4m3|e5m2    all_reduce_perf, reduce_scatter_perf, all_gather_perf: time\n"
      "                          chorus*Compressed (FP8 on the wire) with one compressor per\n"
      "                          rank; -c checks against a derived error bound, and that every\n"
      "                          rank holds the same result (AllReduce, AllGather) (off)\n"
      "  --compress-scale K      fp32 or ue8m0 block scales (fp32)\n"
      "  --compress-block N      elements per scale, 1..65536 (128)\n"
      "  --compress-rounding R   nearest or stochastic (nearest)\n"
      "  --error-feedback        keep a residual per rank (reset before every size and check)\n"
      "  --compress-policy P     always, or auto: the tuner decides per call (always)\n"
      "  -h, --help              this text\n"
      "Exit status: 0 all correct; 1 wrong results, errors or timeout; 2 bad command line.\n",
      program, name_list(kOpNames, kNumCanonicalOps), name_list(kDtypeNames, kNumCanonicalDtypes));
}

}  // namespace chorus::bench
