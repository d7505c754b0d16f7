// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/args.h
// The nccl-tests command line of the *_perf tools: options, their parsing and validation with
// a message per mistake, the help text, and the datatype and operator names.
#pragma once

#include <chorus/compress.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

namespace chorus::bench {

inline constexpr int kAllRoots = -1;  // -r all: every rank in turn

// --compress and its companions: time chorus*Compressed (AllReduce, ReduceScatter, AllGather)
// through one compressor per rank instead of the plain call.
struct CompressOptions {
  bool enabled = false;                                     // --compress e4m3|e5m2
  chorusCompressFormat_t format = chorusFp8E4M3;            // (the value of --compress)
  chorusScaleKind_t scale = chorusScaleFloat32;             // --compress-scale fp32|ue8m0
  unsigned int block = 128;                                 // --compress-block N
  chorusRounding_t rounding = chorusRoundNearestEven;       // --compress-rounding
  int error_feedback = 0;                                   // --error-feedback
  chorusCompressPolicy_t policy = chorusCompressAlways;     // --compress-policy always|auto
  bool details_given = false;  // one of the companions was given (needs --compress)
};

// "FP8 E4M3, block 128, fp32 scales, round nearest-even, error feedback off, policy always".
std::string compress_description(const CompressOptions& c);

struct Options {
  size_t min_bytes = size_t{32} << 20;  // -b
  size_t max_bytes = size_t{32} << 20;  // -e
  size_t step_bytes = size_t{1} << 20;  // -i (used when step_factor <= 1)
  size_t step_factor = 1;               // -f (> 1: multiply instead of add)
  int iters = 20;                       // -n
  int agg_iters = 1;                    // -m: calls per timed iteration, in one group
  int run_cycles = 1;                   // -N: sweeps over the sizes (nccl-tests' 0 = forever
                                        //     is refused: a benchmark that never ends)
  int warmup_iters = 1;                 // -w
  int check_iters = 1;                  // -c (0: no correctness check)
  std::vector<int> ops{ncclSum};        // -o: ncclRedOp_t values, verify::kPreMulSum for mulsum
  std::vector<ncclDataType_t> dtypes{ncclFloat};  // -d
  int root = 0;                                   // -r, or kAllRoots
  int nthreads = 1;                               // -t: ranks run as threads of each process
  int average = 1;                                // -a: 0 rank 0, 1 mean, 2 min, 3 max over ranks
  int blocking = 0;         // -z: 0 host stream, then synchronize; 1 NULL stream
  int stream_null = 0;      // -y: 1 NULL stream (nccl-tests' spelling of -z 1 here)
  int local_register = 0;   // -R: 1 buffers from ncclMemAlloc, registered on the comm;
                            //     2 the same, then ncclCommWindowRegister (symmetric)
  int parallel_init = 0;    // -p: accepted; every rank thread always inits on its own
  int cudagraph = 0;        // -G: accepted and ignored (no CUDA graphs on host memory)
  int report_cputime = 0;   // -C: 1 labels the time column "cputime" (it is host time anyway)
  int memory_report = 0;    // -M: 1 prints the memory the tool allocated and the peak RSS
  int timeout_s = 0;        // -T: 0 none
  std::string output_file;  // -J
  CompressOptions compress;  // --compress...
  bool help = false;        // -h

  // The timed calls go to the NULL stream (-z 1 or -y 1), each complete when it returns.
  bool null_stream() const { return blocking != 0 || stream_null != 0; }
};

struct ParsedOptions {
  Options options;
  std::string error;  // non-empty: what was wrong with the command line
};

// Parses argv as nccl-tests does (short and long forms, "--name=value" too). Unknown options,
// missing or malformed values and inconsistent sizes are reported in `error`.
ParsedOptions parse_options(int argc, char** argv);

// The help text (-h), for `program`.
std::string usage_text(const char* program);

// The message sizes in bytes, from min_bytes to max_bytes by step_factor or step_bytes.
std::vector<size_t> message_sizes(const Options& o);

// nccl-tests' names: "float", "bfloat16", "f8e4m3"...; "sum", ..., "mulsum", "none".
const char* dtype_name(ncclDataType_t t);
const char* op_name(int op);

}  // namespace chorus::bench
