// SPDX-License-Identifier: Apache-2.0
// File: transports/verbs/verbs_device.cc
// Device and port selection, GID choice, asynchronous events.
#include "transports/verbs/verbs_device.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "common/scope_guard.h"
#include "net/socket.h"

namespace chorus::verbs {

namespace {

constexpr int64_t kEventCheckNs = 10'000'000;
// ibv_ah_attr's sgid_index is 8 bits wide.
constexpr uint32_t kMaxGidIndex = 255;

bool ipv4_mapped(const uint8_t* g) {
  for (int i = 0; i < 10; ++i)
    if (g[i] != 0) return false;
  return g[10] == 0xff && g[11] == 0xff;
}
bool link_local(const uint8_t* g) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }
bool all_zero(const uint8_t* g) {
  for (int i = 0; i < 16; ++i)
    if (g[i] != 0) return false;
  return true;
}

const char* gid_type_name(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "unknown type";
  }
}


// Every valid GID entry of `port`: the whole table at once, else one index at a time.
std::vector<ibv_gid_entry> gid_entries(ibv_context* ctx, uint8_t port, int table_len,
                                       int ports) {
  std::vector<ibv_gid_entry> all(static_cast<size_t>(table_len) * static_cast<size_t>(ports));
  std::vector<ibv_gid_entry> out;
  ssize_t n = all.empty() ? -1 : ibv_query_gid_table(ctx, all.data(), all.size(), 0);
  if (n >= 0) {
    for (ssize_t i = 0; i < n; ++i)
      if (all[i].port_num == port) out.push_back(all[i]);
    return out;
  }
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(i), &e, 0) == 0) out.push_back(e);
  }
  return out;
}

}  // namespace

void IbvDeleter::operator()(ibv_context* p) const {
  if (int rc = ibv_close_device(p); rc != 0)
    CHORUS_WARN(kNet, "verbs: ibv_close_device failed: {}", std::strerror(errno));
}
void IbvDeleter::operator()(ibv_pd* p) const {
  if (int rc = ibv_dealloc_pd(p); rc != 0)
    CHORUS_WARN(kNet, "verbs: ibv_dealloc_pd failed: {}", std::strerror(rc));
}
void IbvDeleter::operator()(ibv_mr* p) const {
  if (int rc = ibv_dereg_mr(p); rc != 0)
    CHORUS_WARN(kNet, "verbs: ibv_dereg_mr failed: {}", std::strerror(rc));
}
void IbvDeleter::operator()(ibv_cq* p) const {
  if (int rc = ibv_destroy_cq(p); rc != 0)
    CHORUS_WARN(kNet, "verbs: ibv_destroy_cq failed: {}", std::strerror(rc));
}
void IbvDeleter::operator()(ibv_comp_channel* p) const {
  if (int rc = ibv_destroy_comp_channel(p); rc != 0)
    CHORUS_WARN(kNet, "verbs: ibv_destroy_comp_channel failed: {}", std::strerror(rc));
}
void IbvDeleter::operator()(ibv_qp* p) const {
  const uint32_t qpn = p->qp_num;
  if (int rc = ibv_destroy_qp(p); rc != 0)
    CHORUS_WARN(kNet, "verbs: ibv_destroy_qp of QP {:#x} failed: {}", qpn, std::strerror(rc));
}

QpSettings qp_settings_from_params() {
  QpSettings s;
  s.timeout = static_cast<int>(params::kIbTimeout.get());
  s.retry_cnt = static_cast<int>(params::kIbRetryCnt.get());
  s.traffic_class = static_cast<int>(params::kIbTc.get());
  s.service_level = static_cast<int>(params::kIbSl.get());
  return s;
}

std::string gid_to_string(const uint8_t gid[16]) {
  char text[INET6_ADDRSTRLEN] = {};
  if (ipv4_mapped(gid)) {
    return fmt::format("::ffff:{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]);
  }
  if (inet_ntop(AF_INET6, gid, text, sizeof(text)) == nullptr) return "?";
  return text;
}

GidPolicy gid_policy_from_params() {
  GidPolicy p;
  p.forced_index = static_cast<int>(params::kIbGidIndex.get());
  p.family = params::kIbAddrFamily.get();
  p.ifname_spec = params::kSocketIfname.get();
  return p;
}

int gid_score(const ibv_gid_entry& e, const std::string& netdev, const GidPolicy& policy) {
  const uint8_t* g = e.gid.raw;
  if (all_zero(g) || link_local(g)) return 0;
  if (e.gid_type != IBV_GID_TYPE_ROCE_V2 && e.gid_type != IBV_GID_TYPE_ROCE_V1) return 0;
  const bool v4 = ipv4_mapped(g);
  if (!policy.family.empty() && policy.family != (v4 ? "AF_INET" : "AF_INET6")) return 0;
  // In order of weight: RoCE v2 (routable; NCCL's choice), the family (IPv4 first when none is
  // asked for), the netdev.
  int score = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 16 : 8;
  score += v4 || !policy.family.empty() ? 4 : 2;
  if (!policy.ifname_spec.empty() && !netdev.empty() &&
      net::ifname_matches(policy.ifname_spec, netdev)) {
    score += 1;
  }
  return score;
}

namespace {

// The name of the netdev behind a GID entry ("" when unknown).
std::string netdev_of(const ibv_gid_entry& e) {
  char name[IF_NAMESIZE] = {};
  if (e.ndev_ifindex == 0 || if_indextoname(e.ndev_ifindex, name) == nullptr) return "";
  return name;
}

}  // namespace

Result<std::shared_ptr<Device>> Device::open(const HcaFilter& filter, const GidPolicy& gids) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  // No RDMA subsystem (ENOSYS on this kind of host) or no device: not usable here.
  if (list == nullptr) return std::shared_ptr<Device>();
  ScopeGuard free_list([list] { ibv_free_device_list(list); });
  for (int i = 0; i < n; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    if (name == nullptr) continue;
    bool any_port = false;
    for (int p = 1; p < 256 && !any_port; ++p) any_port = filter.matches(name, p);
    if (!any_port) continue;
    IbvPtr<ibv_context> ctx(ibv_open_device(list[i]));
    if (!ctx) {
      CHORUS_INFO(kNet, "verbs: cannot open {}: {}", name, std::strerror(errno));
      continue;
    }
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx.get(), &attr); rc != 0) {
      CHORUS_INFO(kNet, "verbs: ibv_query_device({}) failed: {}", name, std::strerror(rc));
      continue;
    }
    for (int port = 1; port <= attr.phys_port_cnt; ++port) {
      if (!filter.matches(name, port)) continue;
      ibv_port_attr pa{};
      if (ibv_query_port(ctx.get(), static_cast<uint8_t>(port), &pa) != 0) continue;
      if (pa.state != IBV_PORT_ACTIVE) {
        CHORUS_INFO(kNet, "verbs: {} port {} is not active; skipped", name, port);
        continue;
      }
      if (pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED) pa.link_layer = IBV_LINK_LAYER_INFINIBAND;
      std::shared_ptr<Device> dev(new Device());
      dev->name_ = name;
      dev->port_ = static_cast<uint8_t>(port);
      dev->port_attr_ = pa;
      dev->max_qp_wr_ = static_cast<uint32_t>(attr.max_qp_wr);
      dev->max_cqe_ = attr.max_cqe;
      dev->ctx_ = std::move(ctx);
      CHORUS_RETURN_IF_ERROR(dev->choose_gid(attr.phys_port_cnt, gids));
      dev->pd_.reset(ibv_alloc_pd(dev->ctx_.get()));
      if (!dev->pd_) return system_error(errno, fmt::format("verbs: ibv_alloc_pd on {}", name));
      const int fd = dev->ctx_->async_fd;
      const int flags = fcntl(fd, F_GETFL);
      if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return system_error(errno, "verbs: making the async event fd non-blocking");
      return dev;
    }
  }
  return std::shared_ptr<Device>();
}

Status Device::choose_gid(int ports, const GidPolicy& policy) {
  const int forced = policy.forced_index;
  if (!roce()) {  // InfiniBand: addressed by LID; GID 0 for the record
    gid_index_ = 0;
    gid_type_ = "IB";
    if (ibv_query_gid(ctx_.get(), port_, 0, &gid_) != 0) std::memset(&gid_, 0, sizeof(gid_));
    return ok_status();
  }
  if (forced >= 0) {
    ibv_gid_entry e{};
    if (forced >= port_attr_.gid_tbl_len || forced > static_cast<int>(kMaxGidIndex) ||
        ibv_query_gid_ex(ctx_.get(), port_, static_cast<uint32_t>(forced), &e, 0) != 0 ||
        all_zero(e.gid.raw)) {
      return invalid_argument("verbs: {} port {} has no GID at index {} (NCCL_IB_GID_INDEX / "
                              "CHORUS_IB_GID_INDEX)",
                              name_, port_, forced);
    }
    gid_index_ = forced;
    gid_ = e.gid;
    gid_type_ = gid_type_name(e.gid_type);
    return ok_status();
  }
  int best = 0;
  for (const ibv_gid_entry& e : gid_entries(ctx_.get(), port_, port_attr_.gid_tbl_len, ports)) {
    int score = e.gid_index <= kMaxGidIndex ? gid_score(e, netdev_of(e), policy) : 0;
    if (score > best || (score == best && score > 0 && static_cast<int>(e.gid_index) < gid_index_)) {
      best = score;
      gid_index_ = static_cast<int>(e.gid_index);
      gid_ = e.gid;
      gid_type_ = gid_type_name(e.gid_type);
    }
  }
  if (best == 0) {
    if (!policy.family.empty()) {
      return invalid_argument("verbs: {} port {} (RoCE) has no routable {} GID "
                              "(NCCL_IB_ADDR_FAMILY={}); set NCCL_IB_GID_INDEX to force one",
                              name_, port_, policy.family == "AF_INET" ? "IPv4" : "IPv6",
                              policy.family);
    }
    return make_status(Code::kSystemError,
                       "verbs: {} port {} (RoCE) has no routable GID yet (no IP address on its "
                       "netdev?); set NCCL_IB_GID_INDEX to force one",
                       name_, port_);
  }
  return ok_status();
}

Device::~Device() = default;

std::string Device::describe() const {
  return fmt::format("{} port {}, GID {} {} ({})", name_, port_, gid_index_,
                     gid_to_string(gid_.raw), gid_type_);
}

bool Device::any_failure() {
  const int64_t now = now_coarse_ns();
  if (now >= next_event_check_ns_) {
    next_event_check_ns_ = now + kEventCheckNs;
    read_async_events();
  }
  return !fatal_.empty() || !qp_failures_.empty();
}

std::string Device::failure(uint32_t qpn) {
  if (!any_failure()) return "";
  if (!fatal_.empty()) return fatal_;
  auto it = qp_failures_.find(qpn);
  return it == qp_failures_.end() ? "" : it->second;
}

void Device::read_async_events() {
  ibv_async_event ev{};
  while (ibv_get_async_event(ctx_.get(), &ev) == 0) {
    const char* what = ibv_event_type_str(ev.event_type);
    switch (ev.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        qp_failures_[ev.element.qp->qp_num] = fmt::format("asynchronous event {}", what);
        CHORUS_WARN(kNet, "verbs: {}: {} on QP {:#x}", name_, what, ev.element.qp->qp_num);
        break;
      case IBV_EVENT_CQ_ERR:
      case IBV_EVENT_DEVICE_FATAL:
        fatal_ = fmt::format("asynchronous event {} on {}", what, name_);
        CHORUS_WARN(kNet, "verbs: {}", fatal_);
        break;
      case IBV_EVENT_PORT_ERR:
        if (ev.element.port_num == port_) {
          fatal_ = fmt::format("asynchronous event {} ({} port {} went down)", what, name_, port_);
          CHORUS_WARN(kNet, "verbs: {}", fatal_);
        }
        break;
      default:
        CHORUS_INFO(kNet, "verbs: {}: asynchronous event {}", name_, what);
        break;
    }
    ibv_ack_async_event(&ev);
  }
}

}  // namespace chorus::verbs
