// SPDX-License-Identifier: Apache-2.0
#include "transports/direct/direct_transport.h"

#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/process.h"
#include "transports/direct/direct_connection.h"

namespace chorus::direct {

namespace {

// (comm uid, rank) -> node. Weak: a node lives as long as its comm holds it.
std::mutex g_registry_mutex;
std::map<std::pair<uint64_t, int>, std::weak_ptr<DirectNode>>& registry() {
  static auto* map = new std::map<std::pair<uint64_t, int>, std::weak_ptr<DirectNode>>();
  return *map;
}

std::shared_ptr<DirectNode> find_node(uint64_t comm_uid, int rank) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find({comm_uid, rank});
  return it == registry().end() ? nullptr : it->second.lock();
}

}  // namespace

DirectNode::~DirectNode() {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find({comm_uid_, rank_});
  if (it != registry().end() && it->second.expired()) registry().erase(it);
}

std::shared_ptr<Inbox> DirectNode::inbox(int from, int channel) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& e : inboxes_)
    if (e.from == from && e.channel == channel) return e.inbox;
  inboxes_.push_back(Entry{from, channel, std::make_shared<Inbox>()});
  return inboxes_.back().inbox;
}

std::shared_ptr<DirectNode> register_node(uint64_t comm_uid, int rank) {
  auto node = std::make_shared<DirectNode>(comm_uid, rank);
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  registry()[{comm_uid, rank}] = node;
  return node;
}

Result<std::vector<std::vector<std::unique_ptr<Connection>>>> connect_all(const DirectSetup& setup) {
  std::vector<std::vector<std::unique_ptr<Connection>>> out(setup.peers.size());
  for (size_t i = 0; i < setup.peers.size(); ++i) {
    int peer = setup.peers[i];
    // The peer registered before the ranks exchanged their info, so it is normally there at
    // once; tolerate a peer thread that is slow to get there.
    std::shared_ptr<DirectNode> remote;
    while (!(remote = find_node(setup.comm_uid, peer))) {
      if (setup.deadline.expired()) {
        return remote_error("rank {} of this process never registered for direct transfers",
                            peer);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (int ch = 0; ch < setup.channels; ++ch) {
      out[i].push_back(std::make_unique<DirectConnection>(
          setup.rank, peer, ch, remote->inbox(setup.rank, ch), setup.node->inbox(peer, ch)));
    }
  }
  return out;
}

}  // namespace chorus::direct
