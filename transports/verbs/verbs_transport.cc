// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_transport.cc
// The verbs transport as a plug-in: the per-communicator instance (device, rings, QPs in INIT,
// the side channel's listener; the blob publishes their numbers and its address), connect()
// (side channels, QPs to RTS, the ready round, then the hellos), registration.
#include "transports/verbs/verbs_transport.h"

#include <poll.h>
#include <sys/mman.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "net/socket.h"
#include "transports/verbs/verbs_connection.h"
#include "transports/verbs/verbs_device.h"
#include "transports/verbs/verbs_qp.h"
#include "transports/verbs/verbs_side.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {

namespace {

constexpr int kMaxChannels = 64;

class VerbsInstance final : public TransportInstance {
 public:
  VerbsInstance(const TransportContext& ctx, const VerbsOptions& options,
                std::shared_ptr<Device> device)
      : ctx_(ctx), options_(options), device_(std::move(device)) {}
  ~VerbsInstance() override { release_unused(); }

  // Rings, their MRs, and a QP in INIT per (peer, channel).
  Status init();

  std::string blob() const override { return blob_; }

  Result<ConnectionTable> connect(const std::vector<EndpointInfo>& all,
                                  const std::vector<int>& peers, Deadline deadline) override;

  // A registered range's MR (MrKey): sends from it are read in place, receives into it take
  // rendezvous messages written by the peer. Read-only memory cannot be registered for
  // writing: it gets an MR for local reads (sends) only.
  KeyFactory key_factory() override {
    return [dev = device_](const RegisteredRange& range)
               -> Result<std::unique_ptr<RegistrationKey>> {
      void* base = const_cast<void*>(range.base);
      IbvPtr<ibv_mr> mr(ibv_reg_mr(dev->pd(), base, range.bytes,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
      const bool writable = mr != nullptr;
      if (!mr) mr.reset(ibv_reg_mr(dev->pd(), base, range.bytes, 0));
      if (!mr) {
        return system_error(errno, fmt::format("verbs: ibv_reg_mr of {} bytes at {} on {}",
                                               range.bytes, range.base, dev->name()));
      }
      return std::unique_ptr<RegistrationKey>(new MrKey(dev, std::move(mr), writable));
    };
  }

  ByteCounts byte_counts() const { return counters_->get(); }

 private:
  size_t index(int rank, int channel) const {
    return static_cast<size_t>(rank) * static_cast<size_t>(ctx_.channels) +
           static_cast<size_t>(channel);
  }
  uint64_t stride() const { return ring_stride(options_.slots, options_.slot_bytes); }
  // QPs no peer chose verbs for: stopped, then destroyed.
  void release_unused();
  Status wait_for_hellos(const std::vector<VerbsConnection*>& conns, Deadline deadline);

  TransportContext ctx_;
  VerbsOptions options_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<Rings> rings_;
  std::vector<QpResources> qps_;  // [rank * channels + channel]: its QPs; none for our own rank
  UniqueFd side_listener_;        // side channels (verbs_side.h) from lower-ranked peers
  // One per connected peer; the connections share them, and they close after the connections
  // (whose goodbyes go first).
  std::vector<std::shared_ptr<SideChannel>> sides_;
  std::string blob_;
  std::shared_ptr<ByteCounters> counters_ = std::make_shared<ByteCounters>();
};

Status VerbsInstance::init() {
  const size_t entries = static_cast<size_t>(ctx_.nranks) * static_cast<size_t>(ctx_.channels);
  rings_ = std::make_shared<Rings>();
  rings_->device = device_;
  rings_->bytes = stride() * entries;
  for (void** p : {&rings_->rx, &rings_->tx}) {
    void* m = ::mmap(nullptr, rings_->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (m == MAP_FAILED) {
      return system_error(errno, fmt::format("verbs: mapping {} bytes of rings", rings_->bytes));
    }
    *p = m;
  }
  rings_->rx_mr.reset(ibv_reg_mr(device_->pd(), rings_->rx, rings_->bytes,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  if (!rings_->rx_mr) {
    return system_error(errno, fmt::format("verbs: registering {} bytes of receive rings on {} "
                                           "(ulimit -l?)",
                                           rings_->bytes, device_->name()));
  }
  rings_->tx_mr.reset(ibv_reg_mr(device_->pd(), rings_->tx, rings_->bytes, IBV_ACCESS_LOCAL_WRITE));
  if (!rings_->tx_mr) {
    return system_error(errno, fmt::format("verbs: registering {} bytes of send rings on {} "
                                           "(ulimit -l?)",
                                           rings_->bytes, device_->name()));
  }
  // Send queue: every slot, a credit, the hello, the farewell, rendezvous replies and
  // zero-copy writes. Receive queue: every slot, as many credits (each stands for at least one
  // consumed slot), the hello, the farewell, rendezvous replies and ends.
  const uint32_t send_depth = options_.slots + 1 + VerbsConnection::kExtraSendWrs;
  const uint32_t recv_depth = 2 * options_.slots + VerbsConnection::kExtraRecvWrs;
  BlobInfo b;
  b.link_layer = static_cast<uint8_t>(device_->port_attr().link_layer);
  b.mtu = static_cast<uint8_t>(device_->port_attr().active_mtu);
  b.lid = device_->port_attr().lid;
  b.port = device_->port();
  b.rank = static_cast<uint32_t>(ctx_.rank);
  b.nranks = static_cast<uint32_t>(ctx_.nranks);
  b.channels = static_cast<uint32_t>(ctx_.channels);
  b.slots = options_.slots;
  b.slot_bytes = options_.slot_bytes;
  b.qps_per_connection = options_.qps_per_connection;
  b.ring_base = reinterpret_cast<uintptr_t>(rings_->rx);
  b.ring_rkey = rings_->rx_mr->rkey;
  std::memcpy(b.gid.data(), device_->gid().raw, 16);
  const uint32_t n = options_.qps_per_connection;
  b.qps.resize(entries * n);
  qps_.resize(entries);
  for (int r = 0; r < ctx_.nranks; ++r) {
    for (int c = 0; r != ctx_.rank && c < ctx_.channels; ++c) {
      CHORUS_ASSIGN_OR_RETURN(QpResources q, create_qps(*device_, n, send_depth, recv_depth));
      for (uint32_t i = 0; i < n; ++i)
        b.qps[index(r, c) * n + i] = QpEntry{q.qps[i]->qp_num, q.psns[i]};
      qps_[index(r, c)] = std::move(q);
    }
  }
  // The side channel listens where the bootstrap does (CHORUS_SOCKET_IFNAME).
  CHORUS_ASSIGN_OR_RETURN(net::Interface iface, net::pick_interface());
  net::SockAddr side_addr;
  CHORUS_ASSIGN_OR_RETURN(side_listener_, net::listen_socket(iface.addr, &side_addr));
  blob_ = append_side_address(encode_blob(b), side_addr);
  if (blob_.size() > kMaxTransportBlob) {
    return invalid_argument("verbs: {} ranks x {} channels make a {}-byte blob (at most {})",
                            ctx_.nranks, ctx_.channels, blob_.size(), kMaxTransportBlob);
  }
  CHORUS_INFO(kNet, "verbs: {} on {}: {} QPs, rings of {} x {} bytes ({} MiB registered)",
              ctx_.comm_label, device_->describe(), (ctx_.nranks - 1) * ctx_.channels * n,
              options_.slots, options_.slot_bytes, 2 * rings_->bytes >> 20);
  return ok_status();
}

void VerbsInstance::release_unused() {
  for (QpResources& q : qps_) {
    for (auto& qp : q.qps) qp_to_error(qp.get());
    q.qps.clear();  // before their CQ; their flushed receives go with the CQ
  }
  qps_.clear();
}

Result<ConnectionTable> VerbsInstance::connect(const std::vector<EndpointInfo>& all,
                                               const std::vector<int>& peers,
                                               Deadline deadline) {
  ConnectionTable out(peers.size());
  if (qps_.empty()) return invalid_usage("verbs: rank {} connected twice", ctx_.rank);
  const int64_t start = now_ns();
  const QpSettings settings = qp_settings_from_params();
  // 1. What each peer published: its QPs and rings, and where its side channel listens.
  std::vector<BlobInfo> blobs(peers.size());
  SideSetup side;
  side.rank = ctx_.rank;
  side.comm_uid = ctx_.comm_uid;
  side.secret = ctx_.secret;
  side.listen_fd = side_listener_.get();
  side.deadline = deadline;
  std::vector<bool> seen(static_cast<size_t>(ctx_.nranks), false);
  for (size_t i = 0; i < peers.size(); ++i) {
    const int r = peers[i];
    if (r < 0 || r >= ctx_.nranks || r == ctx_.rank || r >= static_cast<int>(all.size())) {
      return invalid_argument("verbs: rank {} given peer rank {} (out of range or itself)",
                              ctx_.rank, r);
    }
    if (seen[static_cast<size_t>(r)])
      return invalid_argument("verbs: rank {} given peer rank {} twice", ctx_.rank, r);
    seen[static_cast<size_t>(r)] = true;
    const EndpointInfo& info = all[r];
    if (!info.open || info.blob.empty())
      return remote_error("verbs: {} published no verbs blob", info.describe());
    std::string_view verbs_blob;
    net::SockAddr side_addr;
    CHORUS_RETURN_IF_ERROR(split_side_address(info.blob, &verbs_blob, &side_addr, info.describe()));
    BlobExpect expect{static_cast<uint32_t>(r), static_cast<uint32_t>(ctx_.nranks),
                      static_cast<uint32_t>(ctx_.channels), options_.slots, options_.slot_bytes,
                      static_cast<uint32_t>(ctx_.rank), options_.qps_per_connection};
    CHORUS_ASSIGN_OR_RETURN(blobs[i], parse_blob(verbs_blob, expect, info.describe()));
    const BlobInfo& b = blobs[i];
    if (b.link_layer != device_->port_attr().link_layer) {
      return remote_error("verbs: {} is on {} and rank {} on {}: no RDMA path between them",
                          info.describe(), b.link_layer == 1 ? "InfiniBand" : "Ethernet",
                          ctx_.rank, device_->roce() ? "Ethernet" : "InfiniBand");
    }
    for (int c = 0; c < ctx_.channels; ++c) {
      if (qps_[index(r, c)].qps.empty())
        return invalid_argument("verbs: rank {} connected twice to rank {}", ctx_.rank, r);
    }
    side.peers.push_back(SidePeer{r, side_addr, info.describe()});
  }
  // 2. A side channel to each peer (authenticated: it proves the communicator's secret).
  CHORUS_ASSIGN_OR_RETURN(sides_, connect_side_channels(side));
  // 3. Every QP to RTR (and RTS); then the ready round: nothing is posted before the peer's QP
  // is in RTR too, so no first packet is dropped and no retransmit timeout waited for.
  for (size_t i = 0; i < peers.size(); ++i) {
    for (int c = 0; c < ctx_.channels; ++c) {
      QpResources& q = qps_[index(peers[i], c)];
      for (size_t k = 0; k < q.qps.size(); ++k) {
        const QpEntry& theirs = blobs[i].qps[index(ctx_.rank, c) * q.qps.size() + k];
        CHORUS_RETURN_IF_ERROR(connect_qp(*device_, q.qps[k].get(), q.psns[k], blobs[i],
                                          theirs.qpn, theirs.psn, settings));
      }
    }
  }
  CHORUS_RETURN_IF_ERROR(exchange_ready(ctx_.rank, sides_, deadline));
  // 4. The connections; each sends its hello.
  std::vector<std::vector<std::unique_ptr<VerbsConnection>>> made(peers.size());
  std::vector<std::vector<int>> cq_fds(peers.size());  // what each one sleeps on
  std::vector<VerbsConnection*> conns;
  for (size_t i = 0; i < peers.size(); ++i) {
    const int r = peers[i];
    const BlobInfo& b = blobs[i];
    for (int c = 0; c < ctx_.channels; ++c) {
      const size_t nqp = qps_[index(r, c)].qps.size();
      std::vector<uint32_t> remote_qpns;
      for (size_t k = 0; k < nqp; ++k) remote_qpns.push_back(b.qps[index(ctx_.rank, c) * nqp + k].qpn);
      ConnectionSetup s;
      s.rings = rings_;
      s.qp = std::move(qps_[index(r, c)]);
      s.my_rank = ctx_.rank;
      s.peer = r;
      s.channel = c;
      s.peer_label = all[r].describe();
      s.comm_uid = ctx_.comm_uid;
      s.slots = options_.slots;
      s.slot_bytes = options_.slot_bytes;
      s.rx_ring = static_cast<uint8_t*>(rings_->rx) + index(r, c) * stride();
      s.tx_ring = static_cast<uint8_t*>(rings_->tx) + index(r, c) * stride();
      s.remote_ring = b.ring_base + index(ctx_.rank, c) * stride();
      s.remote_rkey = b.ring_rkey;
      s.remote_qpns = std::move(remote_qpns);
      s.rdv_bytes = options_.rdv_bytes;
      s.max_write = static_cast<uint32_t>(
          std::min<uint64_t>(VerbsConnection::kZeroCopyPieceBytes, device_->port_attr().max_msg_sz));
      s.counters = counters_;
      cq_fds[i].push_back(s.qp.channel->fd);
      auto conn = std::make_unique<VerbsConnection>(std::move(s));
      if (!conn->error().ok()) return conn->error();
      conns.push_back(conn.get());
      made[i].push_back(std::move(conn));
    }
  }
  release_unused();
  if (conns.empty()) return out;
  CHORUS_RETURN_IF_ERROR(wait_for_hellos(conns, deadline));
  for (size_t i = 0; i < peers.size(); ++i) {
    for (size_t c = 0; c < made[i].size(); ++c) {
      out[i].push_back(
          std::make_unique<WatchedConnection>(std::move(made[i][c]), sides_[i], cq_fds[i][c]));
    }
  }
  CHORUS_INFO(kNet, "verbs: {} connected to {} peer(s) x {} channel(s) over {} in {} ms",
              ctx_.comm_label, peers.size(), ctx_.channels, device_->describe(),
              (now_ns() - start) / 1000000);
  return out;
}

// Each connection's hello proves that both QPs are connected to each other (the ready round
// made sure that the peer's QP is in RTR before the hello left).
Status VerbsInstance::wait_for_hellos(const std::vector<VerbsConnection*>& conns,
                                      Deadline deadline) {
  const int64_t start = now_ns();
  std::vector<pollfd> fds;
  for (;;) {
    bool all = true;
    for (VerbsConnection* c : conns) {
      c->progress();
      if (!c->error().ok()) return c->error();
      all = all && c->connected();
    }
    if (all) return ok_status();
    if (deadline.expired()) {
      std::string missing;
      int listed = 0;
      for (VerbsConnection* c : conns) {
        if (c->connected() || ++listed > 8) continue;
        if (!missing.empty()) missing += "; ";
        missing += fmt::format("{} channel {} (QP {:#x})", c->peer_label(), c->channel(), c->qpn());
      }
      if (listed > 8) missing += fmt::format("; and {} more", listed - 8);
      return remote_error("verbs: rank {} could not connect its queue pairs within {} ms "
                          "(CHORUS_CONNECT_TIMEOUT_MS): no hello from {}",
                          ctx_.rank, (now_ns() - start) / 1000000, missing);
    }
    fds.clear();
    for (VerbsConnection* c : conns) {
      short events = 0;
      int fd = c->poll_fd(&events);
      if (fd >= 0) fds.push_back(pollfd{fd, events, 0});
    }
    ::poll(fds.data(), fds.size(), deadline.remaining_ms(20));
  }
}

Result<std::unique_ptr<TransportInstance>> open_default(const TransportContext& ctx) {
  return open_instance(ctx, options_from_params());
}

}  // namespace

VerbsOptions options_from_params() {
  VerbsOptions o;
  o.slots = static_cast<uint32_t>(params::kIbSlots.get());
  o.slot_bytes = static_cast<uint32_t>(params::kIbSlotBytes.get());
  o.rdv_bytes = static_cast<uint64_t>(params::kIbRdvBytes.get());
  o.qps_per_connection = static_cast<uint32_t>(params::kIbQpsPerConnection.get());
  return o;
}

ByteCounts instance_byte_counts(const TransportInstance& instance) {
  const auto* v = dynamic_cast<const VerbsInstance*>(&instance);
  return v != nullptr ? v->byte_counts() : ByteCounts{};
}

Result<std::unique_ptr<TransportInstance>> open_instance(const TransportContext& ctx,
                                                         const VerbsOptions& options) {
  if (options.slots < kMinSlots || options.slots > kMaxSlots ||
      options.slot_bytes < kMinSlotBytes || options.slot_bytes > kMaxSlotBytes ||
      options.slot_bytes % 64 != 0) {
    return invalid_argument("verbs: {} slots of {} bytes (slots {}..{}; bytes a multiple of 64 "
                            "in {}..{})",
                            options.slots, options.slot_bytes, kMinSlots, kMaxSlots,
                            kMinSlotBytes, kMaxSlotBytes);
  }
  if (options.qps_per_connection < 1 || options.qps_per_connection > kMaxQpsPerConnection) {
    return invalid_argument("verbs: {} QPs per connection (NCCL_IB_QPS_PER_CONNECTION: 1..{})",
                            options.qps_per_connection, kMaxQpsPerConnection);
  }
  if (ctx.channels < 1 || ctx.channels > kMaxChannels) {
    return invalid_argument("verbs: {} channels (must be 1..{})", ctx.channels, kMaxChannels);
  }
  if (ctx.rank < 0 || ctx.rank >= ctx.nranks) {
    return invalid_argument("verbs: rank {} of {}", ctx.rank, ctx.nranks);
  }
  if (static_cast<size_t>(ctx.nranks) * static_cast<size_t>(ctx.channels) *
          options.qps_per_connection >
      kMaxEntries) {
    return invalid_argument("verbs: {} ranks x {} channels x {} QPs per connection need more QPs "
                            "than a blob can name ({} at most)",
                            ctx.nranks, ctx.channels, options.qps_per_connection, kMaxEntries);
  }
  CHORUS_ASSIGN_OR_RETURN(HcaFilter filter, parse_hca_filter(params::kIbHca.get()));
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Device> device,
                          Device::open(filter, gid_policy_from_params()));
  if (!device) return std::unique_ptr<TransportInstance>();  // no RDMA here
  if (options.slot_bytes > device->port_attr().max_msg_sz) {
    return invalid_argument("verbs: slots of {} bytes exceed {}'s largest message ({} bytes)",
                            options.slot_bytes, device->name(), device->port_attr().max_msg_sz);
  }
  auto instance = std::make_unique<VerbsInstance>(ctx, options, std::move(device));
  CHORUS_RETURN_IF_ERROR(instance->init());
  return std::unique_ptr<TransportInstance>(std::move(instance));
}

void register_transport() {
  static constexpr TransportDesc desc{
      .name = "verbs",
      .summary = "any two hosts over RDMA verbs (RC queue pairs, RoCE v2 or InfiniBand; RDMA "
                 "WRITE_WITH_IMM into credit-controlled rings); opened only when forced "
                 "(CHORUS_TRANSPORT=VERBS) or measured in the tuner file",
      .caps = {
          .reach = TransportCaps::Reach::kAnyHost,
          .registration = true,  // MRs of registered ranges: sends read them in place
          .reduce_on_receive = true,
          .opt_in = true,  // pinned rings and a QP per peer and channel: only when chosen
      },
      // Unmeasured: a tuner file line replaces it.
      .cost = {10, 3},
      .open = open_default,
  };
  chorus::register_transport(&desc);
}

}  // namespace chorus::verbs
