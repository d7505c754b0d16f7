// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_qp.h
// The RC queue pairs of one connection (NCCL_IB_QPS_PER_CONNECTION of them) with their shared
// completion queue and completion channel, and their state transitions (RESET -> INIT at
// creation, -> RTR -> RTS once the peer's QP numbers are known).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transports/verbs/verbs_device.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {

// Members are destroyed QPs first, then CQ, then channel.
struct QpResources {
  IbvPtr<ibv_comp_channel> channel;  // non-blocking fd
  IbvPtr<ibv_cq> cq;                 // send and receive completions of every QP
  std::vector<IbvPtr<ibv_qp>> qps;
  std::vector<uint32_t> psns;  // our initial send PSN of each
  uint32_t send_depth = 0;     // max_send_wr of each QP
  uint32_t recv_depth = 0;     // max_recv_wr of each QP
  uint32_t max_inline = 0;     // bytes a send may carry inline (IBV_SEND_INLINE), every QP
};

// The inline data asked of each QP: a slot header and a payload of up to 192 bytes. A driver
// that refuses it gets QPs without inline sends.
inline constexpr uint32_t kWantInlineBytes = 256;

// The wr_id of every receive work request.
inline constexpr uint64_t kRecvWrId = 5;

// `count` QPs in INIT (remote writes allowed), each with `send_depth` / `recv_depth` work
// requests, two send SGEs and kWantInlineBytes of inline data where the driver allows it (else
// none), and one CQ for all; every receive is posted (0-SGE, id kRecvWrId). kSystemError naming
// the device when the driver refuses.
Result<QpResources> create_qps(const Device& dev, uint32_t count, uint32_t send_depth,
                               uint32_t recv_depth);

// INIT -> RTR towards the peer's QP `peer_qpn` whose first PSN is `peer_psn`, then -> RTS.
// Path MTU: the smaller active MTU of the two ports.
Status connect_qp(const Device& dev, ibv_qp* qp, uint32_t my_psn, const BlobInfo& peer,
                  uint32_t peer_qpn, uint32_t peer_psn, const QpSettings& settings);

// Moves the QP to ERR: outstanding work requests complete as flushed.
void qp_to_error(ibv_qp* qp);

}  // namespace chorus::verbs
