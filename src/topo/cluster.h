// SPDX-License-Identifier: Apache-2.0
// File: src/topo/cluster.h
// A cluster described in a plain-text topology file (in the spirit of NCCL_TOPO_FILE): hosts
// and their ranks, the rails (inter-host links; every host has every rail) and the intra-host
// link, so that tools and tests can plan on clusters this machine cannot build (64 hosts x 8
// ranks x 4 rails). Also the host-aware ring order that Comm uses.
//
// File grammar: one statement a line; '#' starts a comment; words are separated by blanks.
//   intra <alpha_us> <GB/s>           the intra-host link (shared memory): latency, bandwidth
//   rail <name> <alpha_us> <Gbit/s>   one line per rail, in rail order: latency, line rate
//   host <name> <ranks>               one line per host, in rank order
//   hosts <count> <ranks>             shorthand: hosts h0 .. h<count-1>, <ranks> each
// Numbers are positive decimals; ranks and counts are positive integers. A number may carry
// its unit, which must then be the expected one: "2us", "40GB/s", "400Gbit/s". Latency comes
// first on both link lines, as in the tuner file (CHORUS_TUNER_FILE). Exactly one intra line,
// at least one rail and one host; rail names and host names are unique; 65536 ranks at most.
// Ranks are placed in block order: host 0 holds ranks 0 .. n0-1, host 1 the next n1, and so on.
// Example (2 hosts x 2 ranks x 2 rails):
//   intra 0.5 40
//   rail nic0 2us 100Gbit/s
//   rail nic1 2us 100Gbit/s
//   hosts 2 2
// Errors name the place: "cluster.topo:3: expected 'rail <name> <alpha_us> <Gbit/s>'".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace chorus::topo {

inline constexpr int kMaxClusterRanks = 65536;

struct IntraLink {
  double alpha_us = 0;
  double gbytes_per_s = 0;  // GB/s
};

struct Rail {
  std::string name;
  double alpha_us = 0;
  double gbits_per_s = 0;  // Gbit/s, the line rate
};

struct ClusterHost {
  std::string name;
  int ranks = 0;
};

class Cluster {
 public:
  // Checks what the file grammar requires (positive figures, at least one rail and one host,
  // unique names, at most kMaxClusterRanks ranks).
  static Result<Cluster> make(IntraLink intra, std::vector<Rail> rails,
                              std::vector<ClusterHost> hosts);

  const IntraLink& intra() const { return intra_; }
  const std::vector<Rail>& rails() const { return rails_; }
  const std::vector<ClusterHost>& hosts() const { return hosts_; }

  int nranks() const { return first_rank_.back(); }
  // The host (index into hosts()) of `rank`, 0 <= rank < nranks().
  int host_of(int rank) const;
  // The rank's index among its host's ranks.
  int local_index(int rank) const { return rank - first_rank_[host_of(rank)]; }
  int first_rank(int host) const { return first_rank_[host]; }
  // Ranks on every host, or 0 when hosts hold different numbers of ranks.
  int ranks_per_host() const;
  // The rail (index into rails()) the rank sends on: local index mod number of rails, so that
  // with as many rails as ranks per host local rank i talks on rail i (rail-aligned traffic).
  int rail_of(int rank) const { return local_index(rank) % static_cast<int>(rails_.size()); }
  // host_of() for every rank, as host_ring_order() takes it.
  std::vector<uint64_t> host_of_rank() const;

 private:
  Cluster() = default;

  IntraLink intra_;
  std::vector<Rail> rails_;
  std::vector<ClusterHost> hosts_;
  std::vector<int> first_rank_;  // first_rank_[h]: host h's first rank; back(): nranks
};

// Parses topology-file text; `origin` names it in errors ("path:line: ...").
Result<Cluster> parse_cluster(const std::string& text, const std::string& origin);
// The text of the topology file at `path` (kInvalidArgument naming it and why, if unreadable).
Result<std::string> read_cluster_text(const std::string& path);
// Reads and parses the topology file at `path`.
Result<Cluster> read_cluster_file(const std::string& path);

// Whether `cluster` describes a communicator whose ranks sit on `hosts` (hosts[h] lists host
// h's ranks in rank order, hosts in the order of their lowest rank, as Comm::hosts()): as many
// ranks, grouped alike (the file's block order). Empty when it does, else what differs.
std::string placement_mismatch(const Cluster& cluster, const std::vector<std::vector<int>>& hosts);

// The host-aware ring: hosts in the order of their lowest rank, each host's ranks adjacent in
// rank order, so the ring crosses between hosts once per host rather than once per rank.
// host_of_rank[r] identifies rank r's host (a host hash, an index: only equality matters).
std::vector<int> host_ring_order(const std::vector<uint64_t>& host_of_rank);
// The ring's steps (ring[i] -> ring[i+1], and back from the last to the first) that go from
// one host to another: the number of hosts for host_ring_order() when there are two or more.
int inter_host_hops(const std::vector<int>& ring, const std::vector<uint64_t>& host_of_rank);

}  // namespace chorus::topo
