// SPDX-License-Identifier: Apache-2.0
// File: transports/tcp/tcp_plugin.cc
// The TCP transport as a plug-in: any two ranks that can reach each other's listener.
#include <fmt/format.h>

#include <cstring>

#include "net/socket.h"
#include "transports/registry.h"
#include "transports/tcp/tcp_transport.h"

namespace chorus::tcp {

namespace {

// What a rank publishes: its listener's address (sockaddr bytes).
Result<net::SockAddr> parse_blob(const EndpointInfo& info) {
  net::SockAddr addr;
  if (info.blob.empty() || info.blob.size() > sizeof(addr.storage))
    return remote_error("{} published a bad TCP address ({} bytes)", info.describe(), info.blob.size());
  std::memcpy(&addr.storage, info.blob.data(), info.blob.size());
  addr.len = static_cast<socklen_t>(info.blob.size());
  return addr;
}

class TcpInstance final : public TransportInstance {
 public:
  TcpInstance(const TransportContext& ctx, std::unique_ptr<TcpListener> listener)
      : ctx_(ctx), listener_(std::move(listener)) {}

  std::string blob() const override {
    const net::SockAddr& a = listener_->address();
    return std::string(reinterpret_cast<const char*>(&a.storage), a.len);
  }

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
    for (int r : peers) {
      CHORUS_ASSIGN_OR_RETURN(net::SockAddr addr, parse_blob(all[r]));
      setup.peers.push_back(
          TcpPeer{r, addr, fmt::format("host {}, pid {}", all[r].hostname, all[r].pid)});
    }
    if (setup.peers.empty()) return ConnectionTable();
    return connect_all(setup);
  }

 private:
  TransportContext ctx_;
  std::unique_ptr<TcpListener> listener_;
};

Result<std::unique_ptr<TransportInstance>> open(const TransportContext& ctx) {
  CHORUS_ASSIGN_OR_RETURN(net::Interface iface, net::pick_interface());
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<TcpListener> listener, TcpListener::create(iface.addr));
  return std::unique_ptr<TransportInstance>(new TcpInstance(ctx, std::move(listener)));
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
