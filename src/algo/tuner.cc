// SPDX-License-Identifier: Apache-2.0
// File: src/algo/tuner.cc
// The cost model of every algorithm, and the choice (see tuner.h).
#include "algo/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>

#include "common/log.h"
#include "common/params.h"

namespace chorus::algo {

namespace {

struct AlgoName {
  Algo algo;
  const char* name;
};
constexpr AlgoName kNames[] = {
    {Algo::kRing, "ring"},         {Algo::kRecursiveDoubling, "rd"}, {Algo::kHalvingDoubling, "rhd"},
    {Algo::kOneShot, "oneshot"},   {Algo::kTwoShot, "twoshot"},      {Algo::kTree, "tree"},
    {Algo::kChain, "chain"},       {Algo::kDirect, "direct"},        {Algo::kBruck, "bruck"},
    {Algo::kPairwise, "pairwise"}, {Algo::kHierarchical, "hier"},     {Algo::kBox, "box"},
};

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<CollKind> parse_coll(std::string_view name) {
  std::string n = lower(name);
  if (n == "allreduce") return CollKind::kAllReduce;
  if (n == "reducescatter") return CollKind::kReduceScatter;
  if (n == "allgather") return CollKind::kAllGather;
  if (n == "broadcast" || n == "bcast") return CollKind::kBroadcast;
  if (n == "reduce") return CollKind::kReduce;
  if (n == "alltoall") return CollKind::kAlltoAll;
  if (n == "gather") return CollKind::kGather;
  if (n == "scatter") return CollKind::kScatter;
  return std::nullopt;
}

double log2_ceil(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

// CHORUS_ALGO, parsed: the algorithm forced for a collective, if any.
std::optional<Algo> forced_algo(CollKind coll) {
  struct Parsed {
    std::string spec;
    std::vector<std::pair<std::optional<CollKind>, Algo>> entries;
  };
  static std::mutex mutex;
  static Parsed parsed;
  const std::string& spec = params::kAlgo.get();
  if (spec.empty() || lower(spec) == "auto") return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex);
  if (parsed.spec != spec) {
    parsed = Parsed{spec, {}};
    std::string_view rest(spec);
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      size_t colon = item.find(':');
      auto algo = parse_algo(colon == std::string_view::npos ? item : item.substr(colon + 1));
      std::optional<CollKind> c;
      if (colon != std::string_view::npos) c = parse_coll(item.substr(0, colon));
      if (!algo || (colon != std::string_view::npos && !c)) {
        CHORUS_WARN(kColl, "CHORUS_ALGO: ignoring '{}' (collectives: allreduce, reducescatter, "
                    "allgather, broadcast, reduce, alltoall; algorithms: ring, rd, rhd, oneshot, "
                    "twoshot, tree, chain, direct, bruck, pairwise, hier, box)", item);
        continue;
      }
      parsed.entries.emplace_back(c, *algo);
    }
  }
  const auto& valid = algorithms_for(coll);
  for (const auto& [c, algo] : parsed.entries) {
    if (c && *c != coll) continue;
    if (std::find(valid.begin(), valid.end(), algo) != valid.end()) return algo;
  }
  return std::nullopt;
}

}  // namespace

const char* algo_name(Algo algo) {
  for (const auto& n : kNames)
    if (n.algo == algo) return n.name;
  return "?";
}

std::optional<Algo> parse_algo(std::string_view name) {
  std::string n = lower(name);
  for (const auto& entry : kNames)
    if (n == entry.name) return entry.algo;
  if (n == "rabenseifner" || n == "halvingdoubling") return Algo::kHalvingDoubling;
  if (n == "recursivedoubling") return Algo::kRecursiveDoubling;
  if (n == "hierarchical") return Algo::kHierarchical;
  return std::nullopt;
}

const std::vector<Algo>& algorithms_for(CollKind coll) {
  static const std::vector<Algo> kAllReduce = {Algo::kRing, Algo::kRecursiveDoubling,
                                               Algo::kHalvingDoubling, Algo::kOneShot,
                                               Algo::kTwoShot, Algo::kTree,
                                               Algo::kHierarchical, Algo::kBox};
  static const std::vector<Algo> kReduceScatter = {Algo::kRing, Algo::kHalvingDoubling,
                                                    Algo::kDirect, Algo::kHierarchical, Algo::kBox};
  static const std::vector<Algo> kAllGather = {Algo::kRing, Algo::kBruck, Algo::kDirect,
                                               Algo::kHierarchical, Algo::kBox};
  static const std::vector<Algo> kRooted = {Algo::kChain, Algo::kTree, Algo::kHierarchical,
                                            Algo::kBox};
  static const std::vector<Algo> kAlltoAll = {Algo::kPairwise, Algo::kBruck, Algo::kHierarchical,
                                              Algo::kBox};
  static const std::vector<Algo> kDirectOnly = {Algo::kDirect, Algo::kBox};
  switch (coll) {
    case CollKind::kAllReduce: return kAllReduce;
    case CollKind::kReduceScatter: return kReduceScatter;
    case CollKind::kAllGather: return kAllGather;
    case CollKind::kBroadcast:
    case CollKind::kReduce: return kRooted;
    case CollKind::kAlltoAll: return kAlltoAll;
    default: return kDirectOnly;
  }
}

std::string CostModel::to_string() const {
  std::string boxes = box_bytes > 0 ? fmt::format(", small-message boxes up to {} bytes", box_bytes)
                                    : std::string();
  std::string rail_count = rails > 1 ? fmt::format(", {} rails", rails) : std::string();
  return fmt::format("alpha {:.2f} us, beta {:.2f} GB/s, gamma {:.2f} GB/s, codec {:.2f} GB/s, "
                     "within a host alpha {:.2f} us, beta {:.2f} GB/s{}{} ({})",
                     alpha_us, beta_gbps, gamma_gbps, codec_gbps, intra_alpha_us,
                     intra_beta_gbps, rail_count, boxes, source);
}

double host_link_share(const Shape& shape) {
  const int n = shape.nranks;
  if (shape.hosts < 2 || n < 2) return 1;
  const double local = shape.local > 0 ? shape.local : static_cast<double>(n) / shape.hosts;
  return std::max(1.0, local * (n - local) / (n - 1.0));
}

CostModel across_model(const CostModel& m, const Shape& shape) {
  CostModel across = m;
  const int local = std::max(shape.local, 1);
  across.beta_gbps = m.beta_gbps * std::clamp(shape.rails, 1, local) / local;
  return across;
}

CostModel within_host_model(const CostModel& m) {
  CostModel local = m;
  local.alpha_us = m.intra_alpha_us;
  local.beta_gbps = m.intra_beta_gbps;
  return local;
}

Algo across_hosts_algo(const CostModel& m, size_t bytes, const Shape& shape) {
  const CostModel across = across_model(m, shape);
  const size_t part = bytes / std::max(shape.local, 1);
  Algo best = Algo::kRing;
  for (Algo a : {Algo::kTwoShot, Algo::kHalvingDoubling, Algo::kRecursiveDoubling}) {
    if (predict_us(across, a, CollKind::kAllReduce, part, Shape::flat(shape.hosts)) <
        predict_us(across, best, CollKind::kAllReduce, part, Shape::flat(shape.hosts)))
      best = a;
  }
  return best;
}

namespace {

// Pieces of a hierarchical Broadcast: at least 2 MiB (and a whole chunk) each, at most 8.
constexpr size_t kRootedMinPieceBytes = size_t{2} << 20;
constexpr int kRootedMaxPieces = 8;

// The pipelined hierarchical Broadcast (Reduce: the same stages in the other order) with the
// given stages: the chain across hosts runs as one pipeline over the whole call (its chunks),
// a tree once per piece; within each host, one Broadcast (Reduce) per piece over the
// intra-host link, piece p while piece p + 1 crosses. Across hosts only the ranks of one local
// index talk, one flow per host: the link's whole rate.
double rooted_hier_us(const CostModel& m, CollKind coll, size_t bytes, const Shape& shape,
                      const RootedPlan& plan) {
  const Shape hosts = Shape::flat(shape.hosts), host = Shape::flat(shape.local);
  const int p = plan.pieces;
  const size_t piece = (bytes + p - 1) / p;
  const double across = plan.across == Algo::kChain
                            ? predict_us(m, Algo::kChain, coll, bytes, hosts) / p
                            : predict_us(m, plan.across, coll, piece, hosts);
  const double within = predict_us(within_host_model(m), plan.within, coll, piece, host);
  return p * std::max(across, within) + std::min(across, within);
}

}  // namespace

RootedPlan hier_rooted_plan(const CostModel& m, CollKind coll, size_t bytes, const Shape& shape) {
  RootedPlan best;
  const size_t chunk = static_cast<size_t>(std::max<int64_t>(1, params::kChunkBytes.get()));
  const size_t chunks = std::max<size_t>(1, (bytes + chunk - 1) / chunk);
  const size_t piece = std::max(kRootedMinPieceBytes, chunk);
  best.pieces = static_cast<int>(
      std::min<size_t>(chunks, std::clamp<size_t>(bytes / piece, 1, kRootedMaxPieces)));
  if (shape.hosts < 2 || shape.local < 2) return best;
  double best_us = 0;
  bool first = true;
  for (Algo across : {Algo::kChain, Algo::kTree}) {
    for (Algo within : {Algo::kChain, Algo::kTree}) {
      RootedPlan plan{across, within, best.pieces};
      const double t = rooted_hier_us(m, coll, bytes, shape, plan);
      if (first || t < best_us) {
        best = plan;
        best_us = t;
        first = false;
      }
    }
  }
  return best;
}

namespace {

// The hierarchical algorithms (all_*_hier.cc), stage by stage: direct exchanges among a
// host's ranks over the intra-host link, and among the ranks of one local index (one per host)
// over the host's rails, a host's ranks side by side.
//   AllReduce:     reduce-scatter within, AllReduce of each rank's 1/L across, all-gather within
//   ReduceScatter: within, each rank folds the host's blocks of its H counterparts (S/L of the
//                  input); across, a direct ReduceScatter of those
//   AllGather:     across, a direct AllGather of each rank's block (S/L of the output); within,
//                  the H blocks of every local peer
//   AlltoAll:      within, H blocks to every local peer ((L-1)/L of S); across, one row of L
//                  blocks to each other host ((H-1)/H of S, H-1 messages instead of n-L)
double predict_hier_us(const CostModel& m, CollKind coll, size_t bytes, const Shape& shape) {
  if (shape.hosts < 2 || shape.local < 2) return 1e30;
  const CostModel local = within_host_model(m);
  const Shape host = Shape::flat(shape.local), hosts = Shape::flat(shape.hosts);
  const CostModel across = across_model(m, shape);
  const size_t part = bytes / shape.local;
  switch (coll) {
    case CollKind::kAllReduce:
      return predict_us(local, Algo::kDirect, CollKind::kReduceScatter, bytes, host) +
             predict_us(across, across_hosts_algo(m, bytes, shape), CollKind::kAllReduce, part,
                        hosts) +
             predict_us(local, Algo::kDirect, CollKind::kAllGather, bytes, host);
    case CollKind::kReduceScatter:
    case CollKind::kAllGather:
      // One message per host to each local peer: (L-1) H latencies, a quarter each (as the
      // direct algorithms count the extra ones).
      return predict_us(local, Algo::kDirect, coll, bytes, host) +
             (shape.local - 1) * (shape.hosts - 1) * m.intra_alpha_us / 4 +
             predict_us(across, Algo::kDirect, coll, part, hosts);
    case CollKind::kAlltoAll:
      return predict_us(local, Algo::kPairwise, coll, bytes, host) +
             (shape.local - 1) * (shape.hosts - 1) * m.intra_alpha_us / 4 +
             predict_us(across, Algo::kPairwise, coll, bytes, hosts);
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      return rooted_hier_us(m, coll, bytes, shape, hier_rooted_plan(m, coll, bytes, shape));
    default: return 1e30;
  }
}

}  // namespace

double predict_us(const CostModel& m, Algo algo, CollKind coll, size_t bytes, const Shape& shape) {
  const int n = shape.nranks;
  if (n <= 1) return 0;
  if (algo == Algo::kHierarchical) return predict_hier_us(m, coll, bytes, shape);
  const double a = m.alpha_us, S = static_cast<double>(bytes);
  // Across hosts, an algorithm that talks to every peer has the host's ranks share its link:
  // each sends (n - local) / n of its traffic off the host, local of them side by side, where
  // the model's per-rank figure assumes (n - 1) / n over a link of its own. The rings (each
  // host's ranks adjacent) cross each link once each way.
  const double share = algo != Algo::kRing && algo != Algo::kChain ? host_link_share(shape) : 1;
  const double wire = m.beta_gbps * 1e3 / share, fold = m.gamma_gbps * 1e3;  // bytes per us
  const double L = log2_ceil(n), part = (n - 1.0) / n;
  const bool pow2 = (n & (n - 1)) == 0;
  const double fold_extra = pow2 ? 0 : 2 * (a + S / wire);  // PowerOfTwoFold's extra steps
  switch (coll) {
    case CollKind::kAllReduce:
      switch (algo) {
        case Algo::kRing: return 2 * (n - 1) * a + 2 * part * S / wire + part * S / fold;
        case Algo::kRecursiveDoubling:
          return L * a + L * S / wire + 2 * L * S / fold + fold_extra;  // fold + snapshot copy
        case Algo::kHalvingDoubling: return 2 * L * a + 2 * part * S / wire + part * S / fold + fold_extra;
        case Algo::kOneShot: return a + (n - 2) * a / 4 + (n - 1) * S / wire + (n - 1) * S / fold;
        case Algo::kTwoShot: return 2 * a + (n - 2) * a / 2 + 2 * part * S / wire + part * S / fold;
        case Algo::kTree: return 2 * L * a + 2 * L * S / wire + L * S / fold;
        default: break;
      }
      break;
    case CollKind::kReduceScatter:
      switch (algo) {
        case Algo::kRing: return (n - 1) * a + part * S / wire + part * S / fold;
        case Algo::kHalvingDoubling:
          return pow2 ? L * a + part * S / wire + part * S / fold
                      : predict_us(m, Algo::kRing, coll, bytes, shape);
        case Algo::kDirect: return a + (n - 2) * a / 4 + part * S / wire + part * S / fold;
        default: break;
      }
      break;
    case CollKind::kAllGather:
      switch (algo) {
        case Algo::kRing: return (n - 1) * a + part * S / wire;
        case Algo::kBruck: return L * a + part * S / wire + S / fold;  // plus the rotation copy
        case Algo::kDirect: return a + (n - 2) * a / 4 + part * S / wire;
        default: break;
      }
      break;
    case CollKind::kBroadcast:
    case CollKind::kReduce: {
      double reduce = coll == CollKind::kReduce ? S / fold : 0;
      double chunk = static_cast<double>(params::kChunkBytes.get());
      double chunks = std::max(1.0, std::ceil(S / chunk));
      if (algo == Algo::kChain) return (n - 2 + chunks) * (a + std::min(S, chunk) / wire) + reduce;
      if (algo == Algo::kTree) return L * (a + S / wire) + L * reduce;
      break;
    }
    case CollKind::kAlltoAll:
      if (algo == Algo::kPairwise) return a + (n - 2) * a / 4 + part * S / wire;
      if (algo == Algo::kBruck) return L * a + L * S / 2 / wire + 2 * L * S / 2 / fold;
      break;
    default:
      return a + part * S / wire;
  }
  return 1e30;  // not an algorithm of this collective
}

size_t box_message_bytes(CollKind coll, size_t bytes, int n) {
  const bool whole = coll == CollKind::kAllReduce || coll == CollKind::kBroadcast ||
                     coll == CollKind::kReduce;
  return whole || n <= 1 ? bytes : bytes / n;
}

Choice choose(const CostModel& model, CollKind coll, size_t bytes, const Shape& shape,
              int max_channels) {
  Choice choice;
  const bool box_fits = shape.box_bytes > 0 && shape.nranks > 1 &&
                        box_message_bytes(coll, bytes, shape.nranks) <= shape.box_bytes;
  auto forced = forced_algo(coll);
  if (forced && (*forced != Algo::kBox || box_fits)) {
    choice.algo = *forced;
    if (choice.algo == Algo::kHierarchical && (shape.hosts < 2 || shape.local < 2))
      choice.algo = Algo::kRing;
  } else if (box_fits) {
    choice.algo = Algo::kBox;
  } else {
    double best = 0;
    bool first = true;
    for (Algo algo : algorithms_for(coll)) {
      if (algo == Algo::kBox) continue;
      double t = predict_us(model, algo, coll, bytes, shape);
      if (first || t < best) {
        best = t;
        choice.algo = algo;
        first = false;
      }
    }
  }
  // Channels split big ring and chain transfers over several connections (e.g. TCP sockets);
  // below a few hundred KiB per channel they only add latency.
  if (max_channels > 1 && (choice.algo == Algo::kRing || choice.algo == Algo::kChain)) {
    size_t per_channel = 512 << 10;
    choice.channels = static_cast<int>(std::clamp<size_t>(bytes / per_channel, 1, max_channels));
  }
  return choice;
}

}  // namespace chorus::algo
