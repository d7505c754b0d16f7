// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_plugin.cc
// The TCP transport as a plug-in: any two ranks that can reach each other's listener, on the
// rail their local indices choose when hosts have several (CHORUS_SOCKET_IFNAME matching
// several interfaces: rail0,rail1).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/params.h"
#include "net/socket.h"
#include "transports/registry.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/tcp/tcp_mender.h"
#include "transports/tcp/tcp_transport.h"

namespace chorus::tcp {

namespace {

// What a rank publishes: its listener's address on each of its rails (net::pick_rails()), as
// a count byte and, per rail, a length byte and the sockaddr bytes.
std::string make_blob(const std::vector<net::SockAddr>& rails) {
  std::string blob(1, static_cast<char>(rails.size()));
  for (const net::SockAddr& a : rails) {
    blob += static_cast<char>(a.len);
    blob.append(reinterpret_cast<const char*>(&a.storage), a.len);
  }
  return blob;
}

Result<std::vector<net::SockAddr>> parse_blob(const EndpointInfo& info) {
  auto bad = [&] {
    return remote_error("{} published a bad TCP address ({} bytes)", info.describe(),
                        info.blob.size());
  };
  std::vector<net::SockAddr> rails;
  if (info.blob.empty()) return bad();
  const size_t n = static_cast<unsigned char>(info.blob[0]);
  size_t at = 1;
  for (size_t i = 0; i < n; ++i) {
    net::SockAddr addr;
    if (at >= info.blob.size()) return bad();
    const size_t len = static_cast<unsigned char>(info.blob[at++]);
    if (len == 0 || len > sizeof(addr.storage) || info.blob.size() - at < len) return bad();
    std::memcpy(&addr.storage, info.blob.data() + at, len);
    addr.len = static_cast<socklen_t>(len);
    at += len;
    rails.push_back(addr);
  }
  if (rails.empty() || at != info.blob.size()) return bad();
  return rails;
}

// Rank r's index among its host's ranks.
int local_index(const std::vector<EndpointInfo>& all, int r) {
  int l = 0;
  for (int q = 0; q < r; ++q) l += all[q].same_host(all[r]) ? 1 : 0;
  return l;
}

class TcpInstance final : public TransportInstance {
 public:
  TcpInstance(const TransportContext& ctx, std::unique_ptr<TcpListener> listener,
              std::vector<net::SockAddr> rails, std::vector<std::string> rail_names)
      : ctx_(ctx), listener_(std::move(listener)), rails_(std::move(rails)),
        rail_names_(std::move(rail_names)) {}

  std::string blob() const override { return make_blob(rails_); }

  Result<ConnectionTable> connect(const std::vector<EndpointInfo>& all,
                                  const std::vector<int>& peers, Deadline deadline) override {
    TcpSetup setup;
    setup.rank = ctx_.rank;
    setup.comm_uid = ctx_.comm_uid;
    setup.secret = ctx_.secret;
    setup.channels = ctx_.channels;
    setup.bounce_bytes = static_cast<size_t>(params::kTcpBounceBytes.get());
    setup.listener = listener_.get();
    setup.deadline = deadline;
    const int me = local_index(all, ctx_.rank);
    for (int r : peers) {
      CHORUS_ASSIGN_OR_RETURN(std::vector<net::SockAddr> theirs, parse_blob(all[r]));
      // Rail-aligned: ranks of one local index on different hosts (the hierarchical
      // algorithms' cross-host pairs) talk on rail <local index>; other pairs on the rail of
      // the smaller local index. Rails count on both sides (hosts cabled alike).
      // With several channels, channel c takes the c-th rail from there: a peer's paths
      // (transports/chunk.h) then cross different links.
      const int rails = static_cast<int>(std::min(theirs.size(), rails_.size()));
      const int rail = std::min(me, local_index(all, r)) % rails;
      TcpPeer peer{r, theirs[rail], fmt::format("host {}, pid {}", all[r].hostname, all[r].pid), {}};
      if (rails > 1) {
        std::string used;
        for (int c = 0; c < ctx_.channels; ++c) {
          const int k = (rail + c) % rails;
          peer.channel_addr.push_back(theirs[k]);
          used += fmt::format("{}{}", c == 0 ? "" : ", ", rail_names_[k]);
        }
        CHORUS_INFO(kNet, "tcp: rank {} reaches rank {} ({}) on rail(s) {}", ctx_.rank, r,
                    theirs[rail].to_string(), used);
      }
      setup.peers.push_back(std::move(peer));
    }
    if (setup.peers.empty()) return ConnectionTable();
    CHORUS_ASSIGN_OR_RETURN(ConnectionTable table, connect_all(setup));
    // A peer reached over several rails: its connections stand in for each other when one
    // fails (README.md, "Failover").
    for (size_t i = 0; i < table.size() && params::kTcpFailover.get() != 0; ++i) {
      const std::vector<net::SockAddr>& addrs = setup.peers[i].channel_addr;
      if (addrs.size() < 2 || std::all_of(addrs.begin(), addrs.end(), [&](const net::SockAddr& a) {
            return a.to_string() == addrs[0].to_string();
          })) {
        continue;
      }
      if (mender_ == nullptr) {
        mender_ = std::make_shared<TcpMender>(ctx_.rank, ctx_.comm_uid, ctx_.secret,
                                              listener_->fd());
      }
      auto group = std::make_shared<TcpPeerGroup>();
      for (auto& conn : table[i]) group->members.push_back(static_cast<TcpConnection*>(conn.get()));
      group->mender = mender_;
      mender_->add(group.get());
      for (TcpConnection* m : group->members) m->join_group(group);
    }
    return table;
  }

 private:
  TransportContext ctx_;
  std::unique_ptr<TcpListener> listener_;
  std::vector<net::SockAddr> rails_;  // the listener's address on each rail
  std::vector<std::string> rail_names_;
  std::shared_ptr<TcpMender> mender_;  // reconnects failed paths of the failover groups
};

Result<std::unique_ptr<TransportInstance>> open(const TransportContext& ctx) {
  CHORUS_ASSIGN_OR_RETURN(std::vector<net::Interface> ifaces, net::pick_rails());
  std::vector<net::SockAddr> rails;
  std::vector<std::string> names;
  std::unique_ptr<TcpListener> listener;
  if (ifaces.size() == 1) {
    CHORUS_ASSIGN_OR_RETURN(listener, TcpListener::create(ifaces[0].addr));
    rails.push_back(listener->address());
  } else {
    // One listener for every rail: the wildcard address of their family, on one port.
    const bool v6 = ifaces[0].addr.family() == AF_INET6;
    CHORUS_ASSIGN_OR_RETURN(net::SockAddr any, net::SockAddr::parse(v6 ? "::" : "0.0.0.0", 0));
    CHORUS_ASSIGN_OR_RETURN(listener, TcpListener::create(any));
    for (const net::Interface& itf : ifaces) {
      net::SockAddr a = itf.addr;
      a.set_port(listener->address().port());
      rails.push_back(a);
    }
  }
  for (const net::Interface& itf : ifaces) names.push_back(itf.name);
  return std::unique_ptr<TransportInstance>(
      new TcpInstance(ctx, std::move(listener), std::move(rails), std::move(names)));
}

}  // namespace

void register_transport() {
  static constexpr TransportDesc desc{
      .name = "tcp",
      .summary = "any two hosts: authenticated TCP sockets, one per channel",
      .caps = {
          .reach = TransportCaps::Reach::kAnyHost,
          .reduce_on_receive = true,
      },
      .cost = {25, 1},
      .open = open,
  };
  chorus::register_transport(&desc);
}

}  // namespace chorus::tcp
