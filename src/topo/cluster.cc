// SPDX-License-Identifier: Apache-2.0
// File: src/topo/cluster.cc
// The topology-file parser (grammar in cluster.h), Cluster's rank placement, and the
// host-aware ring order.
#include "topo/cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace chorus::topo {

namespace {

constexpr const char* kIntraForm = "intra <alpha_us> <GB/s>";
constexpr const char* kRailForm = "rail <name> <alpha_us> <Gbit/s>";
constexpr const char* kHostForm = "host <name> <ranks>";
constexpr const char* kHostsForm = "hosts <count> <ranks>";

// A positive, finite decimal, optionally followed by `unit` ("us", "GB/s", "Gbit/s").
bool parse_figure(const std::string& word, std::string_view unit, double* value) {
  std::string_view digits = word;
  if (digits.size() > unit.size() && digits.substr(digits.size() - unit.size()) == unit)
    digits.remove_suffix(unit.size());
  std::string number(digits);
  if (number.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(number.c_str(), &end);
  if (errno != 0 || end != number.c_str() + number.size() || !std::isfinite(v) || v <= 0)
    return false;
  *value = v;
  return true;
}

// A positive decimal integer; values past kMaxClusterRanks come back as kMaxClusterRanks + 1
// (the caller reports "too many ranks", not a syntax error).
bool parse_count(const std::string& word, int64_t* value) {
  if (word.empty() ||
      !std::all_of(word.begin(), word.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  int64_t v =
      word.size() > 9 ? int64_t{kMaxClusterRanks} + 1 : std::strtoll(word.c_str(), nullptr, 10);
  if (v <= 0) return false;
  *value = std::min<int64_t>(v, int64_t{kMaxClusterRanks} + 1);
  return true;
}

// Reads one line's statement after its keyword; errors carry "origin:line: ".
class LineReader {
 public:
  LineReader(std::istringstream& words, std::string where, const char* form)
      : words_(words), where_(std::move(where)), form_(form) {}

  Status word(std::string* out, const char* what) {
    if (words_ >> *out) return Status();
    return invalid_argument("{}: expected '{}': {} is missing", where_, form_, what);
  }
  Status figure(double* out, const char* what, std::string_view unit) {
    std::string w;
    CHORUS_RETURN_IF_ERROR(word(&w, what));
    if (parse_figure(w, unit, out)) return Status();
    return invalid_argument("{}: expected '{}': {} must be a positive number (in {}), not '{}'",
                            where_, form_, what, unit, w);
  }
  Status count(int64_t* out, const char* what) {
    std::string w;
    CHORUS_RETURN_IF_ERROR(word(&w, what));
    if (parse_count(w, out)) return Status();
    return invalid_argument("{}: expected '{}': {} must be a positive integer, not '{}'", where_,
                            form_, what, w);
  }
  Status end() {
    std::string extra;
    if (!(words_ >> extra)) return Status();
    return invalid_argument("{}: unexpected '{}' after '{}'", where_, extra, form_);
  }

 private:
  std::istringstream& words_;
  std::string where_;
  const char* form_;
};

// What the parser has seen so far, with the line of each name for duplicate errors.
struct Parsed {
  IntraLink intra;
  int intra_line = 0;
  std::vector<Rail> rails;
  std::unordered_map<std::string, int> rail_line;
  std::vector<ClusterHost> hosts;
  std::unordered_map<std::string, int> host_line;
  int64_t nranks = 0;
};

Status add_host(Parsed& p, const std::string& where, int line, std::string name, int64_t ranks) {
  if (auto it = p.host_line.find(name); it != p.host_line.end())
    return invalid_argument("{}: host '{}' is already defined on line {}", where, name, it->second);
  if (p.nranks + ranks > kMaxClusterRanks)
    return invalid_argument("{}: more than {} ranks", where, kMaxClusterRanks);
  p.nranks += ranks;
  p.host_line.emplace(name, line);
  p.hosts.push_back({std::move(name), static_cast<int>(ranks)});
  return Status();
}

Status parse_line(Parsed& p, const std::string& origin, int line, std::istringstream& words,
                  const std::string& key) {
  const std::string where = fmt::format("{}:{}", origin, line);
  if (key == "intra") {
    LineReader r(words, where, kIntraForm);
    if (p.intra_line != 0)
      return invalid_argument("{}: a second 'intra' line (the first is line {})", where,
                              p.intra_line);
    CHORUS_RETURN_IF_ERROR(r.figure(&p.intra.alpha_us, "<alpha_us>", "us"));
    CHORUS_RETURN_IF_ERROR(r.figure(&p.intra.gbytes_per_s, "<GB/s>", "GB/s"));
    CHORUS_RETURN_IF_ERROR(r.end());
    p.intra_line = line;
    return Status();
  }
  if (key == "rail") {
    LineReader r(words, where, kRailForm);
    Rail rail;
    CHORUS_RETURN_IF_ERROR(r.word(&rail.name, "<name>"));
    CHORUS_RETURN_IF_ERROR(r.figure(&rail.alpha_us, "<alpha_us>", "us"));
    CHORUS_RETURN_IF_ERROR(r.figure(&rail.gbits_per_s, "<Gbit/s>", "Gbit/s"));
    CHORUS_RETURN_IF_ERROR(r.end());
    if (auto it = p.rail_line.find(rail.name); it != p.rail_line.end())
      return invalid_argument("{}: rail '{}' is already defined on line {}", where, rail.name,
                              it->second);
    p.rail_line.emplace(rail.name, line);
    p.rails.push_back(std::move(rail));
    return Status();
  }
  if (key == "host") {
    LineReader r(words, where, kHostForm);
    std::string name;
    int64_t ranks = 0;
    CHORUS_RETURN_IF_ERROR(r.word(&name, "<name>"));
    CHORUS_RETURN_IF_ERROR(r.count(&ranks, "<ranks>"));
    CHORUS_RETURN_IF_ERROR(r.end());
    return add_host(p, where, line, std::move(name), ranks);
  }
  if (key == "hosts") {
    LineReader r(words, where, kHostsForm);
    int64_t count = 0, ranks = 0;
    CHORUS_RETURN_IF_ERROR(r.count(&count, "<count>"));
    CHORUS_RETURN_IF_ERROR(r.count(&ranks, "<ranks>"));
    CHORUS_RETURN_IF_ERROR(r.end());
    if (p.nranks + count * ranks > kMaxClusterRanks)
      return invalid_argument("{}: more than {} ranks", where, kMaxClusterRanks);
    for (int64_t h = 0; h < count; ++h)
      CHORUS_RETURN_IF_ERROR(add_host(p, where, line, fmt::format("h{}", h), ranks));
    return Status();
  }
  return invalid_argument("{}: unknown keyword '{}' (expected intra, rail, host or hosts)", where,
                          key);
}

}  // namespace

Result<Cluster> Cluster::make(IntraLink intra, std::vector<Rail> rails,
                              std::vector<ClusterHost> hosts) {
  if (!(intra.alpha_us > 0) || !(intra.gbytes_per_s > 0) || !std::isfinite(intra.alpha_us) ||
      !std::isfinite(intra.gbytes_per_s))
    return invalid_argument("cluster: the intra-host link needs a positive latency and bandwidth");
  if (rails.empty()) return invalid_argument("cluster: no rail");
  if (hosts.empty()) return invalid_argument("cluster: no host");
  for (size_t i = 0; i < rails.size(); ++i) {
    const Rail& rail = rails[i];
    if (rail.name.empty()) return invalid_argument("cluster: rail {} has no name", i);
    if (!(rail.alpha_us > 0) || !(rail.gbits_per_s > 0) || !std::isfinite(rail.alpha_us) ||
        !std::isfinite(rail.gbits_per_s))
      return invalid_argument("cluster: rail '{}' needs a positive latency and rate", rail.name);
    for (size_t j = 0; j < i; ++j)
      if (rails[j].name == rail.name)
        return invalid_argument("cluster: two rails named '{}'", rail.name);
  }
  Cluster c;
  c.first_rank_.reserve(hosts.size() + 1);
  c.first_rank_.push_back(0);
  std::unordered_map<std::string, size_t> seen;
  int64_t total = 0;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const ClusterHost& host = hosts[h];
    if (host.name.empty()) return invalid_argument("cluster: host {} has no name", h);
    if (host.ranks <= 0) return invalid_argument("cluster: host '{}' has no rank", host.name);
    if (!seen.emplace(host.name, h).second)
      return invalid_argument("cluster: two hosts named '{}'", host.name);
    total += host.ranks;
    if (total > kMaxClusterRanks)
      return invalid_argument("cluster: more than {} ranks", kMaxClusterRanks);
    c.first_rank_.push_back(static_cast<int>(total));
  }
  c.intra_ = intra;
  c.rails_ = std::move(rails);
  c.hosts_ = std::move(hosts);
  return c;
}

int Cluster::host_of(int rank) const {
  auto after = std::upper_bound(first_rank_.begin(), first_rank_.end(), rank);
  return static_cast<int>(after - first_rank_.begin()) - 1;
}

int Cluster::ranks_per_host() const {
  for (const ClusterHost& h : hosts_)
    if (h.ranks != hosts_.front().ranks) return 0;
  return hosts_.front().ranks;
}

std::vector<uint64_t> Cluster::host_of_rank() const {
  std::vector<uint64_t> out;
  out.reserve(nranks());
  for (size_t h = 0; h < hosts_.size(); ++h) out.insert(out.end(), hosts_[h].ranks, h);
  return out;
}

Result<Cluster> parse_cluster(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  Parsed p;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string key;
    if (!(words >> key)) continue;
    CHORUS_RETURN_IF_ERROR(parse_line(p, origin, number, words, key));
  }
  if (p.intra_line == 0) return invalid_argument("{}: no '{}' line", origin, kIntraForm);
  if (p.rails.empty())
    return invalid_argument("{}: no '{}' line: a cluster needs a rail", origin, kRailForm);
  if (p.hosts.empty())
    return invalid_argument("{}: no '{}' or '{}' line: a cluster needs a host", origin, kHostForm,
                            kHostsForm);
  return Cluster::make(p.intra, std::move(p.rails), std::move(p.hosts));
}

Result<std::string> read_cluster_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read topology file {}: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return invalid_argument("cannot read topology file {}: {}", path, std::strerror(errno));
  return text.str();
}

Result<Cluster> read_cluster_file(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::string text, read_cluster_text(path));
  return parse_cluster(text, path);
}

std::string placement_mismatch(const Cluster& cluster, const std::vector<std::vector<int>>& hosts) {
  auto describe_file = [&] {
    std::string sizes;
    for (const ClusterHost& h : cluster.hosts()) sizes += fmt::format("{}{}", sizes.empty() ? "" : "+", h.ranks);
    return fmt::format("{} ranks on {} host(s) of {} ranks, in block order", cluster.nranks(),
                       cluster.hosts().size(), sizes);
  };
  size_t nranks = 0;
  for (const auto& h : hosts) nranks += h.size();
  if (nranks != static_cast<size_t>(cluster.nranks()))
    return fmt::format("it describes {}, the communicator has {} ranks", describe_file(), nranks);
  if (hosts.size() != cluster.hosts().size())
    return fmt::format("it describes {}, the communicator's ranks are on {} host(s)",
                       describe_file(), hosts.size());
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int first = cluster.first_rank(static_cast<int>(h));
    const std::vector<int>& ranks = hosts[h];
    bool same = ranks.size() == static_cast<size_t>(cluster.hosts()[h].ranks);
    for (size_t i = 0; same && i < ranks.size(); ++i) same = ranks[i] == first + static_cast<int>(i);
    if (!same) {
      std::string list;
      for (int r : ranks) list += fmt::format("{}{}", list.empty() ? "" : " ", r);
      return fmt::format("it describes {}, but the communicator's host {} holds ranks {}",
                         describe_file(), h, list);
    }
  }
  return "";
}

std::vector<int> host_ring_order(const std::vector<uint64_t>& host_of_rank) {
  // One group per host, in the order of each host's lowest rank; ranks appended in rank order.
  std::unordered_map<uint64_t, size_t> group_of;
  std::vector<std::vector<int>> groups;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    auto [it, fresh] = group_of.emplace(host_of_rank[r], groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(static_cast<int>(r));
  }
  std::vector<int> ring;
  ring.reserve(host_of_rank.size());
  for (const auto& g : groups) ring.insert(ring.end(), g.begin(), g.end());
  return ring;
}

int inter_host_hops(const std::vector<int>& ring, const std::vector<uint64_t>& host_of_rank) {
  int hops = 0;
  for (size_t i = 0; i < ring.size(); ++i) {
    int next = ring[(i + 1) % ring.size()];
    hops += host_of_rank[ring[i]] != host_of_rank[next] ? 1 : 0;
  }
  return hops;
}

}  // namespace chorus::topo
