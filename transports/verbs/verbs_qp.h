// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_qp.h
// One RC queue pair with its own completion queue and completion channel, and its state
// transitions (RESET -> INIT at creation, -> RTR -> RTS once the peer's QP number is known).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "common/status.h"
#include "transports/verbs/verbs_device.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {

// Members are destroyed QP first, then CQ, then channel.
struct QpResources {
  IbvPtr<ibv_comp_channel> channel;  // non-blocking fd
  IbvPtr<ibv_cq> cq;                 // send and receive completions of qp
  IbvPtr<ibv_qp> qp;
  uint32_t psn = 0;          // our initial send PSN
  uint32_t send_depth = 0;   // max_send_wr granted
  uint32_t recv_depth = 0;   // max_recv_wr granted
};

// The wr_id of every receive work request.
inline constexpr uint64_t kRecvWrId = 5;

// A QP in INIT (remote writes allowed) with `send_depth` / `recv_depth` work requests, two
// send SGEs, and a CQ for both; every receive is posted (0-SGE, id kRecvWrId). kSystemError naming the device when the driver refuses.
Result<QpResources> create_qp(const Device& dev, uint32_t send_depth, uint32_t recv_depth);

// INIT -> RTR towards the peer's QP `peer_qpn` whose first PSN is `peer_psn`, then -> RTS.
// Path MTU: the smaller active MTU of the two ports.
Status connect_qp(const Device& dev, ibv_qp* qp, uint32_t my_psn, const BlobInfo& peer,
                  uint32_t peer_qpn, uint32_t peer_psn, const QpSettings& settings);

// Moves the QP to ERR: outstanding work requests complete as flushed.
void qp_to_error(ibv_qp* qp);

}  // namespace chorus::verbs
