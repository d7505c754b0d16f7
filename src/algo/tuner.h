// SPDX-License-Identifier: Apache-2.0
// File: src/algo/tuner.h
// Algorithm selection. Each call picks the algorithm with the least predicted time under an
// alpha-beta-gamma model of its communicator:
//
//   time = rounds * alpha + extra_messages * alpha / 4 + wire_bytes / beta + reduced_bytes / gamma
//
//   alpha  latency of one message over the communicator's slowest transport (us)
//   beta   bandwidth of that transport per rank (GB/s)
//   gamma  local reduction throughput, bytes of one input folded per second (GB/s)
//
// and, for the compressed collectives (src/compress/), `codec`: the FP8 codec's throughput, fp32
// bytes per second through one pass (an encode, or a decode into an accumulator).
//
// The parameters are measured when the communicator is created (a ping-pong between two ranks
// joined by the slowest transport, and the reduction kernel on each rank), or read from
// CHORUS_TUNER_FILE, and agreed by every rank, so that every rank makes the same choice.
// CHORUS_ALGO forces algorithms: "ring", or per collective "allreduce:rhd,broadcast:tree".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace chorus {
class Comm;
}

namespace chorus::algo {

enum class Algo : uint8_t {
  kRing,
  kRecursiveDoubling,  // "rd"
  kHalvingDoubling,    // "rhd": Rabenseifner, recursive halving
  kOneShot,
  kTwoShot,
  kTree,      // binomial
  kChain,     // pipelined chain
  kDirect,    // straight to / from every peer
  kBruck,
  kPairwise,
};
const char* algo_name(Algo algo);
std::optional<Algo> parse_algo(std::string_view name);
// The algorithms that implement a collective.
const std::vector<Algo>& algorithms_for(CollKind coll);

struct CostModel {
  double alpha_us = 5.0;
  double beta_gbps = 2.0;
  double gamma_gbps = 4.0;
  std::string source = "default";
  double codec_gbps = 2.0;
  std::string to_string() const;
};

// Predicted microseconds for `coll` with `algo` on n ranks; `bytes` is the size of one rank's
// whole buffer (for ReduceScatter/AllGather/AlltoAll/Gather/Scatter: all n blocks).
double predict_us(const CostModel& model, Algo algo, CollKind coll, size_t bytes, int n);

struct Choice {
  Algo algo = Algo::kRing;
  int channels = 1;
};
// The algorithm for one call: forced by CHORUS_ALGO, or the model's cheapest. `bytes` as above.
Choice choose(const CostModel& model, CollKind coll, size_t bytes, int n, int max_channels);

// Measures (or loads) the model of `comm` and agrees on it with every rank. Collective.
Result<CostModel> calibrate(Comm& comm);

// Local measurements, cached per process: reduction (float sum) and memcpy throughput, GB/s.
double local_reduce_gbps();
double local_copy_gbps();
// One FP8 codec pass (fp32 -> e4m3 with fp32 scales, block 128, and the decode into an fp32
// accumulator, averaged, over 8 MiB), GB/s of fp32 input.
double local_codec_gbps();

// Reads a tuner file: lines "<transport> <alpha_us> <beta_gbps>" (transport: direct, shm, tcp)
// "reduce <gamma_gbps>" and "codec <codec_gbps>"; '#' starts a comment.
struct TunerFile {
  struct Link {
    std::string transport;
    double alpha_us, beta_gbps;
  };
  std::vector<Link> links;
  double gamma_gbps = 0;
  double codec_gbps = 0;
};
Result<TunerFile> read_tuner_file(const std::string& path);

}  // namespace chorus::algo
