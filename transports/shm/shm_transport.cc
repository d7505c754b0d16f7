// SPDX-License-Identifier: Apache-2.0
// File: transports/shm/shm_transport.cc
// Segment creation and layout, mapping of the peers' segments and doorbells, and construction
// of the connections.
#include "transports/shm/shm_transport.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "common/log.h"
#include "common/process.h"
#include "transports/shm/shm_connection.h"
#include "transports/small_box.h"

namespace chorus::shm {

namespace {

// Linux 6.3+: the memfd can never be made executable. Older kernels reject it (EINVAL).
constexpr unsigned kMfdNoexecSeal = 0x0008U;

constexpr uint64_t kSegmentMagic = 0x3147455348534843ull;  // "CHSHSEG1"
// 2: FifoControl has three lines; 3: boxes; 4: 32-byte box slot headers; 5: 64 box slots,
// 16 payload areas
constexpr uint32_t kSegmentVersion = 5;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kMinFifoBytes = 4 << 10;
constexpr size_t kMaxFifoBytes = size_t{1} << 30;
constexpr int kMaxChannels = 64;
constexpr size_t kMaxLocalRanks = 4096;

// Offset 0 of every segment; wire layout.
struct SegmentHeader {
  // Stored last by the owner (release), after this header and every FifoControl are
  // initialised; a peer loads it (acquire) before reading anything else in the segment.
  std::atomic<uint64_t> magic{0};
  uint32_t version = 0;
  uint32_t num_local_ranks = 0;
  uint32_t channels = 0;
  uint32_t owner_local_index = 0;
  int32_t owner_rank = -1;
  int32_t owner_pid = -1;
  uint64_t fifo_bytes = 0;
  uint64_t total_bytes = 0;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);

// [SegmentHeader, padded to 64][FIFO 0][FIFO 1]...[box 0][box 1]...; FIFO s*channels+c
// carries sender s's channel c and is a FifoControl followed by fifo_bytes of ring; box s is
// sender s's small-message box (transports/small_box.h). The owner's own FIFOs and box are
// never touched, so they cost address space only.
struct Layout {
  size_t num_local_ranks;
  size_t channels;
  size_t fifo_bytes;

  size_t stride() const { return sizeof(FifoControl) + fifo_bytes; }
  size_t num_fifos() const { return num_local_ranks * channels; }
  size_t boxes_offset() const { return kHeaderBytes + num_fifos() * stride(); }
  size_t total_bytes() const {
    return boxes_offset() + num_local_ranks * SmallBox::region_bytes();
  }
  void* box(void* base, size_t sender) const {
    return static_cast<std::byte*>(base) + boxes_offset() + sender * SmallBox::region_bytes();
  }
  FifoRef fifo(void* base, size_t sender, size_t channel) const {
    auto* p =
        static_cast<std::byte*>(base) + kHeaderBytes + (sender * channels + channel) * stride();
    return FifoRef{reinterpret_cast<FifoControl*>(p), p + sizeof(FifoControl), fifo_bytes};
  }
};

std::string describe(const Layout& l) {
  return fmt::format("{} local ranks, {} channels, {}-byte FIFOs", l.num_local_ranks, l.channels,
                     l.fifo_bytes);
}

// The checked setup: local indices resolved.
struct Plan {
  Layout layout;
  size_t self_index;
  std::vector<size_t> peer_index;  // [i] = local index of setup.peers[i]
};

Status check_peer(const ShmSetup& s, const ShmPeer& p, std::vector<bool>* seen, size_t* index) {
  auto it = std::lower_bound(s.local_ranks.begin(), s.local_ranks.end(), p.rank);
  if (it == s.local_ranks.end() || *it != p.rank || p.rank == s.rank) {
    return invalid_argument("shm setup of rank {}: peer rank {} is not another local rank", s.rank,
                            p.rank);
  }
  *index = static_cast<size_t>(it - s.local_ranks.begin());
  if ((*seen)[*index]) {
    return invalid_argument("shm setup of rank {}: peer rank {} is listed twice", s.rank, p.rank);
  }
  (*seen)[*index] = true;
  if (p.pid <= 0 || p.shm_fd < 0) {
    return invalid_argument("shm setup of rank {}: peer rank {} has pid {} and segment fd {}",
                            s.rank, p.rank, p.pid, p.shm_fd);
  }
  return Status();
}

Result<Plan> make_plan(const ShmSetup& s) {
  size_t fifo_bytes = s.fifo_bytes;
  if (fifo_bytes == 0) {
    fifo_bytes = static_cast<size_t>(params::kShmFifoBytes.get()) & ~(kFifoAlign - 1);
  }
  if (fifo_bytes % kFifoAlign != 0 || fifo_bytes < kMinFifoBytes || fifo_bytes > kMaxFifoBytes) {
    return invalid_argument(
        "shm setup of rank {}: FIFO bytes (CHORUS_SHM_FIFO_BYTES) {} is not a multiple of {} "
        "in [{}, {}]",
        s.rank, fifo_bytes, kFifoAlign, kMinFifoBytes, kMaxFifoBytes);
  }
  if (s.channels < 1 || s.channels > kMaxChannels || s.segment == nullptr || s.segment->fd() < 0) {
    return invalid_argument("shm setup of rank {}: {} channels (1..{}), segment {}", s.rank,
                            s.channels, kMaxChannels, s.segment ? "closed" : "missing");
  }
  const std::vector<int>& ranks = s.local_ranks;
  auto self = std::lower_bound(ranks.begin(), ranks.end(), s.rank);
  if (ranks.size() > kMaxLocalRanks ||
      std::adjacent_find(ranks.begin(), ranks.end(), std::greater_equal<int>()) != ranks.end() ||
      self == ranks.end() || *self != s.rank || s.peers.size() + 1 != ranks.size()) {
    return invalid_argument(
        "shm setup of rank {}: local ranks must be sorted, unique, at most {}, include this rank "
        "and be the peers ({}) plus this rank; got {}",
        s.rank, kMaxLocalRanks, s.peers.size(), fmt::join(ranks, ","));
  }
  Plan plan{Layout{ranks.size(), static_cast<size_t>(s.channels), fifo_bytes},
            static_cast<size_t>(self - ranks.begin()), std::vector<size_t>(s.peers.size())};
  std::vector<bool> seen(ranks.size());
  for (size_t i = 0; i < s.peers.size(); ++i) {
    CHORUS_RETURN_IF_ERROR(check_peer(s, s.peers[i], &seen, &plan.peer_index[i]));
  }
  return plan;
}

// Sizes and initialises our segment; the magic is published last.
Result<std::shared_ptr<Mapping>> init_own_segment(const ShmSetup& setup, const Plan& plan) {
  const Layout& layout = plan.layout;
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> mapping,
                          setup.segment->size_and_map(layout.total_bytes()));
  for (size_t s = 0; s < layout.num_local_ranks; ++s) {
    for (size_t c = 0; c < layout.channels; ++c) {
      new (layout.fifo(mapping->get(), s, c).control) FifoControl();
    }
    SmallBox::init(layout.box(mapping->get(), s));
  }
  auto* header = new (mapping->get()) SegmentHeader();
  header->version = kSegmentVersion;
  header->num_local_ranks = static_cast<uint32_t>(layout.num_local_ranks);
  header->channels = static_cast<uint32_t>(layout.channels);
  header->owner_local_index = static_cast<uint32_t>(plan.self_index);
  header->owner_rank = setup.rank;
  header->owner_pid = static_cast<int32_t>(getpid());
  header->fifo_bytes = layout.fifo_bytes;
  header->total_bytes = layout.total_bytes();
  // Release: pairs with the acquire load in wait_for_header() of every peer.
  header->magic.store(kSegmentMagic, std::memory_order_release);
  return mapping;
}

void backoff(int64_t* sleep_us) {
  std::this_thread::sleep_for(std::chrono::microseconds(*sleep_us));
  *sleep_us = std::min<int64_t>(*sleep_us * 2, 1000);
}

// Waits until the open file `fd` is sized: its owner sizes it once, from 0 to its final size.
Status wait_for_size(int fd, size_t bytes, bool exact, const std::string& what,
                     const std::string& path, Deadline deadline) {
  for (int64_t sleep_us = 20;; backoff(&sleep_us)) {
    struct stat st {};
    if (fstat(fd, &st) != 0) return system_error(errno, fmt::format("{}: fstat {}", what, path));
    if (!S_ISREG(st.st_mode)) {
      return invalid_argument("{}: {} is not a shared-memory file (wrong fd published?)", what,
                              path);
    }
    auto size = static_cast<size_t>(st.st_size);
    if (size != 0 && (exact ? size != bytes : size < bytes)) {
      return invalid_usage(
          "{}: it has {} bytes but {} are expected (do the ranks agree on CHORUS_NCHANNELS, "
          "CHORUS_SHM_FIFO_BYTES and the set of local ranks?)",
          what, size, bytes);
    }
    if (size != 0) return Status();
    if (deadline.expired()) {
      return remote_error("{}: its owner did not size it before the deadline", what);
    }
  }
}

// Opens /proc/<pid>/fd/<fd>, waits until it is sized and maps its first `bytes`. The fd is
// closed on return; the mapping keeps the memory alive.
Result<Mapping> map_peer_file(const ShmPeer& peer, int fd, const char* what, size_t bytes,
                              bool exact, Deadline deadline) {
  std::string prefix =
      fmt::format("cannot map the {} of rank {} (pid {})", what, peer.rank, peer.pid);
  std::string path = fmt::format("/proc/{}/fd/{}", peer.pid, fd);
  UniqueFd file(open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY));
  if (!file.valid()) return system_error(errno, fmt::format("{}: open {}", prefix, path));
  CHORUS_RETURN_IF_ERROR(wait_for_size(file.get(), bytes, exact, prefix, path, deadline));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.get(), 0);
  if (p == MAP_FAILED) {
    return system_error(errno, fmt::format("{}: mmap {} bytes of {}", prefix, bytes, path));
  }
  return Mapping(p, bytes);
}

// Waits for the owner to publish the header, then checks it against our layout.
Status wait_for_header(const ShmPeer& peer, const Plan& plan, size_t peer_index, void* base,
                       Deadline deadline) {
  const auto* header = static_cast<const SegmentHeader*>(base);
  std::string prefix =
      fmt::format("the shared-memory segment of rank {} (pid {})", peer.rank, peer.pid);
  for (int64_t sleep_us = 20;; backoff(&sleep_us)) {
    // Acquire: pairs with the owner's release store in init_own_segment().
    uint64_t magic = header->magic.load(std::memory_order_acquire);
    if (magic == kSegmentMagic) break;
    if (magic != 0) {
      return invalid_argument("{} is not a Chorus segment (magic {:#x})", prefix, magic);
    }
    if (deadline.expired()) {
      return remote_error("{} was not initialised before the deadline", prefix);
    }
  }
  const Layout& want = plan.layout;
  Layout got{header->num_local_ranks, header->channels, header->fifo_bytes};
  if (header->version != kSegmentVersion || got.num_local_ranks != want.num_local_ranks ||
      got.channels != want.channels || got.fifo_bytes != want.fifo_bytes ||
      header->total_bytes != want.total_bytes()) {
    return invalid_usage("{} has version {} and layout {}, but this rank expects version {} and {}",
                         prefix, header->version, describe(got), kSegmentVersion, describe(want));
  }
  if (header->owner_rank != peer.rank || header->owner_pid != peer.pid ||
      header->owner_local_index != peer_index) {
    return invalid_usage("{} belongs to rank {} (pid {}, local index {}), not to local index {}",
                         prefix, header->owner_rank, header->owner_pid, header->owner_local_index,
                         peer_index);
  }
  return Status();
}

Result<std::shared_ptr<Mapping>> map_peer_segment(const ShmPeer& peer, const Plan& plan,
                                                  size_t peer_index, Deadline deadline) {
  CHORUS_ASSIGN_OR_RETURN(Mapping mapping,
                          map_peer_file(peer, peer.shm_fd, "shared-memory segment",
                                        plan.layout.total_bytes(), true, deadline));
  CHORUS_RETURN_IF_ERROR(wait_for_header(peer, plan, peer_index, mapping.get(), deadline));
  return std::make_shared<Mapping>(std::move(mapping));
}

struct PeerDoorbell {
  DoorbellWord* word = nullptr;
  std::shared_ptr<Mapping> mapping;  // null for our own process's doorbell
};

// Doorbells mapped so far, by (pid, fd): ranks of one process share theirs.
class DoorbellCache {
 public:
  Result<PeerDoorbell> get(const ShmPeer& peer, Deadline deadline) {
    if (peer.pid == ProcessContext::get().pid()) {
      return PeerDoorbell{ProcessContext::get().doorbell(), nullptr};
    }
    for (const auto& [pid, fd, bell] : entries_) {
      if (pid == peer.pid && fd == peer.doorbell_fd) return bell;
    }
    if (peer.doorbell_fd < 0) {
      return invalid_argument("rank {} (pid {}) has no shareable process doorbell", peer.rank,
                              peer.pid);
    }
    CHORUS_ASSIGN_OR_RETURN(Mapping mapping,
                            map_peer_file(peer, peer.doorbell_fd, "process doorbell",
                                          sizeof(DoorbellWord), false, deadline));
    auto shared = std::make_shared<Mapping>(std::move(mapping));
    PeerDoorbell bell{static_cast<DoorbellWord*>(shared->get()), shared};
    entries_.push_back({peer.pid, peer.doorbell_fd, bell});
    return bell;
  }

 private:
  struct Entry {
    int pid;
    int fd;
    PeerDoorbell bell;
  };
  std::vector<Entry> entries_;
};

std::vector<std::unique_ptr<Connection>> make_connections(const ShmSetup& setup, const Plan& plan,
                                                          size_t i,
                                                          const std::shared_ptr<Mapping>& own,
                                                          const std::shared_ptr<Mapping>& theirs,
                                                          const PeerDoorbell& bell) {
  const ShmPeer& peer = setup.peers[i];
  std::vector<std::unique_ptr<Connection>> channels;
  for (size_t c = 0; c < plan.layout.channels; ++c) {
    ShmConnectionConfig config;
    config.self_rank = setup.rank;
    config.peer_rank = peer.rank;
    config.peer_pid = peer.pid;
    config.channel = static_cast<int>(c);
    config.send_fifo = plan.layout.fifo(theirs->get(), plan.self_index, c);
    config.recv_fifo = plan.layout.fifo(own->get(), plan.peer_index[i], c);
    config.peer_doorbell = bell.word;
    if (c == 0) {
      config.send_box = plan.layout.box(theirs->get(), plan.self_index);
      config.recv_box = plan.layout.box(own->get(), plan.peer_index[i]);
    }
    config.keep_alive = {own, theirs};
    if (bell.mapping) config.keep_alive.push_back(bell.mapping);
    channels.push_back(std::make_unique<ShmConnection>(std::move(config)));
  }
  return channels;
}

}  // namespace

Result<std::unique_ptr<ShmSegment>> ShmSegment::create() {
  int fd = memfd_create("chorus-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING | kMfdNoexecSeal);
  if (fd < 0 && errno == EINVAL) fd = memfd_create("chorus-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return system_error(errno, "cannot create the shared-memory segment: memfd_create");
  UniqueFd owned(fd);
  if (fchmod(fd, 0600) != 0) {
    return system_error(errno, "cannot create the shared-memory segment: fchmod 0600");
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(std::move(owned)));
}

Result<std::shared_ptr<Mapping>> ShmSegment::size_and_map(size_t bytes) {
  if (sized_) return invalid_usage("the shared-memory segment is already sized");
  sized_ = true;
  std::string what = fmt::format("cannot size the shared-memory segment ({} bytes)", bytes);
  if (ftruncate(fd_.get(), static_cast<off_t>(bytes)) != 0) {
    return system_error(errno, what + ": ftruncate");
  }
  if (fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return system_error(errno, what + ": seal");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) return system_error(errno, what + ": mmap");
  return std::make_shared<Mapping>(p, bytes);
}

size_t segment_bytes(size_t num_local_ranks, size_t channels, size_t fifo_bytes) {
  return Layout{num_local_ranks, channels, fifo_bytes}.total_bytes();
}

Result<ShmConnections> connect_all(const ShmSetup& setup) {
  CHORUS_ASSIGN_OR_RETURN(Plan plan, make_plan(setup));
  CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> own, init_own_segment(setup, plan));
  ShmConnections conns;
  DoorbellCache doorbells;
  for (size_t i = 0; i < setup.peers.size(); ++i) {
    const ShmPeer& peer = setup.peers[i];
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> theirs,
                            map_peer_segment(peer, plan, plan.peer_index[i], setup.deadline));
    CHORUS_ASSIGN_OR_RETURN(PeerDoorbell bell, doorbells.get(peer, setup.deadline));
    conns.push_back(make_connections(setup, plan, i, own, theirs, bell));
  }
  CHORUS_INFO(kShm, "rank {}: shared memory to {} local peers, segment of {} bytes ({})",
              setup.rank, setup.peers.size(), plan.layout.total_bytes(), describe(plan.layout));
  return Result<ShmConnections>(std::move(conns));
}

}  // namespace chorus::shm
