// SPDX-License-Identifier: Apache-2.0
// File: src/ep/transfer.cc
// The two ways EP tokens move (transfer.h): writes into mapped same-host staging areas, and
// grouped point-to-point messages on the communicator.
#include "ep/transfer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/memfd.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chorus/chorus.h>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "api/api_util.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "common/process.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/stream.h"

namespace chorus::ep {

namespace {

constexpr size_t kWordStride = 64;  // one arrival word per cache line
constexpr size_t kPage = 4096;
constexpr int64_t kLivenessNs = 10'000'000;

std::atomic<uint64_t>* arrival_word(void* map, int writer) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(map) +
                                                  static_cast<size_t>(writer) * kWordStride);
}

// Same-host peers are mapped unless the user turned it off or forced a transport that does not
// use shared memory (then that transport is to carry everything, EP tokens included).
bool mapping_allowed() {
  if (params::kEpMap.get() == 0) return false;
  std::string forced = params::kTransport.get();
  std::transform(forced.begin(), forced.end(), forced.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return forced == "auto" || forced == "shm" || forced == "direct";
}

}  // namespace

Status from_nccl(ncclResult_t r, const char* what) {
  return Status(static_cast<Code>(r), fmt::format("{}: {}", what, ncclGetLastError(nullptr)))
      .mark_logged();
}

Status copy_to_self(int rank, const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs) {
  // To itself: the i-th message sent matches the i-th received.
  std::vector<const SendMsg*> self_sends;
  std::vector<const RecvMsg*> self_recvs;
  for (const auto& s : sends)
    if (s.peer == rank && s.bytes > 0) self_sends.push_back(&s);
  for (const auto& r : recvs)
    if (r.peer == rank && r.bytes > 0) self_recvs.push_back(&r);
  if (self_sends.size() != self_recvs.size())
    return internal_error("ep exchange: {} messages to self but {} from self", self_sends.size(),
                          self_recvs.size());
  for (size_t i = 0; i < self_sends.size(); ++i) {
    if (self_sends[i]->bytes != self_recvs[i]->bytes)
      return internal_error("ep exchange: message {} to self of {} bytes, received as {}", i,
                            self_sends[i]->bytes, self_recvs[i]->bytes);
    std::memcpy(self_recvs[i]->data, self_sends[i]->data, self_sends[i]->bytes);
  }
  return Status();
}

bool any_travels(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs, int rank) {
  return std::any_of(sends.begin(), sends.end(), [&](const SendMsg& m) { return travels(m, rank); }) ||
         std::any_of(recvs.begin(), recvs.end(), [&](const RecvMsg& m) { return travels(m, rank); });
}

namespace {

// post_remote, and with `watch`: the batch reports its receives' arrival to it.
Status post(ncclComm_t comm, int rank, const std::vector<SendMsg>& sends,
            const std::vector<RecvMsg>& recvs, cudaStream_t stream,
            std::function<void(size_t)> watch) {
  if (!any_travels(sends, recvs, rank)) return Status();

  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return from_nccl(r, "ncclGroupStart");
  ncclResult_t posted = ncclSuccess;
  if (watch) {
    auto found = api::find_comm(comm);
    Status s = found.ok() ? group_watch_receives(found.value().get(), std::move(watch))
                          : found.take_status();
    if (!s.ok()) {
      (void)ncclGroupEnd();
      return s;
    }
  }
  for (const auto& s : sends) {
    if (!travels(s, rank)) continue;
    posted = ncclSend(s.data, s.bytes, ncclUint8, s.peer, comm, stream);
    if (posted != ncclSuccess) break;
  }
  for (const auto& m : recvs) {
    if (posted != ncclSuccess) break;
    if (!travels(m, rank)) continue;
    posted = ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comm, stream);
  }
  // The group is closed whatever happened, so the communicator leaves group mode.
  Status post_error = posted == ncclSuccess ? Status() : from_nccl(posted, "ncclSend/ncclRecv");
  r = ncclGroupEnd();
  if (!post_error.ok()) return post_error;
  if (r != ncclSuccess) return from_nccl(r, "grouped ncclSend/ncclRecv of EP tokens");
  return Status();
}

}  // namespace

Status post_remote(ncclComm_t comm, int rank, const std::vector<SendMsg>& sends,
                   const std::vector<RecvMsg>& recvs, cudaStream_t stream) {
  return post(comm, rank, sends, recvs, stream, nullptr);
}

Result<std::shared_ptr<const Arrivals>> post_watched(ncclComm_t comm, int rank,
                                                     const std::vector<SendMsg>& sends,
                                                     const std::vector<RecvMsg>& recvs,
                                                     cudaStream_t stream) {
  Stream* s = Stream::from_handle(stream);
  if (s == nullptr) return internal_error("post_watched needs a live host stream");
  auto a = std::make_shared<Arrivals>();
  a->total_ = static_cast<size_t>(
      std::count_if(recvs.begin(), recvs.end(), [&](const RecvMsg& m) { return travels(m, rank); }));
  const std::shared_ptr<Op> before = s->last();
  CHORUS_RETURN_IF_ERROR(post(comm, rank, sends, recvs, stream, [count = a->count_](size_t n) {
    {
      std::lock_guard<std::mutex> lock(count->mutex);
      count->arrived = n;
    }
    count->cv.notify_all();
  }));
  // The batch, if one was posted: the stream's new last op (only this thread queues on it).
  if (s->last() != before) a->op_ = s->last();
  if (a->op_ == nullptr && a->total_ > 0)
    return internal_error("EP: {} receives to watch but no batch was posted", a->total_);
  return std::shared_ptr<const Arrivals>(std::move(a));
}

size_t Arrivals::arrived() const {
  std::lock_guard<std::mutex> lock(count_->mutex);
  return count_->arrived;
}

Status Arrivals::wait(size_t count) const {
  if (count > total_)
    return internal_error("EP: waiting for {} receives of a batch of {}", count, total_);
  if (count == 0) return Status();
  std::unique_lock<std::mutex> lock(count_->mutex);
  while (count_->arrived < count) {
    if (op_->done()) {
      // A batch that completed had every receive reported before it completed.
      if (count_->arrived >= count) break;
      return op_->status().ok()
                 ? internal_error("EP batch done with {} of {} receives reported", count_->arrived,
                                  count)
                 : op_->status();
    }
    // A failure is not signalled: looked at every millisecond.
    count_->cv.wait_for(lock, std::chrono::milliseconds(1));
  }
  return Status();
}

Status Arrivals::wait_done() const { return op_ == nullptr ? Status() : wait_op(op_); }

size_t PeerAreas::header_bytes() const {
  return (static_cast<size_t>(nranks_) * kWordStride + kPage - 1) / kPage * kPage;
}

Result<std::unique_ptr<PeerAreas>> PeerAreas::create(ncclComm_t comm, int rank, int nranks,
                                                     size_t bytes) {
  std::unique_ptr<PeerAreas> a(new PeerAreas(comm, rank, nranks));
  a->n_ = static_cast<size_t>(nranks);
  a->bytes_ = bytes;
  a->map_bytes_ = a->header_bytes() + std::max<size_t>(bytes, 1);
  a->fd_.reset(static_cast<int>(syscall(SYS_memfd_create, "chorus-ep", MFD_CLOEXEC)));
  if (!a->fd_.valid()) return system_error(errno, "memfd_create of the EP buffer");
  if (ftruncate(a->fd_.get(), static_cast<off_t>(a->map_bytes_)) != 0)
    return system_error(errno, fmt::format("sizing the EP buffer's memfd to {} bytes", a->map_bytes_));
  void* map = mmap(nullptr, a->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd_.get(), 0);
  if (map == MAP_FAILED)
    return system_error(errno, fmt::format("mapping the EP buffer's {} bytes", a->map_bytes_));
  a->map_ = map;
  a->local_ = static_cast<char*>(map) + a->header_bytes();
  a->peers_.resize(a->n_);
  a->peers_[static_cast<size_t>(rank)].base = a->local_;
  a->peers_[static_cast<size_t>(rank)].bytes = bytes;
  // Until connect(): every rank sends to every other through the communicator.
  a->maps_.assign(a->n_ * a->n_, 0);
  for (size_t r = 0; r < a->n_; ++r) a->maps_[r * a->n_ + r] = 1;
  a->register_area();
  return a;
}

// The keys are made here, not on the first transfer that needs them: the first dispatch does
// not pay for them (an ibv_reg_mr of the whole area, on the progress thread), and a failure
// (RLIMIT_MEMLOCK, a device refusing the memory) leaves the area unregistered, logged once here,
// instead of each transfer finding no key.
void PeerAreas::register_area() {
  if (bytes_ == 0) return;
  auto found = api::find_comm(comm_);
  if (!found.ok()) {
    CHORUS_WARN(kMoe, "EP buffer of rank {}: staging area not registered: {}", rank_,
                found.status().message());
    return;
  }
  const std::shared_ptr<Comm> c = std::move(found).value();
  std::vector<int> slots;  // the key slots of the transports that carry traffic to a peer
  for (int q = 0; q < nranks_; ++q) {
    const int slot = q == rank_ ? -1 : c->key_slot(q);
    if (slot >= 0 && std::find(slots.begin(), slots.end(), slot) == slots.end())
      slots.push_back(slot);
  }
  if (slots.empty()) {
    CHORUS_INFO(kMoe,
                "EP buffer of rank {}: staging area not registered with the communicator: no "
                "transport to its peers uses registered memory",
                rank_);
    return;
  }
  auto handle = c->register_buffer(local_, bytes_);
  if (!handle.ok()) {
    CHORUS_WARN(kMoe, "EP buffer of rank {}: registering its staging area of {} bytes failed ({}); "
                "its messages go through the transports' buffers",
                rank_, bytes_, handle.status().message());
    return;
  }
  Status keyed;
  {
    auto pin = c->pin(local_, bytes_, "chorusEpBufferCreate");
    if (!pin.ok()) keyed = pin.take_status();
    for (size_t i = 0; keyed.ok() && i < slots.size(); ++i) {
      auto key = pin->key(slots[i]);
      if (!key.ok()) keyed = key.take_status();
    }
  }  // unpinned: the handle keeps the registration
  if (!keyed.ok()) {
    // Unpinned, so this succeeds; said if not.
    Status undone = c->deregister_buffer(*handle);
    CHORUS_WARN(kMoe, "EP buffer of rank {}: staging area of {} bytes not registered: {}{}; its "
                "messages go through the transports' buffers",
                rank_, bytes_, keyed.message(),
                undone.ok() ? "" : fmt::format(" (deregistering it: {})", undone.message()));
    return;
  }
  registered_with_ = c;
  registration_ = *handle;
  CHORUS_INFO(kMoe, "EP buffer of rank {}: staging area of {} bytes registered with the "
              "communicator ({} transport key{})",
              rank_, bytes_, slots.size(), slots.size() == 1 ? "" : "s");
}

PeerAreas::~PeerAreas() {
  // Before the memory goes: a registration left behind would describe pages that are gone.
  if (registration_ != nullptr) {
    if (std::shared_ptr<Comm> c = registered_with_.lock()) {
      Status s = c->deregister_buffer(registration_);
      if (!s.ok())
        CHORUS_WARN(kMoe, "EP buffer of rank {}: deregistering its staging area: {}", rank_,
                    s.message());
    }
  }
  for (size_t r = 0; r < peers_.size(); ++r)
    if (peers_[r].map != nullptr) munmap(peers_[r].map, peers_[r].map_bytes);
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

Result<PeerAreas::Peer> PeerAreas::map_peer(int pid, int fd, size_t bytes) const {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  UniqueFd peer_fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!peer_fd.valid()) return system_error(errno, "opening " + path);
  Peer p;
  p.map_bytes = header_bytes() + std::max<size_t>(bytes, 1);
  struct stat st {};
  if (fstat(peer_fd.get(), &st) != 0) return system_error(errno, "fstat of " + path);
  if (static_cast<size_t>(st.st_size) < p.map_bytes)
    return internal_error("{} holds {} bytes, not the {} its rank announced", path, st.st_size,
                          p.map_bytes);
  p.map = mmap(nullptr, p.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, peer_fd.get(), 0);
  if (p.map == MAP_FAILED) return system_error(errno, "mapping " + path);
  p.base = static_cast<char*>(p.map) + header_bytes();
  p.bytes = bytes;
  p.pid = pid;
  return p;
}

Status PeerAreas::connect() {
  // [host, process token, pid, fd, bytes, mapping allowed] per rank.
  constexpr size_t kWidth = 6;
  const ProcessContext& me = ProcessContext::get();
  const bool allowed = mapping_allowed();
  const int64_t mine[kWidth] = {static_cast<int64_t>(me.host_hash()), static_cast<int64_t>(me.token()),
                                me.pid(), fd_.get(), static_cast<int64_t>(bytes_), allowed ? 1 : 0};
  std::vector<int64_t> all(kWidth * n_);
  ncclResult_t r = ncclAllGather(mine, all.data(), kWidth, ncclInt64, comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "ncclAllGather of the EP buffers' locations");

  std::vector<uint8_t> mapped(n_, 0);
  mapped[idx(rank_)] = 1;
  for (size_t q = 0; q < n_; ++q) {
    const int64_t* row = &all[q * kWidth];
    peers_[q].pid = static_cast<int>(row[2]);
    if (q == idx(rank_) || !allowed || row[5] == 0 || row[0] != mine[0]) continue;
    auto peer = map_peer(static_cast<int>(row[2]), static_cast<int>(row[3]),
                         static_cast<size_t>(row[4]));
    if (!peer.ok()) {  // that pair goes through the communicator
      CHORUS_WARN(kInit, "EP buffer: rank {} cannot map the buffer of same-host rank {}: {}",
                      rank_, q, peer.status().message());
      continue;
    }
    peers_[q] = std::move(peer).value();
    mapped[q] = 1;
  }
  r = ncclAllGather(mapped.data(), maps_.data(), n_, ncclUint8, comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "ncclAllGather of the mapped EP buffers");
  for (size_t q = 0; q < n_; ++q)
    if (q != idx(rank_) && written_by(static_cast<int>(q)) && all[q * kWidth + 1] != mine[1])
      watch_.add(static_cast<int>(q), peers_[q].pid,
                 fmt::format("rank {} (host {}, pid {})", q, me.hostname(), peers_[q].pid));
  // Hosts, by host hash in the order of their lowest rank.
  host_of_.assign(n_, -1);
  index_on_host_.assign(n_, 0);
  hosts_.clear();
  for (size_t q = 0; q < n_; ++q) {
    if (host_of_[q] >= 0) continue;
    const int h = static_cast<int>(hosts_.size());
    hosts_.emplace_back();
    for (size_t j = q; j < n_; ++j) {
      if (all[j * kWidth] != all[q * kWidth]) continue;
      host_of_[j] = h;
      index_on_host_[j] = static_cast<int>(hosts_.back().size());
      hosts_.back().push_back(static_cast<int>(j));
    }
  }
  forwarding_host_.assign(hosts_.size(), 0);
  for (size_t h = 0; h < hosts_.size(); ++h) {
    bool all_mapped = hosts_[h].size() > 1;
    for (int a : hosts_[h])
      for (int b : hosts_[h]) all_mapped = all_mapped && maps_[idx(a) * n_ + idx(b)] != 0;
    forwarding_host_[h] = all_mapped ? 1 : 0;
  }
  size_t into = 0, from = 0;
  for (size_t q = 0; q < n_; ++q) {
    if (q == idx(rank_)) continue;
    into += writes_into(static_cast<int>(q)) ? 1 : 0;
    from += written_by(static_cast<int>(q)) ? 1 : 0;
  }
  CHORUS_INFO(kMoe,
              "EP buffer of rank {}: writes straight into the buffers of {} and is written by {} of "
              "its {} peers (same host{}); the others go through the communicator",
              rank_, into, from, n_ - 1, allowed ? "" : ", mapping off: CHORUS_EP_MAP / CHORUS_TRANSPORT");
  connected_ = true;
  return Status();
}

int PeerAreas::forwarder(int sender, int host) const {
  const auto h = idx(host);
  if (host == host_of(sender) || forwarding_host_[h] == 0) return -1;
  const std::vector<int>& ranks = hosts_[h];
  return ranks[idx(index_on_host_[idx(sender)]) % ranks.size()];
}

void PeerAreas::mark_written(int peer, uint64_t step) {
  void* map = peer == rank_ ? map_ : peers_[idx(peer)].map;
  arrival_word(map, rank_)->store(step, std::memory_order_release);
}

Status PeerAreas::wait_written(uint64_t step, const char* call) {
  int64_t timeout_ms = params::kTimeoutMs.get();
  if (chorusCommGetTimeout(comm_, &timeout_ms) != ncclSuccess) timeout_ms = params::kTimeoutMs.get();
  const int64_t start = now_ns();
  const int64_t spin_ns = params::kSpinUs.get() * 1000;
  const bool yield = ProcessContext::get().oversubscribed();
  int64_t next_liveness = start + kLivenessNs;
  for (size_t q = 0; q < n_; ++q) {
    const int peer = static_cast<int>(q);
    if (peer == rank_ || !written_by(peer)) continue;
    const std::atomic<uint64_t>* word = arrival_word(map_, peer);
    while (word->load(std::memory_order_acquire) < step) {
      const int64_t now = now_ns();
      if (now >= next_liveness) {
        next_liveness = now + kLivenessNs;
        const Status alive = watch_.check_now(std::span<const int>(&peer, 1));
        if (!alive.ok())
          return remote_error("{}: {}; waiting for it to write its part into rank {}'s EP buffer",
                              call, alive.message(), rank_);
        if (now - start > timeout_ms * 1'000'000)
          return remote_error(
              "{}: no progress for {} s (timeout {} ms); waiting for rank {} (pid {}, this "
              "host) to write its tokens into rank {}'s EP buffer",
              call, (now - start) / 1'000'000'000, timeout_ms, peer, peers_[q].pid, rank_);
      }
      if (yield || now - start > spin_ns) {
        if (now - start > 2'000'000)
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        else
          sched_yield();
      }
    }
  }
  return Status();
}

}  // namespace chorus::ep
