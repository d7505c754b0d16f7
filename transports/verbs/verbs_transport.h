// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_transport.h
// The verbs transport (libibverbs, RC queue pairs over RoCE v2 or InfiniBand): one instance
// per communicator rank with a QP per (peer, channel), created when it opens so that their
// numbers travel in the published blob. README.md describes the design and wire format.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "transports/registry.h"
#include "transports/verbs/verbs_stats.h"

namespace chorus::verbs {

// Ring geometry, the rendezvous threshold and the QPs per connection; the registered transport
// reads CHORUS_IB_SLOTS, CHORUS_IB_SLOT_BYTES, CHORUS_IB_RDV_BYTES and
// NCCL_IB_QPS_PER_CONNECTION.
struct VerbsOptions {
  uint32_t slots = 16;
  uint32_t slot_bytes = 64 << 10;
  uint64_t rdv_bytes = 64 << 10;  // 0: never
  uint32_t qps_per_connection = 1;  // 1..kMaxQpsPerConnection; equal on every rank
};
VerbsOptions options_from_params();

// Opens the verbs transport for one communicator rank: the device (NCCL_IB_HCA,
// NCCL_IB_GID_INDEX), its rings and a QP per (peer, channel). No instance (not an error) when
// this host has no usable RDMA device. Errors: kInvalidArgument for bad options or a
// communicator too large for the blob; kSystemError when the device refuses resources.
Result<std::unique_ptr<TransportInstance>> open_instance(const TransportContext& ctx,
                                                         const VerbsOptions& options);

// The payload bytes `instance` (a verbs instance) moved through rings and zero copy so far.
ByteCounts instance_byte_counts(const TransportInstance& instance);

// Registers the transport "verbs" (called by the generated transports/builtin.cc).
void register_transport();

}  // namespace chorus::verbs
