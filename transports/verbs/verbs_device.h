// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_device.h
// Owners of libibverbs handles, and the device a verbs instance uses: the first active port
// that NCCL_IB_HCA admits, its GID (RoCE v2 with an IPv4-mapped address unless
// NCCL_IB_GID_INDEX forces one), a protection domain, and the device's asynchronous events.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "transports/verbs/verbs_wire.h"

namespace chorus::verbs {

// Destroys a verbs object; a failure is logged (destructors never throw).
struct IbvDeleter {
  void operator()(ibv_context* p) const;
  void operator()(ibv_pd* p) const;
  void operator()(ibv_mr* p) const;
  void operator()(ibv_cq* p) const;
  void operator()(ibv_comp_channel* p) const;
  void operator()(ibv_qp* p) const;
};
template <typename T>
using IbvPtr = std::unique_ptr<T, IbvDeleter>;

// QP attributes from the parameters (NCCL_IB_TIMEOUT, _RETRY_CNT, _TC, _SL).
struct QpSettings {
  int timeout = 20;
  int retry_cnt = 7;
  int traffic_class = 0;
  int service_level = 0;
};
QpSettings qp_settings_from_params();

// How a RoCE port's GID is chosen (NCCL's variables): `forced_index` >= 0 takes that index
// (NCCL_IB_GID_INDEX). Otherwise the best usable GID: RoCE v2 before v1; of the address family
// `family` ("AF_INET": IPv4-mapped, "AF_INET6": routable IPv6; NCCL_IB_ADDR_FAMILY) only when
// it is set, IPv4 before IPv6 when it is empty; and, other things equal, one whose netdev
// matches `ifname_spec` (NCCL_SOCKET_IFNAME syntax) before others.
struct GidPolicy {
  int forced_index = -1;
  std::string family;
  std::string ifname_spec;
};
GidPolicy gid_policy_from_params();

// The preference of GID entry `e`, whose netdev is `netdev` ("" unknown), under `policy`; 0:
// not usable (zero, link-local, InfiniBand, another family than the one asked for).
int gid_score(const ibv_gid_entry& e, const std::string& netdev, const GidPolicy& policy);

class Device {
 public:
  // The first active port of a device that `filter` admits, with its GID chosen by `gids`. A
  // null device (not an error) when this host has no RDMA device, or none that the filter
  // admits. Errors: a device that cannot be opened, or a RoCE port without a usable GID.
  static Result<std::shared_ptr<Device>> open(const HcaFilter& filter, const GidPolicy& gids);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const { return ctx_.get(); }
  ibv_pd* pd() const { return pd_.get(); }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  bool roce() const { return port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  uint32_t max_qp_wr() const { return max_qp_wr_; }
  int max_cqe() const { return max_cqe_; }
  // "rxe0 port 1, GID 1 ::ffff:10.0.2.15 (RoCE v2)".
  std::string describe() const;

  // Whether any asynchronous event read so far reports a failure (they are read without
  // blocking, at most every 10 ms): the cheap test a connection makes on every progress.
  bool any_failure();
  // Why QP `qpn` or the whole device failed, from those events; empty while none concerns it.
  std::string failure(uint32_t qpn);

 private:
  Device() = default;
  // Picks the GID of port_ (ctx_ and port_attr_ set) as `policy` says.
  Status choose_gid(int ports, const GidPolicy& policy);
  void read_async_events();

  IbvPtr<ibv_context> ctx_;  // declared first: destroyed last
  IbvPtr<ibv_pd> pd_;
  std::string name_;
  uint8_t port_ = 0;
  ibv_port_attr port_attr_{};
  int gid_index_ = -1;
  ibv_gid gid_{};
  std::string gid_type_;
  uint32_t max_qp_wr_ = 0;
  int max_cqe_ = 0;
  int64_t next_event_check_ns_ = 0;
  std::unordered_map<uint32_t, std::string> qp_failures_;
  std::string fatal_;
};

// "fe80::1" / "::ffff:10.0.2.15" style text of a GID.
std::string gid_to_string(const uint8_t gid[16]);

}  // namespace chorus::verbs
