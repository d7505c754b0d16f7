// SPDX-License-Identifier: Apache-2.0
// File: src/net/interfaces.cc
// Which local interface address bootstrap and TCP use: getifaddrs(), filtered by
// CHORUS_SOCKET_FAMILY and CHORUS_SOCKET_IFNAME (NCCL_SOCKET_IFNAME syntax).
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/socket.h"
#include "common/params.h"

namespace chorus::net {

namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_link_local_v6(const SockAddr& addr) {
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr.storage);
  return IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr);
}

// 0: non-loopback IPv4, 1: non-loopback IPv6, 2: loopback.
int preference(const Interface& itf) {
  if (itf.loopback) return 2;
  return itf.addr.family() == AF_INET ? 0 : 1;
}

bool family_allowed(int family) {
  const std::string& allowed = params::kSocketFamily.get();
  if (allowed == "AF_INET") return family == AF_INET;
  if (allowed == "AF_INET6") return family == AF_INET6;
  return family == AF_INET || family == AF_INET6;
}

std::string describe(const std::vector<Interface>& list) {
  std::string text;
  for (const auto& itf : list) {
    if (!text.empty()) text += ", ";
    text += fmt::format("{} {}", itf.name, itf.addr.ip_string());
  }
  return text.empty() ? "none" : text;
}

}  // namespace

bool ifname_matches(std::string_view spec, std::string_view name) {
  spec = trim(spec);
  if (spec.empty()) return true;
  bool exclude = spec.front() == '^';
  if (exclude) spec.remove_prefix(1);
  bool exact = !spec.empty() && spec.front() == '=';
  if (exact) spec.remove_prefix(1);
  bool listed = false;
  while (!spec.empty() && !listed) {
    size_t comma = spec.find(',');
    std::string_view item = trim(spec.substr(0, comma));
    // NCCL allows "eth0:port"; the port part does not take part in the name match.
    item = item.substr(0, item.find(':'));
    if (!item.empty()) listed = exact ? name == item : starts_with(name, item);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
  }
  return exclude ? !listed : listed;
}

Result<std::vector<Interface>> list_interfaces(bool include_bridges) {
  ifaddrs* head = nullptr;
  if (getifaddrs(&head) != 0) return system_error(errno, "getifaddrs()");
  std::vector<Interface> out;
  for (ifaddrs* it = head; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || (it->ifa_flags & IFF_UP) == 0) continue;
    int family = it->ifa_addr->sa_family;
    if ((family != AF_INET && family != AF_INET6) || !family_allowed(family)) continue;
    std::string_view name(it->ifa_name);
    if (!include_bridges && (starts_with(name, "docker") || starts_with(name, "virbr"))) continue;
    socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    auto addr = SockAddr::from_sockaddr(it->ifa_addr, len);
    if (!addr.ok()) continue;
    Interface itf{std::string(name), *addr, (it->ifa_flags & IFF_LOOPBACK) != 0};
    if (family == AF_INET6 && !itf.loopback && is_link_local_v6(itf.addr)) continue;
    itf.addr.set_port(0);
    out.push_back(std::move(itf));
  }
  freeifaddrs(head);
  std::stable_sort(out.begin(), out.end(), [](const Interface& a, const Interface& b) {
    return preference(a) < preference(b);
  });
  return out;
}

std::string interface_holding(const SockAddr& addr) {
  auto list = list_interfaces(/*include_bridges=*/true);
  if (!list.ok()) return {};
  const std::string ip = addr.ip_string();
  for (const Interface& itf : *list)
    if (itf.addr.ip_string() == ip) return itf.name;
  return {};
}

bool interface_down(int fd, const std::string& name) {
  ifreq req{};
  if (name.empty() || name.size() >= sizeof(req.ifr_name)) return false;
  std::memcpy(req.ifr_name, name.data(), name.size());
  if (ioctl(fd, SIOCGIFFLAGS, &req) != 0) return false;
  return (req.ifr_flags & IFF_UP) == 0 || (req.ifr_flags & IFF_RUNNING) == 0;
}

Result<Interface> pick_interface() {
  const std::string& spec = params::kSocketIfname.get();
  CHORUS_ASSIGN_OR_RETURN(std::vector<Interface> list, list_interfaces(!spec.empty()));
  for (const auto& itf : list) {
    if (ifname_matches(spec, itf.name)) return itf;
  }
  if (spec.empty()) {
    return make_status(Code::kSystemError,
                       "no network interface with an {} address is up (CHORUS_SOCKET_FAMILY={})",
                       params::kSocketFamily.get() == "ANY" ? "IPv4 or IPv6" : "allowed",
                       params::kSocketFamily.get());
  }
  return invalid_argument(
      "no interface that is up matches CHORUS_SOCKET_IFNAME/NCCL_SOCKET_IFNAME='{}' "
      "(CHORUS_SOCKET_FAMILY={}); interfaces up: {}",
      spec, params::kSocketFamily.get(), describe(list));
}

Result<std::vector<Interface>> pick_rails() {
  const std::string& spec = params::kSocketIfname.get();
  CHORUS_ASSIGN_OR_RETURN(Interface first, pick_interface());
  if (spec.empty()) return std::vector<Interface>{first};
  CHORUS_ASSIGN_OR_RETURN(std::vector<Interface> list, list_interfaces(true));
  std::vector<Interface> rails;
  for (const auto& itf : list) {
    if (!ifname_matches(spec, itf.name) || itf.loopback != first.loopback ||
        itf.addr.family() != first.addr.family())
      continue;
    bool seen = false;
    for (const auto& r : rails) seen |= r.name == itf.name;
    if (!seen) rails.push_back(itf);
  }
  std::sort(rails.begin(), rails.end(),
            [](const Interface& a, const Interface& b) { return a.name < b.name; });
  return rails;
}

}  // namespace chorus::net
