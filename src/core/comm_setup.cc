// SPDX-License-Identifier: Apache-2.0
// File: src/core/comm_setup.cc
// Creating a communicator's connections: publish what this rank offers (PeerInfo), learn the
// others', pick a transport per peer, connect.
#include <fmt/format.h>

#include <algorithm>

#include "common/bytes.h"
#include "common/log.h"
#include "common/params.h"
#include "core/comm.h"
#include "core/process.h"
#include "transports/direct/direct_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_transport.h"

namespace chorus {

namespace {
constexpr uint32_t kPeerInfoMagic = 0x43504931;  // "CPI1"
constexpr size_t kMaxHostname = 256;
}  // namespace

const char* transport_kind_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kDirect: return "direct";
    case TransportKind::kShm: return "shm";
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kNone: break;
  }
  return "none";
}

std::string PeerInfo::serialize() const {
  ByteWriter w;
  w.put(kPeerInfoMagic);
  w.put<int32_t>(rank);
  w.put<int32_t>(nranks);
  w.put(host_hash);
  w.put_string(hostname);
  w.put<int32_t>(pid);
  w.put(process_token);
  w.put<int32_t>(doorbell_fd);
  w.put<int32_t>(shm_fd);
  w.put<uint32_t>(tcp_addr.len);
  w.put_bytes(&tcp_addr.storage, tcp_addr.len);
  w.put<int32_t>(channels);
  return w.take();
}

Result<PeerInfo> PeerInfo::parse(std::string_view bytes) {
  ByteReader r(bytes);
  PeerInfo p;
  uint32_t magic = 0, addr_len = 0;
  std::string addr;
  CHORUS_RETURN_IF_ERROR(r.get(&magic));
  if (magic != kPeerInfoMagic) return remote_error("peer info record has a bad magic {:#x}", magic);
  CHORUS_RETURN_IF_ERROR(r.get(&p.rank));
  CHORUS_RETURN_IF_ERROR(r.get(&p.nranks));
  CHORUS_RETURN_IF_ERROR(r.get(&p.host_hash));
  CHORUS_RETURN_IF_ERROR(r.get_string(&p.hostname, kMaxHostname));
  CHORUS_RETURN_IF_ERROR(r.get(&p.pid));
  CHORUS_RETURN_IF_ERROR(r.get(&p.process_token));
  CHORUS_RETURN_IF_ERROR(r.get(&p.doorbell_fd));
  CHORUS_RETURN_IF_ERROR(r.get(&p.shm_fd));
  CHORUS_RETURN_IF_ERROR(r.get(&addr_len));
  CHORUS_RETURN_IF_ERROR(r.get_string(&addr, sizeof(p.tcp_addr.storage)));
  CHORUS_RETURN_IF_ERROR(r.get(&p.channels));
  if (addr.size() != addr_len) return remote_error("peer info record has a bad address");
  std::memcpy(&p.tcp_addr.storage, addr.data(), addr.size());
  p.tcp_addr.len = addr_len;
  return p;
}

std::string PeerInfo::describe() const {
  return fmt::format("rank {} (host {}, pid {})", rank, hostname, pid);
}

TransportKind Comm::choose_transport(const PeerInfo& me, const PeerInfo& other) const {
  bool same_host = me.host_hash == other.host_hash;
  bool same_process = same_host && me.pid == other.pid && me.process_token == other.process_token;
  bool shm_ok = same_host && me.shm_fd >= 0 && other.shm_fd >= 0 && me.doorbell_fd >= 0 &&
                other.doorbell_fd >= 0;
  const std::string& forced = params::kTransport.get();
  if (forced == "TCP") return TransportKind::kTcp;
  if (forced == "SHM") return shm_ok ? TransportKind::kShm : TransportKind::kNone;
  if (forced == "DIRECT") return same_process ? TransportKind::kDirect : TransportKind::kNone;
  if (same_process) return TransportKind::kDirect;
  if (shm_ok) return TransportKind::kShm;
  return TransportKind::kTcp;
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
  me.doorbell_fd = process.doorbell_fd();
  me.channels = channels_;
  if (nranks() > 1) {
    direct_node_ = direct::register_node(uid(), rank());
    auto segment = shm::ShmSegment::create();
    if (segment.ok()) {
      shm_segment_ = std::move(segment).value();
      me.shm_fd = shm_segment_->fd();
    } else {
      CHORUS_WARN(kShm, "no shared memory for {}: {}", describe(), segment.status().message());
    }
    CHORUS_ASSIGN_OR_RETURN(net::Interface iface, net::pick_interface());
    CHORUS_ASSIGN_OR_RETURN(tcp_listener_, tcp::TcpListener::create(iface.addr));
    me.tcp_addr = tcp_listener_->address();
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
    int counts[4] = {};
    for (TransportKind k : transport_) ++counts[static_cast<int>(k)];
    CHORUS_INFO(kInit, "{} ready on {}: peers over direct {}, shm {}, tcp {}; {} channel(s); "
                "cost model {}", describe(), me.hostname, counts[1], counts[2], counts[3],
                channels_, model_.to_string());
  }
  return Status();
}

Status Comm::connect_transports(const std::vector<PeerInfo>& infos) {
  const PeerInfo& me = infos[rank()];
  Deadline deadline = Deadline::after_ms(params::kConnectTimeoutMs.get(), &abort_);
  transport_.assign(nranks(), TransportKind::kNone);
  conns_.clear();
  conns_.resize(nranks());
  std::vector<int> direct_peers;
  std::vector<int> local_ranks;  // every rank of our host, for the shared-memory layout
  std::vector<tcp::TcpPeer> tcp_peers;
  for (int r = 0; r < nranks(); ++r) {
    if (infos[r].host_hash == me.host_hash && infos[r].shm_fd >= 0) local_ranks.push_back(r);
    if (r == rank()) continue;
    TransportKind kind = choose_transport(me, infos[r]);
    if (kind == TransportKind::kNone) {
      return invalid_usage("CHORUS_TRANSPORT={} cannot reach {} from rank {}",
                           params::kTransport.get(), infos[r].describe(), rank());
    }
    transport_[r] = kind;
    if (kind == TransportKind::kDirect) direct_peers.push_back(r);
    if (kind == TransportKind::kTcp) {
      tcp_peers.push_back(tcp::TcpPeer{
          r, infos[r].tcp_addr, fmt::format("host {}, pid {}", infos[r].hostname, infos[r].pid)});
    }
  }
  auto place = [&](const std::vector<int>& ranks,
                   std::vector<std::vector<std::unique_ptr<Connection>>> conns) {
    for (size_t i = 0; i < ranks.size(); ++i)
      if (conns_[ranks[i]].empty()) conns_[ranks[i]] = std::move(conns[i]);
  };
  if (!direct_peers.empty()) {
    direct::DirectSetup setup{rank(), uid(), channels_, direct_node_, direct_peers, deadline};
    CHORUS_ASSIGN_OR_RETURN(auto conns, direct::connect_all(setup));
    place(direct_peers, std::move(conns));
  }
  bool any_shm = std::any_of(transport_.begin(), transport_.end(),
                             [](TransportKind k) { return k == TransportKind::kShm; });
  if (any_shm) {
    shm::ShmSetup setup;
    setup.rank = rank();
    setup.channels = channels_;
    setup.fifo_bytes = static_cast<size_t>(params::kShmFifoBytes.get()) / 64 * 64;
    setup.segment = shm_segment_.get();
    setup.local_ranks = local_ranks;
    setup.deadline = deadline;
    std::vector<int> shm_ranks;
    for (int r : local_ranks) {
      if (r == rank()) continue;
      setup.peers.push_back(shm::ShmPeer{r, infos[r].pid, infos[r].shm_fd, infos[r].doorbell_fd});
      shm_ranks.push_back(r);
    }
    CHORUS_ASSIGN_OR_RETURN(auto conns, shm::connect_all(setup));
    // Ranks of our own process are reached directly; drop their shared-memory connections.
    for (size_t i = 0; i < shm_ranks.size(); ++i)
      if (transport_[shm_ranks[i]] != TransportKind::kShm) conns[i].clear();
    place(shm_ranks, std::move(conns));
  }
  if (!tcp_peers.empty()) {
    tcp::TcpSetup setup;
    setup.rank = rank();
    setup.comm_uid = uid();
    setup.secret = secret();
    setup.channels = channels_;
    setup.bounce_bytes = static_cast<size_t>(params::kTcpBounceBytes.get());
    setup.listener = tcp_listener_.get();
    setup.peers = tcp_peers;
    setup.deadline = deadline;
    CHORUS_ASSIGN_OR_RETURN(auto conns, tcp::connect_all(setup));
    std::vector<int> ranks;
    for (const auto& p : tcp_peers) ranks.push_back(p.rank);
    place(ranks, std::move(conns));
  }
  for (int r = 0; r < nranks(); ++r) {
    if (r != rank() && conns_[r].size() != static_cast<size_t>(channels_))
      return internal_error("no connection to {}", infos[r].describe());
    if (transport_[r] == TransportKind::kShm) peer_watch_.add(r, infos[r].pid, infos[r].describe());
  }
  return Status();
}

}  // namespace chorus
