// SPDX-License-Identifier: Apache-2.0
// File: transports/shm/shm_plugin.cc
// The shared-memory transport as a plug-in: ranks of one host, in other processes.
#include <fmt/format.h>

#include "common/bytes.h"
#include "common/log.h"
#include "common/process.h"
#include "transports/registry.h"
#include "transports/shm/shm_transport.h"

namespace chorus::shm {

namespace {

// What a rank publishes: its segment's and its process doorbell's fd numbers (a peer opens
// them as /proc/<pid>/fd/<n>).
struct Blob {
  int32_t shm_fd = -1;
  int32_t doorbell_fd = -1;
};

Result<Blob> parse_blob(const EndpointInfo& info) {
  ByteReader r(info.blob);
  Blob b;
  CHORUS_RETURN_IF_ERROR(r.get(&b.shm_fd));
  CHORUS_RETURN_IF_ERROR(r.get(&b.doorbell_fd));
  if (b.shm_fd < 0 || b.doorbell_fd < 0)
    return remote_error("{} published bad shared-memory fds", info.describe());
  return b;
}

class ShmInstance final : public TransportInstance {
 public:
  ShmInstance(const TransportContext& ctx, std::unique_ptr<ShmSegment> segment)
      : ctx_(ctx), segment_(std::move(segment)) {}

  std::string blob() const override {
    ByteWriter w;
    w.put<int32_t>(segment_->fd());
    w.put<int32_t>(ProcessContext::get().doorbell_fd());
    return w.take();
  }

  // Every rank of this host that opened shm takes part in the segment layout (even one whose
  // peers here are all reached directly); the connections to ranks not in `peers` are dropped.
  Result<ConnectionTable> connect(const std::vector<EndpointInfo>& all,
                                  const std::vector<int>& peers, Deadline deadline) override {
    const EndpointInfo& me = all[ctx_.rank];
    ShmSetup setup;
    setup.rank = ctx_.rank;
    setup.channels = ctx_.channels;
    setup.fifo_bytes = static_cast<size_t>(params::kShmFifoBytes.get()) / 64 * 64;
    setup.segment = segment_.get();
    setup.deadline = deadline;
    std::vector<int> local;
    for (const EndpointInfo& e : all) {
      if (!e.open || !e.same_host(me)) continue;
      setup.local_ranks.push_back(e.rank);
      if (e.rank == ctx_.rank) continue;
      CHORUS_ASSIGN_OR_RETURN(Blob b, parse_blob(e));
      setup.peers.push_back(ShmPeer{e.rank, e.pid, b.shm_fd, b.doorbell_fd});
      local.push_back(e.rank);
    }
    CHORUS_ASSIGN_OR_RETURN(ShmConnections conns, connect_all(setup));
    ConnectionTable out(peers.size());
    for (size_t i = 0; i < peers.size(); ++i) {
      for (size_t k = 0; k < local.size(); ++k)
        if (local[k] == peers[i]) out[i] = std::move(conns[k]);
      if (out[i].empty())
        return internal_error("shm: {} is not a local shared-memory rank", all[peers[i]].describe());
    }
    return out;
  }

 private:
  TransportContext ctx_;
  std::unique_ptr<ShmSegment> segment_;
};

Result<std::unique_ptr<TransportInstance>> open(const TransportContext& ctx) {
  if (ProcessContext::get().doorbell_fd() < 0) return std::unique_ptr<TransportInstance>();
  auto segment = ShmSegment::create();
  if (!segment.ok()) {
    CHORUS_WARN(kShm, "no shared memory for {}: {}", ctx.comm_label, segment.status().message());
    return std::unique_ptr<TransportInstance>();
  }
  return std::unique_ptr<TransportInstance>(new ShmInstance(ctx, std::move(segment).value()));
}

}  // namespace

void register_transport() {
  static constexpr TransportDesc desc{
      .name = "shm",
      .summary = "ranks of one host: shared-memory FIFOs (memfd), doorbells",
      .caps = {
          .reach = TransportCaps::Reach::kSameHost,
          .reduce_on_receive = true,
      },
      .cost = {1, 8},
      .open = open,
  };
  chorus::register_transport(&desc);
}

}  // namespace chorus::shm
