// SPDX-License-Identifier: Apache-2.0
#include "transports/registry.h"

#include <fmt/format.h>
#include <strings.h>

#include <cstring>
#include <mutex>

#include "common/log.h"

namespace chorus {

// Defined by the generated transports/builtin.cc.
void register_builtin_transports();

namespace {

std::vector<const TransportDesc*>& table() {
  static std::vector<const TransportDesc*> list;
  return list;
}

const TransportDesc* lookup(std::string_view name) {
  for (const TransportDesc* d : table())
    if (name.size() == std::strlen(d->name) && strncasecmp(d->name, name.data(), name.size()) == 0)
      return d;
  return nullptr;
}

}  // namespace

std::string EndpointInfo::describe() const {
  return fmt::format("rank {} (host {}, pid {})", rank, hostname, pid);
}

void register_transport(const TransportDesc* desc) {
  auto& list = table();
  if (list.size() >= kMaxTransports || lookup(desc->name) != nullptr) {
    CHORUS_WARN(kInit, "transport '{}' not registered: duplicate name or more than {} transports",
                desc->name, kMaxTransports);
    return;
  }
  list.push_back(desc);
}

const std::vector<const TransportDesc*>& transports() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_transports(); });
  return table();
}

const TransportDesc* find_transport(std::string_view name) {
  transports();
  return lookup(name);
}

}  // namespace chorus
