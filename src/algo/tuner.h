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
namespace chorus::topo {
class Cluster;
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
  kHierarchical,  // "hier": within each host, across hosts, within each host again
  kBox,           // one round through shared-memory boxes (src/algo/box.cc)
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
  // The link between two ranks of one host (the hierarchical algorithms' local stages); the
  // same as alpha/beta on one host. From the tuner file, else the transport's declared cost.
  double intra_alpha_us = 1.0;
  double intra_beta_gbps = 8.0;
  // The largest message the small-message algorithms may carry (Shape::box_bytes), agreed by
  // every rank: the least of their CHORUS_BOX_BYTES, 0 when some rank lacks a box to a peer.
  size_t box_bytes = 0;
  // Links a host's inter-host traffic may spread over (Shape::rails): 1 unless a topology file
  // (CHORUS_TOPO_FILE) says more.
  int rails = 1;
  // Some pair of ranks talks over a transport that reaches other hosts (TCP, UCX, verbs); false
  // when every pair shares memory (shm, direct). Agreed by every rank, as the rest.
  bool network = true;
  std::string to_string() const;
};

// The communicator as the cost model sees it: n ranks on `hosts` hosts, `local` ranks on each
// (0: hosts differ). The ring algorithms follow a ring that keeps each host's ranks together
// (Comm::ring()), so their traffic crosses each host's link once each way; the others spread
// theirs over every peer, and a host's ranks share its link.
// A host's inter-host traffic may spread over `rails` links (local rank i on rail i mod
// rails): the hierarchical algorithms' cross-host stages, one flow per local rank, use them
// all; a ring crosses on one.
// `box_bytes`: the largest message the small-message algorithms (kBox) may carry, 0 when some
// peer has no box (transports/small_box.h: shared memory on one host) or they are turned off.
struct Shape {
  int nranks = 1;
  int hosts = 1;
  int local = 1;
  int rails = 1;
  size_t box_bytes = 0;
  static Shape flat(int n) { return Shape{n, 1, n, 1}; }
};
// The bytes of the largest message a kBox algorithm sends for `coll` of `bytes` (as for
// predict_us) on n ranks: the whole buffer, or one of its n blocks.
size_t box_message_bytes(CollKind coll, size_t bytes, int n);

// The model and shape of a cluster described by a topology file (src/topo/cluster.h), for
// planning on clusters this machine cannot build: alpha and beta of its slowest rail, the
// intra-host link (also gamma: folding streams memory as it does), its hosts, ranks per host
// and rails; codec keeps its default.
CostModel model_of(const topo::Cluster& cluster);
Shape shape_of(const topo::Cluster& cluster);

// How many times slower than one rank's own link an algorithm that spreads its traffic over
// every peer finds the network on `shape`: a host's ranks send (n - local) / n of their bytes
// off the host, side by side over its link, where the per-rank model assumes (n - 1) / n over a
// link of their own. 1 on one host.
double host_link_share(const Shape& shape);

// Predicted microseconds for `coll` with `algo` on `shape`; `bytes` is the size of one rank's
// whole buffer (for ReduceScatter/AllGather/AlltoAll/Gather/Scatter: all n blocks).
double predict_us(const CostModel& model, Algo algo, CollKind coll, size_t bytes,
                  const Shape& shape);

// The models of a hierarchical algorithm's stages: one cross-host flow (a host's `local` ranks
// run one each, side by side over its rails), and the link within a host.
CostModel across_model(const CostModel& m, const Shape& shape);
CostModel within_host_model(const CostModel& m);

// The AllReduce a hierarchical AllReduce runs across hosts (among the ranks of one local
// index) for a call of `bytes`.
Algo across_hosts_algo(const CostModel& model, size_t bytes, const Shape& shape);

// The plan of a hierarchical Broadcast or Reduce (broadcast_hier.cc, reduce_hier.cc) of
// `bytes` on `shape`: the algorithm among the ranks of the root's local index (one per host:
// chain or tree), the one within each host (chain or tree), and the pieces the call is cut in
// (whole chunks of CHORUS_CHUNK_BYTES), so that a host's ranks get piece p while piece p + 1
// crosses the network (Reduce: reduce piece p + 1 while piece p crosses).
struct RootedPlan {
  Algo across = Algo::kChain;
  Algo within = Algo::kChain;
  int pieces = 1;
};
RootedPlan hier_rooted_plan(const CostModel& model, CollKind coll, size_t bytes,
                            const Shape& shape);

struct Choice {
  Algo algo = Algo::kRing;
  int channels = 1;
};
// The algorithm for one call: forced by CHORUS_ALGO, or the model's cheapest. `bytes` as above.
// The hierarchical algorithms need several hosts with as many ranks each (shape.local > 1);
// forced elsewhere, the ring is used. The small-message algorithms (kBox) are chosen whenever
// the call's messages fit the boxes (shape.box_bytes): one round, one cache line per message,
// nothing the model's alpha (a FIFO message's latency) describes; forced where they do not
// fit, the model's cheapest of the others is used.
Choice choose(const CostModel& model, CollKind coll, size_t bytes, const Shape& shape,
              int max_channels);

// Measures (or loads) the model of `comm` and agrees on it with every rank. Collective.
Result<CostModel> calibrate(Comm& comm);

// Local measurements, cached per process: reduction (float sum) and memcpy throughput, GB/s.
double local_reduce_gbps();
double local_copy_gbps();
// One FP8 codec pass (fp32 -> e4m3 with fp32 scales, block 128, and the decode into an fp32
// accumulator, averaged, over 8 MiB), GB/s of fp32 input.
double local_codec_gbps();

// Reads a tuner file: lines "<transport> <alpha_us> <beta_gbps>" (transport: direct, shm, tcp)
// "reduce <gamma_gbps>" and "codec <codec_gbps>"; '#' starts a comment. The line of the
// communicator's slowest transport gives alpha/beta, that of its transport within a host (when
// it spans hosts) intra_alpha/intra_beta.
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
