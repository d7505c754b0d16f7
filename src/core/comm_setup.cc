// SPDX-License-Identifier: Apache-2.0
// File: src/core/comm_setup.cc
// Creating a communicator's connections: open every registered transport, publish what this
// rank offers (PeerInfo), learn the others', pick the cheapest transport per peer, connect.
// Nothing here names a transport: they come from the registry (transports/registry.h).
#include <fmt/format.h>
#include <strings.h>

#include <algorithm>

#include "algo/tuner.h"
#include "common/bytes.h"
#include "common/log.h"
#include "common/params.h"
#include "common/process.h"
#include "core/comm.h"
#include "topo/cluster.h"

namespace chorus {

namespace {

// The transports' measured figures from CHORUS_TUNER_FILE (none when unset or unreadable: the
// calibration reports a bad file).
std::vector<algo::TunerFile::Link> measured_links() {
  const std::string& path = params::kTunerFile.get();
  if (path.empty()) return {};
  auto file = algo::read_tuner_file(path);
  return file.ok() ? file->links : std::vector<algo::TunerFile::Link>{};
}
constexpr uint32_t kPeerInfoMagic = 0x43504932;  // "CPI2"
constexpr size_t kMaxHostname = 256;
constexpr size_t kMaxTransportName = 32;
// The message size at which transports' costs are compared.
constexpr size_t kCostReferenceBytes = 1 << 20;

// Transport names are short lower-case identifiers ([a-z0-9_]+): anything else in a record is
// corruption (a NUL inside one would also make two different names compare equal as C strings).
bool valid_transport_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

bool forced_auto(const std::string& forced) { return strcasecmp(forced.c_str(), "AUTO") == 0; }

std::string registered_names() {
  std::string names;
  for (const TransportDesc* d : transports()) names += (names.empty() ? "" : ", ") + std::string(d->name);
  return names;
}

// Whether `d` can carry traffic between a and b (both opened it, and it reaches that far).
bool usable(const TransportDesc& d, const EndpointInfo& a, const EndpointInfo& b) {
  if (!a.open || !b.open) return false;
  switch (d.caps.reach) {
    case TransportCaps::Reach::kSameProcess:
      if (!a.same_process(b)) return false;
      break;
    case TransportCaps::Reach::kSameHost:
      if (!a.same_host(b)) return false;
      break;
    case TransportCaps::Reach::kAnyHost: break;
  }
  return d.reaches == nullptr || d.reaches(a, b);
}

}  // namespace

std::string PeerInfo::serialize() const {
  ByteWriter w;
  w.put(kPeerInfoMagic);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  w.put(host_hash);
  w.put_string(hostname);
  w.put<int32_t>(pid);
  w.put(process_token);
  w.put<int32_t>(channels);
  w.put_bytes(&rendezvous.storage, rendezvous.len);
  w.put<uint32_t>(static_cast<uint32_t>(blobs.size()));
  for (const Blob& b : blobs) {
    w.put_string(b.transport);
    w.put_string(b.bytes);
  }
  return w.take();
}

Result<PeerInfo> PeerInfo::parse(std::string_view bytes) {
  ByteReader r(bytes);
  PeerInfo p;
  uint32_t magic = 0, count = 0;
  std::string addr;
  CHORUS_RETURN_IF_ERROR(r.get(&magic));
  if (magic != kPeerInfoMagic) return remote_error("peer info record has a bad magic {:#x}", magic);
  CHORUS_RETURN_IF_ERROR(r.get(&p.rank));
  CHORUS_RETURN_IF_ERROR(r.get(&p.nranks));
  CHORUS_RETURN_IF_ERROR(r.get(&p.host_hash));
  CHORUS_RETURN_IF_ERROR(r.get_string(&p.hostname, kMaxHostname));
  CHORUS_RETURN_IF_ERROR(r.get(&p.pid));
  CHORUS_RETURN_IF_ERROR(r.get(&p.process_token));
  CHORUS_RETURN_IF_ERROR(r.get(&p.channels));
  CHORUS_RETURN_IF_ERROR(r.get_string(&addr, sizeof(p.rendezvous.storage)));
  std::memcpy(&p.rendezvous.storage, addr.data(), addr.size());
  p.rendezvous.len = static_cast<socklen_t>(addr.size());
  CHORUS_RETURN_IF_ERROR(r.get(&count));
  if (count > kMaxTransports)
    return remote_error("peer info record lists {} transports (at most {})", count, kMaxTransports);
  for (uint32_t i = 0; i < count; ++i) {
    Blob b;
    CHORUS_RETURN_IF_ERROR(r.get_string(&b.transport, kMaxTransportName));
    CHORUS_RETURN_IF_ERROR(r.get_string(&b.bytes, kMaxTransportBlob));
    if (!valid_transport_name(b.transport))
      return remote_error("peer info record names a transport '{}' that is not a transport name",
                          b.transport);
    for (const Blob& other : p.blobs)
      if (other.transport == b.transport)
        return remote_error("peer info record lists transport '{}' twice", b.transport);
    p.blobs.push_back(std::move(b));
  }
  if (r.remaining() != 0)
    return remote_error("peer info record has {} trailing bytes", r.remaining());
  return p;
}

std::string PeerInfo::describe() const {
  return fmt::format("rank {} (host {}, pid {})", rank, hostname, pid);
}

EndpointInfo PeerInfo::endpoint(const char* transport) const {
  EndpointInfo e;
  e.rank = rank;
  e.host_hash = host_hash;
  e.hostname = hostname;
  e.pid = pid;
  e.process_token = process_token;
  for (const Blob& b : blobs) {
    if (b.transport != transport) continue;
    e.open = true;
    e.blob = b.bytes;
  }
  return e;
}

void Comm::open_transports(PeerInfo* me) {
  TransportContext ctx;
  ctx.rank = rank();
  ctx.nranks = nranks();
  ctx.comm_uid = uid();
  ctx.secret = secret();
  ctx.channels = channels_;
  ctx.comm_label = describe();
  const std::string& forced = params::kTransport.get();
  const std::vector<algo::TunerFile::Link> measured = measured_links();
  for (const TransportDesc* desc : transports()) {
    // An opt-in transport costs something in every process: opened where it can be chosen,
    // forced or measured (a tuner file line, as `chorus-info --tune` writes).
    if (desc->caps.opt_in && strcasecmp(forced.c_str(), desc->name) != 0 &&
        !std::any_of(measured.begin(), measured.end(), [&](const algo::TunerFile::Link& l) {
          return strcasecmp(l.transport.c_str(), desc->name) == 0;
        })) {
      continue;
    }
    auto opened = desc->open(ctx);
    if (!opened.ok()) {
      CHORUS_WARN(kInit, "{}: transport {} is not available: {}", describe(), desc->name,
                  opened.status().message());
      continue;
    }
    if (!*opened) continue;  // not usable here; peers choose another transport to us
    std::string blob = (*opened)->blob();
    if (blob.empty() || blob.size() > kMaxTransportBlob) {
      CHORUS_WARN(kInit, "{}: transport {} published a {}-byte blob; left out", describe(),
                  desc->name, blob.size());
      continue;
    }
    me->blobs.push_back(PeerInfo::Blob{desc->name, std::move(blob)});
    OpenTransport& t = open_.emplace_back(OpenTransport{desc, std::move(opened).value()});
    if (KeyFactory make = t.instance->key_factory()) {
      t.key_slot = registrations_.add_key_factory(desc->name, std::move(make));
      key_slots_ = t.key_slot + 1;
    }
  }
}

Status Comm::setup(const ExchangeFn& exchange) {
  ProcessContext& process = ProcessContext::get();
  channels_ = static_cast<int>(params::kNumChannels.get());
  PeerInfo me;
  me.rank = rank();
  me.nranks = nranks();
  me.host_hash = process.host_hash();
  me.hostname = process.hostname();
  me.pid = process.pid();
  me.process_token = process.token();
  me.channels = channels_;
  if (nranks() > 1) {
    CHORUS_ASSIGN_OR_RETURN(net::Interface iface, net::pick_interface());
    CHORUS_ASSIGN_OR_RETURN(rendezvous_, net::listen_socket(iface.addr, &me.rendezvous));
    open_transports(&me);
  }
  CHORUS_ASSIGN_OR_RETURN(std::vector<std::string> blobs, exchange(me.serialize()));
  if (blobs.size() != static_cast<size_t>(nranks())) {
    return internal_error("exchange returned {} records for {} ranks", blobs.size(), nranks());
  }
  std::vector<PeerInfo> infos;
  for (int r = 0; r < nranks(); ++r) {
    CHORUS_ASSIGN_OR_RETURN(PeerInfo info, PeerInfo::parse(blobs[r]));
    if (info.rank != r || info.nranks != nranks()) {
      return invalid_usage("rank {} joined as rank {} of {} but this rank expects {} ranks", r,
                           info.rank, info.nranks, nranks());
    }
    if (info.channels != channels_) {
      return invalid_usage("{} uses CHORUS_NCHANNELS={} but rank {} uses {}; set it alike on "
                           "every rank", info.describe(), info.channels, rank(), channels_);
    }
    infos.push_back(std::move(info));
  }
  peers_ = infos;
  set_host_layout();
  int on_host = 0;
  for (const PeerInfo& info : infos) on_host += info.host_hash == me.host_hash ? 1 : 0;
  process.note_local_ranks(on_host);
  // The "device": our index among the ranks of our host, unless ncclCommInitAll gave one.
  if (cu_device_ < 0) {
    cu_device_ = 0;
    for (int r = 0; r < rank(); ++r) cu_device_ += infos[r].host_hash == me.host_hash ? 1 : 0;
  }
  CHORUS_RETURN_IF_ERROR(connect_transports(infos));
  CHORUS_ASSIGN_OR_RETURN(model_, algo::calibrate(*this));
  set_state(State::kReady);
  if (log::enabled(log::Level::kInfo, log::kInit)) {
    std::string used;
    for (const OpenTransport& t : open_) {
      int n = 0;
      for (const TransportDesc* d : transport_) n += d == t.desc ? 1 : 0;
      used += fmt::format("{}{} {}", used.empty() ? "" : ", ", t.desc->name, n);
    }
    std::string ring, hosts;
    for (int r : ring_) ring += fmt::format("{}{}", ring.empty() ? "" : " ", r);
    for (const auto& host : hosts_) {
      hosts += fmt::format("{}{} ({}", hosts.empty() ? "" : ", ", peers_[host.front()].hostname,
                           host.front());
      for (size_t i = 1; i < host.size(); ++i) hosts += fmt::format(" {}", host[i]);
      hosts += ")";
    }
    CHORUS_INFO(kInit, "{} ready on {}: peers over {}; {} channel(s); cost model {}; {} host(s): "
                "{}; ring {}", describe(), me.hostname, used, channels_, model_.to_string(),
                hosts_.size(), hosts, ring);
  }
  return Status();
}

Status Comm::connect_transports(const std::vector<PeerInfo>& infos) {
  Deadline deadline = Deadline::after_ms(params::kConnectTimeoutMs.get(), &abort_);
  const std::string& forced = params::kTransport.get();
  const TransportDesc* only = nullptr;
  if (!forced_auto(forced)) {
    only = find_transport(forced);
    if (only == nullptr) {
      return invalid_usage("CHORUS_TRANSPORT={} names no transport of this build (AUTO, {})",
                           forced, registered_names());
    }
  }
  // Link costs: the transports' declared figures, or measured ones from a tuner file.
  const std::vector<algo::TunerFile::Link> measured = measured_links();
  auto cost_of = [&](const TransportDesc* d) {
    for (const auto& link : measured)
      if (strcasecmp(link.transport.c_str(), d->name) == 0)
        return LinkCost{link.alpha_us, link.beta_gbps}.time_us(kCostReferenceBytes);
    return d->cost.time_us(kCostReferenceBytes);
  };
  // The cheapest usable transport for each pair, judged on (lower rank, higher rank) so that
  // both ends agree.
  auto choose = [&](int a, int b) -> const TransportDesc* {
    const PeerInfo& lo = infos[std::min(a, b)];
    const PeerInfo& hi = infos[std::max(a, b)];
    const TransportDesc* best = nullptr;
    double best_cost = 0;
    for (const TransportDesc* d : transports()) {
      if (only != nullptr && d != only) continue;
      if (!usable(*d, lo.endpoint(d->name), hi.endpoint(d->name))) continue;
      double c = cost_of(d);
      if (best == nullptr || c < best_cost) {
        best = d;
        best_cost = c;
      }
    }
    return best;
  };
  transport_.assign(nranks(), nullptr);
  conns_.clear();
  conns_.resize(nranks());
  std::vector<bool> used(transports().size(), false);  // by any pair of the communicator
  for (int a = 0; a < nranks(); ++a) {
    for (int b = a + 1; b < nranks(); ++b) {
      const TransportDesc* d = choose(a, b);
      if (d == nullptr) {
        if (a != rank() && b != rank()) continue;  // their problem; they report it
        const PeerInfo& other = infos[a == rank() ? b : a];
        std::string offered;
        for (const auto& blob : other.blobs) offered += " " + blob.transport;
        return invalid_usage("no transport reaches {} from rank {} (CHORUS_TRANSPORT={}; it "
                             "opened:{}; this rank opened:{})", other.describe(), rank(), forced,
                             offered.empty() ? " none" : offered, [&] {
                               std::string mine;
                               for (const auto& t : open_) mine += " " + std::string(t.desc->name);
                               return mine.empty() ? std::string(" none") : mine;
                             }());
      }
      for (size_t i = 0; i < transports().size(); ++i) used[i] = used[i] || transports()[i] == d;
      if (a == rank()) transport_[b] = d;
      if (b == rank()) transport_[a] = d;
    }
  }
  for (OpenTransport& t : open_) {
    size_t index = std::find(transports().begin(), transports().end(), t.desc) - transports().begin();
    if (!used[index]) continue;
    std::vector<EndpointInfo> all;
    for (const PeerInfo& info : infos) all.push_back(info.endpoint(t.desc->name));
    std::vector<int> peers;
    for (int r = 0; r < nranks(); ++r)
      if (transport_[r] == t.desc) peers.push_back(r);
    CHORUS_ASSIGN_OR_RETURN(ConnectionTable conns, t.instance->connect(all, peers, deadline));
    if (conns.size() != peers.size()) {
      return internal_error("transport {} returned {} connection sets for {} peers", t.desc->name,
                            conns.size(), peers.size());
    }
    for (size_t i = 0; i < peers.size(); ++i) conns_[peers[i]] = std::move(conns[i]);
  }
  key_slot_.assign(nranks(), -1);
  for (const OpenTransport& t : open_) {
    for (int r = 0; r < nranks(); ++r)
      if (transport_[r] == t.desc) key_slot_[r] = t.key_slot;
  }
  // Chunks are whole pages: every element size divides them, in any transport's framing.
  const size_t chunk_bytes = static_cast<size_t>(params::kPathChunkBytes.get()) / 4096 * 4096;
  links_.clear();
  links_.resize(nranks());
  for (int r = 0; r < nranks(); ++r) {
    if (r != rank() && conns_[r].size() != static_cast<size_t>(channels_))
      return internal_error("no connection to {}", infos[r].describe());
    if (r != rank()) {
      std::vector<Connection*> paths;
      for (auto& c : conns_[r]) paths.push_back(c.get());
      links_[r] = std::make_unique<PeerLink>(rank(), r, std::move(paths), chunk_bytes,
                                             params::kRoute.get() != "STATIC");
    }
    // A same-host process can die silently (its shared memory stays mapped): watch it.
    if (r != rank() && infos[r].host_hash == infos[rank()].host_hash && infos[r].pid != infos[rank()].pid)
      peer_watch_.add(r, infos[r].pid, infos[r].describe());
  }
  boxes_ = nranks() > 1 && hosts_.size() == 1;
  for (int r = 0; r < nranks() && boxes_; ++r)
    boxes_ = r == rank() || conns_[r][0]->small_box() != nullptr;
  return Status();
}

}  // namespace chorus

namespace chorus {

void Comm::set_host_layout() {
  const int n = nranks();
  hosts_.clear();
  host_of_.assign(n, -1);
  local_index_.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    if (host_of_[r] >= 0) continue;
    const int h = static_cast<int>(hosts_.size());
    hosts_.emplace_back();
    for (int q = r; q < n; ++q) {
      if (host_of_[q] < 0 && peers_[q].host_hash == peers_[r].host_hash) {
        host_of_[q] = h;
        local_index_[q] = static_cast<int>(hosts_[h].size());
        hosts_[h].push_back(q);
      }
    }
  }
  ranks_per_host_ = static_cast<int>(hosts_.front().size());
  for (const auto& host : hosts_)
    if (static_cast<int>(host.size()) != ranks_per_host_) ranks_per_host_ = 0;
  // The ring: hosts in order, each host's ranks together, so that it crosses between hosts once
  // per host, not once per rank (CHORUS_RING=HOST); or rank order (RANK).
  ring_.clear();
  if (params::kRing.get() == "RANK") {
    for (int r = 0; r < n; ++r) ring_.push_back(r);
  } else {
    std::vector<uint64_t> host_hashes;
    for (const PeerInfo& p : peers_) host_hashes.push_back(p.host_hash);
    ring_ = topo::host_ring_order(host_hashes);  // hosts_ concatenated
  }
  ring_pos_.assign(n, 0);
  for (int p = 0; p < n; ++p) ring_pos_[ring_[p]] = p;
}

}  // namespace chorus
