// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/topo_cluster_test.cc
// src/topo/cluster: the topology-file parser (every error names the line and what was
// expected), rank placement (host, local index, rail) and the host-aware ring order, on
// clusters this machine cannot build (64 hosts x 8 ranks x 4 rails).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "topo/cluster.h"

namespace chorus::topo {
namespace {

constexpr const char* kBase = "intra 0.5 40\nrail nic0 2 100\n";

Cluster parse_ok(const std::string& text) {
  auto c = parse_cluster(text, "t.topo");
  INFO(c.status().to_string());
  REQUIRE(c.ok());
  return std::move(c).value();
}

// What Comm::set_ring_order computed before host_ring_order existed: the reference.
std::vector<int> reference_ring(const std::vector<uint64_t>& host) {
  const int n = static_cast<int>(host.size());
  std::vector<int> ring;
  std::vector<bool> placed(n, false);
  for (int r = 0; r < n; ++r) {
    if (placed[r]) continue;
    for (int q = r; q < n; ++q) {
      if (!placed[q] && host[q] == host[r]) {
        placed[q] = true;
        ring.push_back(q);
      }
    }
  }
  return ring;
}

TEST_CASE("topology file: 2 hosts x 2 ranks x 2 rails, with comments and units", "[unit][topo]") {
  Cluster c = parse_ok(
      "# a small cluster\n"
      "intra 0.5us 40GB/s   # shared memory\n"
      "\n"
      "rail nic0 2us 100Gbit/s\n"
      "   rail  nic1\t2.5 200\n"
      "host alpha 2\n"
      "host beta 2\r\n");
  CHECK(c.intra().alpha_us == 0.5);
  CHECK(c.intra().gbytes_per_s == 40);
  REQUIRE(c.rails().size() == 2);
  CHECK(c.rails()[0].name == "nic0");
  CHECK(c.rails()[0].alpha_us == 2);
  CHECK(c.rails()[0].gbits_per_s == 100);
  CHECK(c.rails()[1].name == "nic1");
  CHECK(c.rails()[1].alpha_us == 2.5);
  CHECK(c.rails()[1].gbits_per_s == 200);
  REQUIRE(c.hosts().size() == 2);
  CHECK(c.hosts()[0].name == "alpha");
  CHECK(c.hosts()[1].name == "beta");
  CHECK(c.nranks() == 4);
  CHECK(c.ranks_per_host() == 2);
  const int host[] = {0, 0, 1, 1};
  const int local[] = {0, 1, 0, 1};
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(c.host_of(r) == host[r]);
    CHECK(c.local_index(r) == local[r]);
    CHECK(c.rail_of(r) == local[r]);
  }
  CHECK(c.first_rank(1) == 2);
}

TEST_CASE("topology file: hosts of different sizes are placed in block order", "[unit][topo]") {
  Cluster c = parse_ok(std::string(kBase) +
                       "rail nic1 2 100\nrail nic2 2 100\nhost a 3\nhosts 2 1\nhost z 5\n");
  REQUIRE(c.hosts().size() == 4);
  CHECK(c.hosts()[1].name == "h0");
  CHECK(c.hosts()[2].name == "h1");
  CHECK(c.nranks() == 10);
  CHECK(c.ranks_per_host() == 0);
  CHECK(c.host_of(2) == 0);
  CHECK(c.host_of(3) == 1);
  CHECK(c.host_of(4) == 2);
  CHECK(c.host_of(5) == 3);
  CHECK(c.host_of(9) == 3);
  CHECK(c.local_index(9) == 4);
  // Local index mod 3 rails: z's ranks 5..9 use rails 0 1 2 0 1.
  std::vector<int> rails;
  for (int r = 5; r < 10; ++r) rails.push_back(c.rail_of(r));
  CHECK(rails == std::vector<int>{0, 1, 2, 0, 1});
  CHECK(c.host_of_rank() == std::vector<uint64_t>{0, 0, 0, 1, 2, 3, 3, 3, 3, 3});
}

TEST_CASE("topology file: 64 hosts x 8 ranks x 4 rails, and its ring", "[unit][topo]") {
  Cluster c = parse_ok(
      "intra 0.7 60\nrail mlx5_0 2 400\nrail mlx5_1 2 400\nrail mlx5_2 2 400\n"
      "rail mlx5_3 2 400\nhosts 64 8\n");
  REQUIRE(c.nranks() == 512);
  CHECK(c.ranks_per_host() == 8);
  CHECK(c.hosts().back().name == "h63");
  for (int r = 0; r < 512; ++r) {
    INFO("rank " << r);
    REQUIRE(c.host_of(r) == r / 8);
    REQUIRE(c.local_index(r) == r % 8);
    REQUIRE(c.rail_of(r) == r % 8 % 4);
  }
  const std::vector<uint64_t> host = c.host_of_rank();
  std::vector<int> ring = host_ring_order(host);
  REQUIRE(ring.size() == 512);
  for (int i = 0; i < 512; ++i) REQUIRE(ring[i] == i);  // block placement: already host-ordered
  CHECK(inter_host_hops(ring, host) == 64);

  // The same hosts with ranks dealt round-robin (rank r on host r mod 64): the rank-order ring
  // changes host at every step; the host-aware ring still crosses once per host.
  std::vector<uint64_t> dealt(512);
  std::vector<int> identity(512);
  for (int r = 0; r < 512; ++r) {
    dealt[r] = static_cast<uint64_t>(r % 64);
    identity[r] = r;
  }
  CHECK(inter_host_hops(identity, dealt) == 512);
  std::vector<int> aware = host_ring_order(dealt);
  CHECK(inter_host_hops(aware, dealt) == 64);
  CHECK(aware == reference_ring(dealt));
  CHECK(aware[0] == 0);
  CHECK(aware[1] == 64);
  CHECK(aware[8] == 1);
}

TEST_CASE("host ring order matches Comm's ring on random placements", "[unit][topo]") {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 64);
    const int hosts = 1 + static_cast<int>(rng() % 9);
    std::vector<uint64_t> host(n);
    for (auto& h : host) h = 0x9e3779b97f4a7c15ULL * (1 + rng() % hosts);  // hash-like ids
    INFO("trial " << trial << ": " << n << " ranks");
    std::vector<int> ring = host_ring_order(host);
    REQUIRE(ring == reference_ring(host));
    std::vector<uint64_t> seen;
    for (uint64_t h : host)
      if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
    CHECK(inter_host_hops(ring, host) == (seen.size() > 1 ? static_cast<int>(seen.size()) : 0));
  }
  CHECK(host_ring_order({}).empty());
  CHECK(inter_host_hops({}, {}) == 0);
  CHECK(inter_host_hops({0}, {7}) == 0);
}

// Whether a file describes a running communicator (CHORUS_TOPO_FILE): the same ranks, grouped
// into the same hosts in block order; anything else is named.
TEST_CASE("topology file: placement_mismatch compares the file with a communicator's hosts",
          "[unit][topo]") {
  const Cluster c = parse_ok(std::string(kBase) + "host a 2\nhost b 3\n");
  CHECK(placement_mismatch(c, {{0, 1}, {2, 3, 4}}).empty());
  CHECK_THAT(placement_mismatch(c, {{0, 1}, {2, 3}}),
             Catch::Contains("5 ranks on 2 host(s) of 2+3 ranks") &&
                 Catch::Contains("the communicator has 4 ranks"));
  CHECK_THAT(placement_mismatch(c, {{0, 1, 2, 3, 4}}), Catch::Contains("ranks are on 1 host(s)"));
  CHECK_THAT(placement_mismatch(c, {{0, 2}, {1, 3, 4}}),
             Catch::Contains("the communicator's host 0 holds ranks 0 2"));
  CHECK_THAT(placement_mismatch(c, {{0, 1, 2}, {3, 4}}),
             Catch::Contains("the communicator's host 0 holds ranks 0 1 2"));
  const Cluster one = parse_ok(std::string(kBase) + "hosts 1 3\n");
  CHECK(placement_mismatch(one, {{0, 1, 2}}).empty());
}

TEST_CASE("topology file: exactly 65536 ranks is the limit", "[unit][topo]") {
  Cluster c = parse_ok(std::string(kBase) + "hosts 8192 8\n");
  CHECK(c.nranks() == kMaxClusterRanks);
  CHECK(c.host_of(kMaxClusterRanks - 1) == 8191);
}

TEST_CASE("topology file errors name the line and what was expected", "[unit][topo]") {
  const std::string base = kBase;  // lines 1 and 2
  const std::pair<std::string, std::string> cases[] = {
      {base + "hosts 1 1\nswitch s0\n",
       "t.topo:4: unknown keyword 'switch' (expected intra, rail, host or hosts)"},
      {base + "Host a 1\n", "t.topo:3: unknown keyword 'Host'"},
      {"intra 1\n", "t.topo:1: expected 'intra <alpha_us> <GB/s>': <GB/s> is missing"},
      {"intra\n", "t.topo:1: expected 'intra <alpha_us> <GB/s>': <alpha_us> is missing"},
      {"intra 1x 2\n",
       "t.topo:1: expected 'intra <alpha_us> <GB/s>': <alpha_us> must be a positive number (in "
       "us), not '1x'"},
      {"intra nan 2\n", "<alpha_us> must be a positive number (in us), not 'nan'"},
      {"intra 1 inf\n", "<GB/s> must be a positive number (in GB/s), not 'inf'"},
      {"intra 1 40Gbit/s\n", "<GB/s> must be a positive number (in GB/s), not '40Gbit/s'"},
      {"intra 1 us\n", "<GB/s> must be a positive number (in GB/s), not 'us'"},
      {"intra 1 2 3\n", "t.topo:1: unexpected '3' after 'intra <alpha_us> <GB/s>'"},
      {base + "intra 1 2\n", "t.topo:3: a second 'intra' line (the first is line 1)"},
      {"rail\n", "t.topo:1: expected 'rail <name> <alpha_us> <Gbit/s>': <name> is missing"},
      {"rail a 2\n", "t.topo:1: expected 'rail <name> <alpha_us> <Gbit/s>': <Gbit/s> is missing"},
      {"rail a -1 100\n",
       "t.topo:1: expected 'rail <name> <alpha_us> <Gbit/s>': <alpha_us> must be a positive number "
       "(in us), not '-1'"},
      {"rail a 2 0\n", "<Gbit/s> must be a positive number (in Gbit/s), not '0'"},
      {"rail a 100Gbit/s 2us\n", "<alpha_us> must be a positive number (in us), not '100Gbit/s'"},
      {"rail a 2 100 x\n", "t.topo:1: unexpected 'x' after 'rail <name> <alpha_us> <Gbit/s>'"},
      {base + "rail nic0 1 1\n", "t.topo:3: rail 'nic0' is already defined on line 2"},
      {"host a\n", "t.topo:1: expected 'host <name> <ranks>': <ranks> is missing"},
      {"host a 0\n",
       "t.topo:1: expected 'host <name> <ranks>': <ranks> must be a positive integer, not '0'"},
      {"host a -2\n", "<ranks> must be a positive integer, not '-2'"},
      {"host a 1.5\n", "<ranks> must be a positive integer, not '1.5'"},
      {"host a 2 b\n", "t.topo:1: unexpected 'b' after 'host <name> <ranks>'"},
      {base + "host a 1\nhost a 1\n", "t.topo:4: host 'a' is already defined on line 3"},
      {base + "host h1 2\nhosts 4 2\n", "t.topo:4: host 'h1' is already defined on line 3"},
      {"hosts 4\n", "t.topo:1: expected 'hosts <count> <ranks>': <ranks> is missing"},
      {"hosts 0 8\n",
       "t.topo:1: expected 'hosts <count> <ranks>': <count> must be a positive integer, not '0'"},
      {"hosts -1 8\n", "<count> must be a positive integer, not '-1'"},
      {base + "hosts 8193 8\n", "t.topo:3: more than 65536 ranks"},
      {base + "hosts 8192 8\nhost extra 1\n", "t.topo:4: more than 65536 ranks"},
      {base + "host big 65537\n", "t.topo:3: more than 65536 ranks"},
      {base + "host big 99999999999999999999\n", "t.topo:3: more than 65536 ranks"},
      {base + "hosts 99999999999 99999999999\n", "t.topo:3: more than 65536 ranks"},
      {base,
       "t.topo: no 'host <name> <ranks>' or 'hosts <count> <ranks>' line: a cluster needs a host"},
      {"intra 1 1\nhosts 2 2\n",
       "t.topo: no 'rail <name> <alpha_us> <Gbit/s>' line: a cluster needs a rail"},
      {"rail a 1 1\nhosts 2 2\n", "t.topo: no 'intra <alpha_us> <GB/s>' line"},
      {"", "t.topo: no 'intra <alpha_us> <GB/s>' line"},
      {"# only a comment\n", "t.topo: no 'intra"},
  };
  for (const auto& [text, expected] : cases) {
    INFO("file:\n" << text);
    auto c = parse_cluster(text, "t.topo");
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == Code::kInvalidArgument);
    CHECK_THAT(c.status().message(), Catch::Contains(expected));
  }
}

TEST_CASE("topology file that cannot be read", "[unit][topo]") {
  auto c = read_cluster_file("/nonexistent/cluster.topo");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(),
             Catch::Contains("cannot read topology file /nonexistent/cluster.topo"));
}

TEST_CASE("Cluster::make checks what the file grammar requires", "[unit][topo]") {
  const IntraLink intra{0.5, 40};
  const std::vector<Rail> rails{{"nic0", 2, 100}};
  const std::vector<ClusterHost> hosts{{"a", 2}, {"b", 3}};
  auto ok = Cluster::make(intra, rails, hosts);
  REQUIRE(ok.ok());
  CHECK(ok->nranks() == 5);
  auto expect_error = [](Result<Cluster> c, const std::string& text) {
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(c.status().message(), Catch::Contains(text));
  };
  expect_error(Cluster::make({0, 40}, rails, hosts), "intra-host link needs a positive latency");
  expect_error(Cluster::make(intra, {}, hosts), "no rail");
  expect_error(Cluster::make(intra, rails, {}), "no host");
  expect_error(Cluster::make(intra, {{"x", 1, 1}, {"x", 1, 1}}, hosts), "two rails named 'x'");
  expect_error(Cluster::make(intra, {{"x", 1, -1}}, hosts),
               "rail 'x' needs a positive latency and rate");
  expect_error(Cluster::make(intra, rails, {{"a", 1}, {"a", 1}}), "two hosts named 'a'");
  expect_error(Cluster::make(intra, rails, {{"a", 0}}), "host 'a' has no rank");
  expect_error(Cluster::make(intra, rails, {{"a", 65536}, {"b", 1}}), "more than 65536 ranks");
}

}  // namespace
}  // namespace chorus::topo
