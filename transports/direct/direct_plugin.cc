// SPDX-License-Identifier: Apache-2.0
// File: transports/direct/direct_plugin.cc
// The direct transport as a plug-in: ranks of one process, through pointers.
#include "transports/direct/direct_transport.h"
#include "transports/registry.h"

namespace chorus::direct {

namespace {

class DirectInstance final : public TransportInstance {
 public:
  explicit DirectInstance(const TransportContext& ctx)
      : ctx_(ctx), node_(register_node(ctx.comm_uid, ctx.rank)) {}
  // Nothing to publish: the process token in EndpointInfo is all a peer needs.
  std::string blob() const override { return "direct"; }
  Result<ConnectionTable> connect(const std::vector<EndpointInfo>& all,
                                  const std::vector<int>& peers, Deadline deadline) override {
    (void)all;
    DirectSetup setup{ctx_.rank, ctx_.comm_uid, ctx_.channels, node_, peers, deadline};
    return connect_all(setup);
  }

 private:
  TransportContext ctx_;
  std::shared_ptr<DirectNode> node_;
};

Result<std::unique_ptr<TransportInstance>> open(const TransportContext& ctx) {
  return std::unique_ptr<TransportInstance>(new DirectInstance(ctx));
}

}  // namespace

void register_transport() {
  static constexpr TransportDesc desc{
      .name = "direct",
      .summary = "ranks of one process: the receiver copies or reduces from the sender's buffer",
      .caps = {
          .reach = TransportCaps::Reach::kSameProcess,
          .reduce_on_receive = true,
      },
      .cost = {0.2, 20},
      .open = open,
  };
  chorus::register_transport(&desc);
}

}  // namespace chorus::direct
