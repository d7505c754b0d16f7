// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/report.cc
// nccl-tests' stdout layout (column widths, number fitting, footer wording) and its JSON
// document (version 2 layout: config, devices, results, out_of_bounds, average bus bandwidth).
#include "bench/coll/report.h"

#include <chorus/chorus.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>

#include "bench/common/verifiable.h"

namespace chorus::bench {

namespace {

std::string now_string() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// value right-aligned in `width` characters with as many decimals (2, 1, 0) as fit, else in
// exponent form: the way nccl-tests keeps its columns aligned.
std::string fit(double value, int width) {
  for (int decimals = 2; decimals >= 0; --decimals) {
    std::string s = fmt::format("{:{}.{}f}", value, width, decimals);
    if (static_cast<int>(s.size()) <= width) return s;
  }
  return fmt::format("{:{}.{}e}", value, width, width >= 7 ? 1 : 0);
}

std::string placement_columns(const Placement& p) {
  std::string wrong = p.wrong < 0 ? "   N/A" : fmt::format("{:6g}", static_cast<double>(p.wrong));
  return fmt::format("  {}  {}  {}  {}", fit(p.time_us, 7), fit(p.algbw_gbps, 6),
                     fit(p.busbw_gbps, 6), wrong);
}

}  // namespace

// A minimal JSON builder: separators and string escapes; numbers that are not finite become
// null.
class Json {
 public:
  Json& begin(char bracket) {
    value_prefix();
    out_ += bracket;
    first_.push_back(true);
    return *this;
  }
  Json& end(char bracket) {
    out_ += bracket;
    first_.pop_back();
    return *this;
  }
  Json& key(std::string_view k) {
    value_prefix();
    quote(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  Json& str(std::string_view s) {
    value_prefix();
    quote(s);
    return *this;
  }
  Json& num(double v) {
    value_prefix();
    out_ += std::isfinite(v) ? fmt::format("{}", v) : "null";
    return *this;
  }
  Json& integer(int64_t v) {
    value_prefix();
    out_ += fmt::format("{}", v);
    return *this;
  }
  Json& boolean(bool v) {
    value_prefix();
    out_ += v ? "true" : "false";
    return *this;
  }
  Json& null() {
    value_prefix();
    out_ += "null";
    return *this;
  }
  const std::string& text() const { return out_; }

 private:
  void value_prefix() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty() && !first_.back()) out_ += ',';
    if (!first_.empty()) first_.back() = false;
  }
  void quote(std::string_view s) {
    out_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        out_ += fmt::format("\\u{:04x}", static_cast<int>(c));
      } else {
        out_ += c;
      }
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

namespace {

void json_placement(Json& j, const char* name, const Placement& p) {
  j.key(name).begin('{');
  j.key("time").num(p.time_us);
  j.key("alg_bw").num(p.algbw_gbps);
  j.key("bus_bw").num(p.busbw_gbps);
  j.key("nwrong");
  if (p.wrong < 0) {
    j.null();
  } else {
    j.integer(p.wrong);
  }
  j.end('}');
}

}  // namespace

Reporter::Reporter(const Options& options, const World& world, const char* tool, int argc,
                   char** argv)
    : options_(options), world_(world), tool_(tool), start_time_(now_string()) {
  for (int i = 0; i < argc; ++i) args_.emplace_back(argv[i]);
}

Reporter::~Reporter() {
  if (json_ != nullptr) std::fclose(json_);
}

void Reporter::print_configuration() const {
  int library = 0;
  ncclGetVersion(&library);
  const Options& o = options_;
  fmt::print("# nccl-tests-compatible chorus {} version {}.{}.{} nccl-headers={} nccl-library={}\n",
             tool_, CHORUS_MAJOR, CHORUS_MINOR, CHORUS_PATCH, NCCL_VERSION_CODE, library);
  fmt::print("# Library: {}\n", chorusBuildInfo());
  fmt::print("# Collective test starting: {}\n", tool_);
  fmt::print(
      "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: "
      "{} agg iters: {} validation: {} graph: 0\n",
      o.nthreads, o.min_bytes, o.max_bytes, o.step_factor > 1 ? o.step_factor : o.step_bytes,
      o.step_factor > 1 ? "factor" : "bytes", o.warmup_iters, o.iters, o.agg_iters,
      o.check_iters);
  static const char* kAverage[] = {"rank 0", "mean over ranks", "min over ranks", "max over ranks"};
  fmt::print("# Ranks: {} = {} process{} ({}) x {} thread{}; issue: {}; time: {} (-a {})\n",
             world_.nprocs * o.nthreads, world_.nprocs, world_.nprocs == 1 ? "" : "es",
             launcher_name(world_.launcher), o.nthreads, o.nthreads == 1 ? "" : "s",
             o.blocking      ? "NULL stream, each call synchronous (-z 1)"
             : o.stream_null ? "NULL stream, each call synchronous (-y 1)"
                             : "Chorus host stream, then chorusStreamSynchronize (-z 0)",
             kAverage[o.average], o.average);
  if (o.compress.enabled) {
    fmt::print("# Compression: {} (chorus*Compressed, one compressor per rank)\n",
               compress_description(o.compress));
  } else if (const char* env = std::getenv("CHORUS_COMPRESS"); env != nullptr && *env != '\0') {
    fmt::print("# Compression: CHORUS_COMPRESS={} (transparent mode; -c checks compressible "
               "AllReduce and ReduceScatter calls against the FP8 error bound)\n",
               env);
  }
}

void Reporter::begin(const std::vector<RankInfo>& ranks) {
  ranks_ = ranks;
  open_json();
  print_configuration();
  fmt::print("#\n# Using devices\n");
  for (const RankInfo& r : ranks_) {
    fmt::print(
        "#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [host] Chorus host memory, "
        "process {}\n",
        r.rank, r.pid, r.host, r.device, r.proc);
  }
  fmt::print("#\n");
  // -C 1: nccl-tests' name for times taken with the host clock rather than GPU events; ours
  // are host wall-clock times in both cases, only the label follows the option.
  const char* time_label = options_.report_cputime ? "cputime" : "time";
  fmt::print(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       "
      "in-place          \n",
      "", "", "", "", "");
  fmt::print(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  "
      "{:>6}  {:>6}\n",
      "size", "count", "type", "redop", "root", time_label, "algbw", "busbw", "#wrong", time_label,
      "algbw", "busbw", "#wrong");
  fmt::print(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  "
      "{:>6}  {:>6}\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
      "");
  std::fflush(stdout);
}

void Reporter::row(const Row& r) {
  fmt::print("{:12}  {:12}  {:>8}  {:>6}  {:6}{}{}\n", r.bytes, r.count, dtype_name(r.dtype),
             op_name(r.op), r.root, placement_columns(r.out_of_place),
             placement_columns(r.in_place));
  std::fflush(stdout);
  for (const Placement* p : {&r.out_of_place, &r.in_place}) {
    busbw_sum_ += p->busbw_gbps;
    ++busbw_count_;
    if (p->wrong > 0) ++out_of_bounds_;
  }
  rows_.push_back(r);
}

void Reporter::bytes(unsigned long long wire, unsigned long long data) {
  wire_bytes_ = wire;
  data_bytes_ = data;
}

void Reporter::end(const std::string& error) {
  double average = busbw_count_ > 0 ? busbw_sum_ / busbw_count_ : 0.0;
  fmt::print("# {:<20} : {} {}\n", "Out of bounds values", out_of_bounds_,
             out_of_bounds_ ? "FAILED" : "OK");
  fmt::print("# {:<20} : {:g} \n", "Avg bus bandwidth", average);
  if (options_.compress.enabled || wire_bytes_ != data_bytes_) {
    double percent = data_bytes_ > 0 ? 100.0 * static_cast<double>(wire_bytes_) /
                                           static_cast<double>(data_bytes_)
                                     : 0.0;
    fmt::print("# wire bytes: {} of uncompressed {} ({:.2f}%), timed calls, all ranks\n",
               wire_bytes_, data_bytes_, percent);
  }
  if (options_.memory_report != 0 && memory_bytes_ > 0) {
    // Host memory only: no device memory to report. ru_maxrss is in KiB on Linux.
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print("# {:<20} : {} bytes per rank (send + receive buffers)\n", "User-Allocated",
               memory_bytes_);
    fmt::print("# {:<20} : {:.1f} MiB (rank 0's process)\n", "Peak resident",
               static_cast<double>(usage.ru_maxrss) / 1024.0);
  }
  if (!error.empty()) fmt::print("# error: {}\n", error);
  fmt::print("#\n# Collective test concluded: {}\n", tool_);
  std::fflush(stdout);
  if (json_ != nullptr) write_json(error);
}

void Reporter::open_json() {
  if (options_.output_file.empty()) return;
  // As nccl-tests: never overwrite; FILE exists -> FILE.0, FILE.1, ...
  std::string path = options_.output_file;
  for (int n = 0; json_ == nullptr; ++n) {
    json_ = std::fopen(path.c_str(), "wx");
    if (json_ != nullptr) break;
    if (errno != EEXIST || n > 1000) {
      fmt::print("# skipping json output; {} not accessible: {}\n", path, std::strerror(errno));
      return;
    }
    path = fmt::format("{}.{}", options_.output_file, n);
  }
  fmt::print("# Writing JSON output to {}\n", path);
}

void Reporter::json_config(Json& j) const {
  const Options& o = options_;
  j.key("config").begin('{');
  j.key("nthreads").integer(o.nthreads);
  j.key("ngpus").integer(1);
  j.key("nprocs").integer(world_.nprocs);
  j.key("launcher").str(launcher_name(world_.launcher));
  j.key("minimum_bytes").integer(static_cast<int64_t>(o.min_bytes));
  j.key("maximum_bytes").integer(static_cast<int64_t>(o.max_bytes));
  if (o.step_factor > 1) {
    j.key("step_factor").integer(static_cast<int64_t>(o.step_factor));
  } else {
    j.key("step_bytes").integer(static_cast<int64_t>(o.step_bytes));
  }
  j.key("warmup_iters").integer(o.warmup_iters);
  j.key("iterations").integer(o.iters);
  j.key("aggregated_iterations").integer(o.agg_iters);
  j.key("validation").integer(o.check_iters);
  j.key("graph").integer(0);
  j.key("blocking_collectives").boolean(o.null_stream());
  j.key("average").integer(o.average);
  j.key("devices").begin('[');
  for (const RankInfo& r : ranks_) {
    j.begin('{');
    j.key("rank").integer(r.rank);
    j.key("group").integer(0);
    j.key("pid").integer(r.pid);
    j.key("hostname").str(r.host);
    j.key("device").integer(r.device);
    j.key("device_hex").str("host");
    j.key("device_info").str(fmt::format("Chorus host memory, process {}", r.proc));
    j.end('}');
  }
  j.end(']').end('}');
}

void Reporter::json_results(Json& j) const {
  j.key("results").begin('[');
  for (const Row& r : rows_) {
    j.begin('{');
    j.key("size").integer(static_cast<int64_t>(r.bytes));
    j.key("count").integer(static_cast<int64_t>(r.count));
    j.key("type").str(dtype_name(r.dtype));
    j.key("redop").str(op_name(r.op));
    j.key("root").integer(r.root);
    json_placement(j, "out_of_place", r.out_of_place);
    json_placement(j, "in_place", r.in_place);
    j.key("actual_iterations").integer(options_.iters);
    j.key("experiment_name").str(tool_);
    j.end('}');
  }
  j.end(']');
}

void Reporter::write_json(const std::string& error) {
  Json j;
  j.begin('{');
  j.key("version").integer(2);
  j.key("start_time").str(start_time_);
  j.key("args").begin('[');
  for (const std::string& a : args_) j.str(a);
  j.end(']');
  int library = 0;
  ncclGetVersion(&library);
  j.key("nccl_version").integer(library);
  j.key("library").str(chorusBuildInfo());
  json_config(j);
  json_results(j);
  j.key("out_of_bounds").begin('{');
  j.key("count").integer(out_of_bounds_);
  j.key("okay").boolean(out_of_bounds_ == 0);
  j.end('}');
  j.key("average_bus_bandwidth").begin('{');
  j.key("bandwidth").num(busbw_count_ > 0 ? busbw_sum_ / busbw_count_ : 0.0);
  j.key("okay").str("unchecked");
  j.end('}');
  j.key("wire_bytes").integer(static_cast<int64_t>(wire_bytes_));
  j.key("data_bytes").integer(static_cast<int64_t>(data_bytes_));
  if (options_.compress.enabled) j.key("compression").str(compress_description(options_.compress));
  j.key("errors").begin('[');
  if (!error.empty()) j.str(error);
  j.end(']');
  j.key("end_time").str(now_string());
  j.end('}');
  std::fputs(j.text().c_str(), json_);
  std::fputc('\n', json_);
  std::fclose(json_);
  json_ = nullptr;
}

}  // namespace chorus::bench
