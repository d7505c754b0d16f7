// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_qp.cc
// QP creation and state transitions (RDMA_NOTES.md section C gives the masks).
#include "transports/verbs/verbs_qp.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

#include "common/log.h"

namespace chorus::verbs {

namespace {

// Not a thread_local engine: a library that dlopen() loads must keep its thread-local storage
// small (glibc reserves a few hundred bytes of static TLS for such libraries).
uint32_t random_psn() {
  static std::mutex mutex;
  static std::mt19937 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return gen() & 0xffffff;
}

}  // namespace

Result<QpResources> create_qps(const Device& dev, uint32_t count, uint32_t send_depth,
                               uint32_t recv_depth) {
  QpResources r;
  r.channel.reset(ibv_create_comp_channel(dev.context()));
  if (!r.channel) {
    return system_error(errno, fmt::format("verbs: ibv_create_comp_channel on {}", dev.name()));
  }
  const int flags = fcntl(r.channel->fd, F_GETFL);
  if (flags < 0 || fcntl(r.channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return system_error(errno, "verbs: making a completion channel non-blocking");
  const int64_t cqe = int64_t{count} * (send_depth + recv_depth);
  if (cqe > dev.max_cqe() || std::max(send_depth, recv_depth) > dev.max_qp_wr()) {
    return make_status(Code::kSystemError,
                       "verbs: {} allows {} completions per CQ and {} work requests per queue; "
                       "{} QPs of {} send + {} receive requested (lower CHORUS_IB_SLOTS or "
                       "NCCL_IB_QPS_PER_CONNECTION)",
                       dev.name(), dev.max_cqe(), dev.max_qp_wr(), count, send_depth, recv_depth);
  }
  r.cq.reset(ibv_create_cq(dev.context(), static_cast<int>(cqe), nullptr, r.channel.get(), 0));
  if (!r.cq) return system_error(errno, fmt::format("verbs: ibv_create_cq({}) on {}", cqe, dev.name()));
  // What we use, not what the driver granted (it may round up): the CQ is sized for these.
  r.send_depth = send_depth;
  r.recv_depth = recv_depth;
  for (uint32_t n = 0; n < count; ++n) {
    ibv_qp_init_attr init{};
    init.send_cq = r.cq.get();
    init.recv_cq = r.cq.get();
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = send_depth;
    init.cap.max_recv_wr = recv_depth;
    init.cap.max_send_sge = 2;
    init.cap.max_recv_sge = 1;
    // Inline sends: on the first QP as much as the driver allows of kWantInlineBytes, the same
    // on the others (what it granted once, it grants again).
    init.cap.max_inline_data = n == 0 ? kWantInlineBytes : r.max_inline;
    IbvPtr<ibv_qp> qp(ibv_create_qp(dev.pd(), &init));
    if (!qp && n == 0) {
      CHORUS_INFO(kNet, "verbs: {} refused {} bytes of inline data per send ({}); sends go "
                  "without", dev.name(), kWantInlineBytes, std::strerror(errno));
      init.cap.max_inline_data = 0;
      qp.reset(ibv_create_qp(dev.pd(), &init));
    }
    if (!qp) return system_error(errno, fmt::format("verbs: ibv_create_qp on {}", dev.name()));
    if (n == 0) r.max_inline = std::min(init.cap.max_inline_data, kWantInlineBytes);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = dev.port();
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (int rc = ibv_modify_qp(qp.get(), &a,
                               IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        rc != 0) {
      return system_error(rc, fmt::format("verbs: QP {:#x} on {} to INIT", qp->qp_num, dev.name()));
    }
    // Every receive is posted before the peer can write (the QP reaches RTR later): 0-SGE, as
    // WRITE_WITH_IMM and the 0-byte credit SENDs carry only immediate data.
    for (uint32_t i = 0; i < r.recv_depth; ++i) {
      ibv_recv_wr wr{};
      ibv_recv_wr* bad = nullptr;
      wr.wr_id = kRecvWrId;
      wr.num_sge = 0;
      if (int rc = ibv_post_recv(qp.get(), &wr, &bad); rc != 0) {
        return system_error(rc, fmt::format("verbs: posting receive {} of {} on QP {:#x}", i,
                                            r.recv_depth, qp->qp_num));
      }
    }
    r.qps.push_back(std::move(qp));
    r.psns.push_back(random_psn());
  }
  return r;
}

Status connect_qp(const Device& dev, ibv_qp* qp, uint32_t my_psn, const BlobInfo& peer,
                  uint32_t peer_qpn, uint32_t peer_psn, const QpSettings& settings) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(
      std::min<int>(static_cast<int>(dev.port_attr().active_mtu), static_cast<int>(peer.mtu)));
  a.dest_qp_num = peer_qpn;
  a.rq_psn = peer_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms (RDMA_NOTES A6: smaller ones storm on rxe)
  a.ah_attr.port_num = dev.port();
  a.ah_attr.sl = static_cast<uint8_t>(settings.service_level);
  if (dev.roce()) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid.data(), 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev.gid_index());
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(settings.traffic_class);
  } else {
    a.ah_attr.dlid = peer.lid;
  }
  if (int rc = ibv_modify_qp(qp, &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return system_error(rc, fmt::format("verbs: QP {:#x} on {} to RTR (peer QP {:#x}, GID {})",
                                        qp->qp_num, dev.name(), peer_qpn,
                                        gid_to_string(peer.gid.data())));
  }
  ibv_qp_attr b{};
  b.qp_state = IBV_QPS_RTS;
  b.sq_psn = my_psn;
  b.timeout = static_cast<uint8_t>(settings.timeout);
  b.retry_cnt = static_cast<uint8_t>(settings.retry_cnt);
  b.rnr_retry = 7;  // infinite: a receiver that has not reposted yet is no error
  b.max_rd_atomic = 1;
  if (int rc = ibv_modify_qp(qp, &b,
                             IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return system_error(rc, fmt::format("verbs: QP {:#x} on {} to RTS", qp->qp_num, dev.name()));
  }
  return ok_status();
}

void qp_to_error(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE); rc != 0)
    CHORUS_WARN(kNet, "verbs: QP {:#x} to ERR failed: {}", qp->qp_num, std::strerror(rc));
}

}  // namespace chorus::verbs
