// SPDX-License-Identifier: Apache-2.0
// File: src/core/lifecycle.cc
#include "core/lifecycle.h"

#include <nccl.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/root_server.h"
#include "common/bytes.h"
#include "common/log.h"
#include "common/params.h"
#include "core/group.h"
#include "core/internal_ops.h"

namespace chorus {

namespace {

// Threads running non-blocking setups, joined by destroy/abort.
std::mutex g_setup_threads_mutex;
std::map<const void*, std::thread>& setup_threads() {
  static auto* map = new std::map<const void*, std::thread>();
  return *map;
}

// The child of a split over `members` (parent ranks, in new-rank order), connected through the
// parent. The records go round `exchange` (parent ranks, members among them): a split
// exchanges among all parent ranks, so that every parent rank runs the same internal
// operations on the parent whatever its colour (NCCL_SPLIT_NOCOLOR included); otherwise the
// parent's internal sequence numbers part and its next split fails.
NewComm make_child(const std::shared_ptr<Comm>& parent, std::vector<int> members,
                   std::vector<int> exchange, uint32_t ordinal, int color, const CommConfig& cfg) {
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank()) -
                                  members.begin());
  uint64_t uid = child_uid(parent->uid(), ordinal, color);
  CommIdentity identity{new_rank, static_cast<int>(members.size()), uid,
                        parent->secret().derive(fmt::format("child:{:x}", uid)), cfg};
  auto comm = std::make_shared<Comm>(identity);
  comm->set_timeout_ms(parent->timeout_ms());
  auto connect = [comm, parent, members, exchange]() -> Status {
    return comm->setup([&](const std::string& mine) -> Result<std::vector<std::string>> {
      CHORUS_ASSIGN_OR_RETURN(std::vector<std::string> records,
                              allgather_records(*parent, exchange, mine));
      std::vector<std::string> out;
      for (int r : members)
        out.push_back(std::move(records[std::find(exchange.begin(), exchange.end(), r) -
                                        exchange.begin()]));
      return out;
    });
  };
  return NewComm{comm, connect};
}

}  // namespace

uint64_t child_uid(uint64_t parent, uint32_t ordinal, int color) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (uint64_t v : {static_cast<uint64_t>(ordinal), static_cast<uint64_t>(color) + 1}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

NewComm make_comm(const std::vector<bootstrap::UniqueId>& ids, int rank, int nranks,
                  const CommConfig& cfg) {
  CommIdentity identity{rank, nranks, ids.front().comm_uid, ids.front().secret, cfg};
  auto comm = std::make_shared<Comm>(identity);
  auto connect = [comm, ids, rank, nranks]() -> Status {
    Deadline deadline = comm->cancellable_deadline(params::kBootstrapTimeoutMs.get());
    return comm->setup([&](const std::string& mine) {
      return ids.size() == 1 ? bootstrap::exchange(ids.front(), rank, nranks, mine, deadline)
                             : bootstrap::exchange_scalable(ids, rank, nranks, mine, deadline);
    });
  };
  return NewComm{comm, connect};
}

Result<NewComm> make_split_child(const std::shared_ptr<Comm>& parent, int color, int key,
                                 const CommConfig& cfg) {
  // Every parent rank learns every (color, key); then each color group builds its comm.
  ByteWriter w;
  w.put<int32_t>(color);
  w.put<int32_t>(key);
  std::vector<int> all(parent->nranks());
  for (int r = 0; r < parent->nranks(); ++r) all[r] = r;
  uint32_t ordinal = parent->next_child_ordinal();
  CHORUS_ASSIGN_OR_RETURN(std::vector<std::string> records, allgather_records(*parent, all, w.take()));
  // A NOCOLOR rank still takes part in the exchange of the children's records (see make_child).
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHORUS_RETURN_IF_ERROR(allgather_records(*parent, all, std::string()).status());
    return NewComm{};
  }
  std::vector<std::pair<int, int>> group;  // (key, parent rank)
  for (int r = 0; r < parent->nranks(); ++r) {
    ByteReader rd(records[r]);
    int32_t c = 0, k = 0;
    CHORUS_RETURN_IF_ERROR(rd.get(&c));
    CHORUS_RETURN_IF_ERROR(rd.get(&k));
    if (c == color) group.emplace_back(k, r);
  }
  std::sort(group.begin(), group.end());
  std::vector<int> members;
  for (const auto& [k, r] : group) members.push_back(r);
  return make_child(parent, members, all, ordinal, color, cfg);
}

// The survivors of a shrink cannot count on the parent's connections: a failed comm has
// closed them, and a peer may have died in the middle of a message. So they meet afresh, at
// a rendezvous served by the lowest surviving rank on (a duplicate of) the listening socket
// its parent comm already published, authenticated with a secret derived from the parent's:
// only members of the parent can join, and the excluded ranks are simply never waited for.
Result<NewComm> make_shrink_child(const std::shared_ptr<Comm>& parent,
                                  const std::vector<int>& members, uint32_t ordinal,
                                  const CommConfig& cfg) {
  const int new_rank = static_cast<int>(
      std::find(members.begin(), members.end(), parent->rank()) - members.begin());
  const int nranks = static_cast<int>(members.size());
  bootstrap::UniqueId id;
  id.comm_uid = child_uid(parent->uid(), ordinal, -2);
  id.secret = parent->secret().derive(fmt::format("shrink:{:x}", id.comm_uid));
  id.root = parent->peer(members.front()).rendezvous;
  if (nranks > 1 && new_rank == 0) {
    CHORUS_ASSIGN_OR_RETURN(UniqueFd listener, parent->dup_listener());
    CHORUS_RETURN_IF_ERROR(bootstrap::start_root_server(std::move(listener), id,
                                                        params::kBootstrapTimeoutMs.get()));
  }
  CommIdentity identity{new_rank, nranks, id.comm_uid,
                        id.secret.derive(fmt::format("child:{:x}", id.comm_uid)), cfg};
  auto comm = std::make_shared<Comm>(identity);
  comm->set_timeout_ms(parent->timeout_ms());
  auto connect = [comm, id, new_rank, nranks]() -> Status {
    Deadline deadline = comm->cancellable_deadline(params::kBootstrapTimeoutMs.get());
    return comm->setup([&](const std::string& mine) -> Result<std::vector<std::string>> {
      if (nranks == 1) return std::vector<std::string>{mine};
      return bootstrap::exchange(id, new_rank, nranks, mine, deadline);
    });
  };
  return NewComm{comm, connect};
}

Status start_setup(const NewComm& c, const void* key) {
  auto job = [comm = c.comm, connect = c.connect]() -> Status {
    log::set_thread_rank(comm->rank());
    Status s = connect();
    if (!s.ok()) {
      comm->poison(s);
      comm->set_state(Comm::State::kFailed);
    }
    return s;
  };
  if (in_group()) return submit_init(job);
  if (!c.comm->config().blocking) {
    std::lock_guard<std::mutex> lock(g_setup_threads_mutex);
    setup_threads()[key] = std::thread([job] { (void)job(); });
    return Status(Code::kInProgress, "initializing");
  }
  return job();
}

void join_setup(const void* key) {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(g_setup_threads_mutex);
    auto it = setup_threads().find(key);
    if (it == setup_threads().end()) return;
    t = std::move(it->second);
    setup_threads().erase(it);
  }
  if (t.joinable()) t.join();
}

}  // namespace chorus
