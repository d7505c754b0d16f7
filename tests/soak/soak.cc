// SPDX-License-Identifier: Apache-2.0
// File: tests/soak/soak.cc
// chorus_soak: runs thousands of randomly mixed, exactly checked collectives on several
// communicators at once, with splits, initialisations and destroys in between, and fails if
// the process's descriptors, threads, memory or /dev/shm entries grow. Public API only
// (nccl.h, chorus/stream.h, chorus/launch.h); inputs and expected outputs come from
// bench/common's verifiable generator. See tests/soak/README.md.
//
//   chorus_soak [--ranks N] [options]                 N ranks as threads of this process
//   chorus-run -n N chorus_soak [options]             one rank per process (CHORUS_UNIQUE_ID set)
//   chorus-run -n P chorus_soak --ranks-per-proc K    P processes of K rank threads each
//
// Each rank runs --lanes threads ("lanes"), each owning its own communicators:
//   lane 0        the world comm, NULL stream; single calls, groups of collectives, send/recv
//                 groups; every --init-every epochs a new comm by ncclCommInitRank (its unique
//                 id broadcast over the world comm; sometimes non-blocking, permuted ranks),
//                 used, then destroyed / finalized+destroyed / aborted.
//   lane 1, 3..   a comm split from the world; each epoch splits it again (random colours,
//                 keys, NCCL_SPLIT_NOCOLOR), sometimes splits the child too, runs calls on all
//                 of them (also one group spanning two comms), then destroys or aborts them.
//   lane 2, 4..   a comm split from the world with a host stream; each epoch makes two more
//                 splits in one group, each with its own new stream, queues batches of calls
//                 (and host functions) on the three streams, synchronizes and checks them all.
// Every rank derives the same sequence from (seed, lane, epoch), so all ranks issue the same
// calls; each call's receive buffer is poisoned before and checked element by element after,
// guard bytes around every buffer must stay intact, and out-of-place send buffers unchanged.
#include <chorus/launch.h>
#include <chorus/stream.h>
#include <dirent.h>
#include <fmt/format.h>
#include <malloc.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/verifiable.h"

namespace {

using chorus::verify::Coll;
using chorus::verify::Verifier;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  double seconds = 30;        // stop voting after this long (0: no time limit)
  uint64_t max_ops = 0;       // or after this many calls by the process (0: no limit)
  int ranks = 4;              // ranks as threads (not launched)
  int ranks_per_proc = 1;     // launched: rank threads per process
  int lanes = 3;              // communicator-owning threads per rank
  std::string kinds;          // what each lane does: w (new comms), s (splits), t (streams)
  int warmup = 4;             // epochs per lane before the baseline resource sample
  int checkpoint_every = 2;   // epochs between resource samples (and stop votes)
  int ops_per_epoch = 12;     // calls per lane epoch
  size_t max_bytes = 1 << 20; // largest buffer of a call
  uint64_t seed = 0;          // 0: drawn by rank 0 and broadcast
  int init_every = 3;         // lane 0: a new comm by ncclCommInitRank every this many epochs
  double stall_seconds = 120; // the watchdog's limit for one lane step
  // Tolerances of the resource check (README.md says why these).
  int64_t rss_tolerance_kb = 16 * 1024;
  int64_t heap_tolerance_kb = 4 * 1024;
  bool verbose = false;
};

[[noreturn]] void usage(const char* self) {
  fmt::print(stderr,
             "usage: {} [--seconds S] [--ops N] [--ranks N] [--ranks-per-proc K] [--lanes L]\n"
             "          [--kinds LANEKINDS (default wst: w new comms, s splits, t streams)]\n"
             "          [--warmup EPOCHS] [--checkpoint-every EPOCHS] [--ops-per-epoch N]\n"
             "          [--max-bytes B] [--seed S]\n"
             "          [--init-every EPOCHS] [--stall-seconds S] [--rss-tolerance-mib M]\n"
             "          [--heap-tolerance-mib M] [--verbose]\n"
             "Started by chorus-run (CHORUS_UNIQUE_ID set): one rank (or --ranks-per-proc) per\n"
             "process; otherwise --ranks ranks as threads of this process.\n",
             self);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (a == "--seconds") o.seconds = std::atof(next());
    else if (a == "--ops") o.max_ops = std::strtoull(next(), nullptr, 0);
    else if (a == "--ranks") o.ranks = std::atoi(next());
    else if (a == "--ranks-per-proc") o.ranks_per_proc = std::atoi(next());
    else if (a == "--lanes") o.lanes = std::atoi(next());
    else if (a == "--kinds") o.kinds = next();
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--checkpoint-every") o.checkpoint_every = std::atoi(next());
    else if (a == "--ops-per-epoch") o.ops_per_epoch = std::atoi(next());
    else if (a == "--max-bytes") o.max_bytes = std::strtoull(next(), nullptr, 0);
    else if (a == "--seed") o.seed = std::strtoull(next(), nullptr, 0);
    else if (a == "--init-every") o.init_every = std::atoi(next());
    else if (a == "--stall-seconds") o.stall_seconds = std::atof(next());
    else if (a == "--rss-tolerance-mib") o.rss_tolerance_kb = std::atoll(next()) * 1024;
    else if (a == "--heap-tolerance-mib") o.heap_tolerance_kb = std::atoll(next()) * 1024;
    else if (a == "--verbose" || a == "-v") o.verbose = true;
    else usage(argv[0]);
  }
  if (o.kinds.empty()) {
    // Lane 0 (the world comm) makes new comms; then splits and streams alternate.
    for (int l = 0; l < o.lanes; ++l) o.kinds += l == 0 ? 'w' : l % 2 == 1 ? 's' : 't';
  }
  o.lanes = static_cast<int>(o.kinds.size());
  if (o.kinds.find_first_not_of("wst") != std::string::npos) usage(argv[0]);
  if (o.ranks < 1 || o.ranks > 8 || o.ranks_per_proc < 1 || o.lanes < 1 || o.warmup < 1 || o.checkpoint_every < 1 ||
      o.ops_per_epoch < 1 || o.init_every < 1 || (o.seconds <= 0 && o.max_ops == 0))
    usage(argv[0]);
  return o;
}

// ---------------------------------------------------------------------------------------------
// Failure: print what, where and how to reproduce, then end the process (other ranks would
// wait for this one forever; chorus-run stops them).

std::mutex g_print_mutex;
std::atomic<uint64_t> g_seed{0};  // for messages
std::atomic<bool> g_failed{false};

[[noreturn]] void fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(g_print_mutex);
    g_failed = true;
    fmt::print(stderr, "soak: FAIL (seed {}): {}\n", g_seed.load(), what);
    std::fflush(stderr);
    std::fflush(stdout);
  }
  std::_Exit(1);
}

void check_nccl(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  fail(fmt::format("{} returned {} ({}): {}", what, static_cast<int>(r), ncclGetErrorString(r),
                   ncclGetLastError(nullptr)));
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness shared by all ranks: splitmix64, no std:: distributions.

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  uint64_t state;
  explicit Rng(std::initializer_list<uint64_t> keys) : state(0x5eed) {
    for (uint64_t k : keys) state = splitmix(state ^ k);
  }
  uint64_t next() { return state = splitmix(state); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool chance(int percent) { return below(100) < static_cast<uint64_t>(percent); }
};

// ---------------------------------------------------------------------------------------------
// Resources of this process.

struct Resources {
  int64_t fds = 0, sockets = 0, eventfds = 0, memfds = 0, pipes = 0;
  int64_t threads = 0, rss_kb = 0, anon_kb = 0, shmem_kb = 0, heap_kb = 0, maps = 0;
  int64_t shm_entries = 0, shm_chorus = 0;
};

int64_t cached_bytes();

Resources sample_once() {
  Resources r;
  // Return the allocator's free pages first, so that RSS counts memory in use (glibc keeps
  // freed memory in each thread's arena otherwise, and RSS would wander with fragmentation).
  malloc_trim(0);
  if (DIR* d = opendir("/proc/self/fd")) {
    int self = dirfd(d);
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      int fd = std::atoi(e->d_name);
      if (fd == self) continue;
      char target[256];
      ssize_t n = readlinkat(self, e->d_name, target, sizeof(target) - 1);
      if (n < 0) continue;  // closed meanwhile
      target[n] = 0;
      ++r.fds;
      if (std::strncmp(target, "socket:", 7) == 0) ++r.sockets;
      else if (std::strstr(target, "eventfd")) ++r.eventfds;
      else if (std::strncmp(target, "/memfd:", 7) == 0) ++r.memfds;
      else if (std::strncmp(target, "pipe:", 5) == 0) ++r.pipes;
    }
    closedir(d);
  }
  const int64_t cached = cached_bytes();
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) r.threads = std::atoll(line.c_str() + 8);
    if (line.rfind("VmRSS:", 0) == 0) r.rss_kb = std::atoll(line.c_str() + 6);
    if (line.rfind("RssAnon:", 0) == 0) r.anon_kb = std::atoll(line.c_str() + 8) - cached / 1024;
    if (line.rfind("RssShmem:", 0) == 0) r.shmem_kb = std::atoll(line.c_str() + 9);
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) ++r.maps;
  struct mallinfo2 mi = mallinfo2();
  r.heap_kb = (static_cast<int64_t>(mi.uordblks + mi.hblkhd) - cached) / 1024;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      ++r.shm_entries;
      if (std::strstr(e->d_name, "chorus")) ++r.shm_chorus;
    }
    closedir(d);
  }
  return r;
}

// The minimum of each count over `ms` (threads and descriptors of finished work may take a
// moment to go: a bootstrap root thread exits after serving its last rank).
Resources sample(int ms) {
  Resources best = sample_once();
  for (auto end = Clock::now() + std::chrono::milliseconds(ms); Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Resources r = sample_once();
    best.fds = std::min(best.fds, r.fds);
    best.sockets = std::min(best.sockets, r.sockets);
    best.eventfds = std::min(best.eventfds, r.eventfds);
    best.memfds = std::min(best.memfds, r.memfds);
    best.pipes = std::min(best.pipes, r.pipes);
    best.threads = std::min(best.threads, r.threads);
    best.rss_kb = std::min(best.rss_kb, r.rss_kb);
    best.anon_kb = std::min(best.anon_kb, r.anon_kb);
    best.shmem_kb = std::min(best.shmem_kb, r.shmem_kb);
    best.heap_kb = std::min(best.heap_kb, r.heap_kb);
    best.maps = std::min(best.maps, r.maps);
    best.shm_entries = std::min(best.shm_entries, r.shm_entries);
    best.shm_chorus = std::min(best.shm_chorus, r.shm_chorus);
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Buffers with guard bytes on both sides, at an offset of 0..7 elements from an aligned
// allocation (so both aligned and unaligned addresses are exercised).

constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xE7;
constexpr unsigned char kPoisonByte = 0x5B;

// Each lane thread keeps the blocks its calls freed (by power-of-two size class, a few per
// class) and reuses them: a fresh 1 MiB block per call costs page faults (and, with the
// trimming allocator set up in main(), a munmap). What the caches hold is subtracted from the
// heap and RSS figures: it is the soak's, and it fills up as batches happen to need more.
class BlockCache {
 public:
  static constexpr int kClasses = 32;
  static constexpr size_t kPerClass = 4;
  static constexpr size_t kSlack = 256;  // room for the guards and the offset
  static size_t block_bytes(int c) { return (size_t{1} << c) + kSlack; }
  static int size_class(size_t bytes) {
    int c = 6;
    while (block_bytes(c) < bytes) ++c;
    return c;
  }
  unsigned char* take(int c) {
    auto& list = free_[c];
    if (list.empty()) {
      // Touched whole, so that a cached block is resident whole and can be subtracted from RSS.
      auto* p = new unsigned char[block_bytes(c)];
      std::memset(p, 0, block_bytes(c));
      return p;
    }
    unsigned char* p = list.back();
    list.pop_back();
    g_cached_bytes -= static_cast<int64_t>(block_bytes(c));
    return p;
  }
  void give(int c, unsigned char* p) {
    if (free_[c].size() < kPerClass) {
      free_[c].push_back(p);
      g_cached_bytes += static_cast<int64_t>(block_bytes(c));
    } else {
      delete[] p;
    }
  }
  ~BlockCache() {
    for (int c = 0; c < kClasses; ++c) {
      for (unsigned char* p : free_[c]) delete[] p;
      g_cached_bytes -= static_cast<int64_t>(free_[c].size() * block_bytes(c));
    }
  }
  // Bytes held by every thread's cache (not counted as the process's heap in use).
  static inline std::atomic<int64_t> g_cached_bytes{0};

 private:
  std::vector<unsigned char*> free_[kClasses];
};
thread_local BlockCache t_blocks;
int64_t cached_bytes() { return BlockCache::g_cached_bytes.load(); }

struct GiveBack {
  int size_class = 0;
  void operator()(unsigned char* p) const { t_blocks.give(size_class, p); }
};

struct Buffer {
  std::unique_ptr<unsigned char[], GiveBack> mem;
  size_t bytes = 0, lead = 0;
  unsigned char* data() const { return mem.get() + lead; }
  void allocate(size_t n, size_t offset, unsigned char fill) {
    bytes = n;
    lead = kGuard + offset;
    size_t total = lead + n + kGuard;
    int c = BlockCache::size_class(total);
    mem = std::unique_ptr<unsigned char[], GiveBack>(t_blocks.take(c), GiveBack{c});
    std::memset(mem.get(), kGuardByte, lead);
    std::memset(mem.get() + lead, fill, n);
    std::memset(mem.get() + lead + n, kGuardByte, kGuard);
  }
  bool guards_intact() const {
    if (!mem) return true;
    for (size_t i = 0; i < lead; ++i)
      if (mem[i] != kGuardByte) return false;
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[lead + bytes + i] != kGuardByte) return false;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Statistics, summed over lanes and ranks at the end.

enum Stat {
  kCalls,        // collective calls, one per rank (a send/recv group counts once)
  kCollectives,  // calls counted once per communicator (by its rank 0)
  kBytes,        // receive-buffer bytes written by the calls, summed over ranks
  kGroups,       // ncclGroupStart/End pairs with several calls
  kCrossGroups,  // groups spanning two communicators
  kP2P,          // send/recv groups
  kSplits,       // ncclCommSplit calls (a NOCOLOR rank's call included)
  kInits,        // ncclCommInitRank(Config) calls (world excluded)
  kNonBlocking,  // non-blocking inits and splits
  kDestroys,     // ncclCommDestroy
  kFinalizes,    // ncclCommFinalize
  kAborts,       // ncclCommAbort
  kStreams,      // chorusStreamCreate
  kHostFns,      // chorusLaunchHostFunc run
  kEpochs,       // lane epochs
  kNumStats
};

struct Stats {
  uint64_t v[kNumStats] = {};
  void add(const Stats& o) {
    for (int i = 0; i < kNumStats; ++i) v[i] += o.v[i];
  }
};

// ---------------------------------------------------------------------------------------------
// Communicators as a lane sees them.

struct CommRef {
  ncclComm_t comm = nullptr;
  int rank = 0, nranks = 0;
  bool blocking = true;
  cudaStream_t stream = nullptr;  // the stream this lane uses with it (NULL: synchronous)
  std::string name;
  explicit operator bool() const { return comm != nullptr; }
};

CommRef describe_comm(ncclComm_t c, std::string name, bool blocking = true) {
  CommRef r;
  r.comm = c;
  r.name = std::move(name);
  r.blocking = blocking;
  if (c != nullptr) {
    check_nccl(ncclCommUserRank(c, &r.rank), "ncclCommUserRank");
    check_nccl(ncclCommCount(c, &r.nranks), "ncclCommCount");
  }
  return r;
}

// Waits for a non-blocking comm's pending work (initialisation or calls).
void wait_ready(const CommRef& c, const std::string& what) {
  if (c.blocking || c.comm == nullptr) return;
  for (;;) {
    ncclResult_t e = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(c.comm, &e), "ncclCommGetAsyncError");
    if (e == ncclSuccess) return;
    if (e != ncclInProgress) check_nccl(e, what + " (async error)");
    std::this_thread::yield();
  }
}

// ---------------------------------------------------------------------------------------------
// One call: its shape (drawn identically on every rank), its buffers and its check.

constexpr Coll kColls[] = {Coll::kAllReduce, Coll::kReduceScatter, Coll::kAllGather,
                           Coll::kBroadcast, Coll::kReduce,        Coll::kAlltoAll,
                           Coll::kGather,    Coll::kScatter,       Coll::kSendRecv};

// What every rank draws; adapted to each comm's size only after drawing (never a draw that
// depends on rank-local facts, or the ranks' sequences would part).
struct Draw {
  Coll coll = Coll::kAllReduce;
  ncclDataType_t dtype = ncclFloat;
  int op = 0;
  size_t bytes = 0;
  uint64_t root_pick = 0;
  bool in_place = false;
  uint64_t offset_pick = 0;
  uint64_t shifts_pick = 0;
  uint64_t p2p_sizes[3] = {};
};

size_t draw_bytes(Rng& rng, size_t max_bytes) {
  if (rng.chance(5)) return 0;
  int bits = static_cast<int>(rng.below(21));  // log-uniform over 1 B .. 2 MiB, then capped
  size_t base = size_t{1} << bits;
  return std::min(max_bytes, base + rng.below(base));
}

Draw draw(Rng& rng, size_t max_bytes, bool allow_p2p = true) {
  Draw d;
  d.coll = kColls[rng.below(allow_p2p ? 9 : 8)];
  d.dtype = static_cast<ncclDataType_t>(rng.below(ncclNumTypes));
  d.op = static_cast<int>(rng.below(chorus::verify::kNumOps));
  d.bytes = draw_bytes(rng, max_bytes);
  d.root_pick = rng.next();
  d.in_place = rng.chance(50);
  d.offset_pick = rng.next();
  d.shifts_pick = rng.next();
  for (auto& s : d.p2p_sizes) s = draw_bytes(rng, max_bytes / 4);
  return d;
}

const char* type_name(ncclDataType_t t) {
  static const char* kNames[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                                 "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  return t >= 0 && t < ncclNumTypes ? kNames[t] : "?";
}
const char* op_name(int op) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return op >= 0 && op < 6 ? kNames[op] : "?";
}

class Call {
 public:
  Call(const Draw& d, const CommRef& comm) : comm_(comm), d_(d) {
    const size_t esize = chorus::verify::datatype_size(d.dtype);
    const int n = comm.nranks;
    root_ = static_cast<int>(d.root_pick % static_cast<uint64_t>(n));
    offset_ = static_cast<size_t>(d.offset_pick % 8) * esize;
    if (d.coll == Coll::kSendRecv) {
      // Distinct shifts (0 = to oneself): send to rank+s, receive from rank-s.
      int k = 1 + static_cast<int>(d.shifts_pick % static_cast<uint64_t>(std::min(n, 3)));
      int first = static_cast<int>((d.shifts_pick >> 8) % static_cast<uint64_t>(n));
      for (int i = 0; i < k; ++i) {
        Peer p;
        p.shift = (first + i) % n;
        p.count = d.p2p_sizes[i] / esize;
        p.verifier = Verifier::create({Coll::kSendRecv, d.dtype, 0, n, p.count, 0});
        peers_.push_back(std::move(p));
      }
    } else {
      bool per_peer = d.coll == Coll::kReduceScatter || d.coll == Coll::kAllGather ||
                      d.coll == Coll::kAlltoAll || d.coll == Coll::kGather ||
                      d.coll == Coll::kScatter;
      count_ = d.bytes / esize / (per_peer ? static_cast<size_t>(n) : 1);
      int op = chorus::verify::coll_reduces(d.coll) ? d.op : 0;
      verifier_ = Verifier::create({d.coll, d.dtype, op, n, count_, root_});
    }
  }

  std::string describe() const {
    if (d_.coll == Coll::kSendRecv) {
      std::string s = fmt::format("send/recv {} on {} (rank {}/{}):", type_name(d_.dtype),
                                  comm_.name, comm_.rank, comm_.nranks);
      for (const auto& p : peers_) s += fmt::format(" shift {} count {};", p.shift, p.count);
      return s;
    }
    return fmt::format("{} {} {} count={} root={} {} offset={} on {} (rank {}/{}){}",
                       chorus::verify::coll_name(d_.coll), type_name(d_.dtype),
                       chorus::verify::coll_reduces(d_.coll) ? op_name(d_.op) : "-", count_, root_,
                       d_.in_place ? "in-place" : "out-of-place", offset_, comm_.name, comm_.rank,
                       comm_.nranks, comm_.stream ? " stream" : "");
  }

  // Buffers, inputs, poison; the PreMulSum operator.
  void prepare(bool fill = true) {
    const int rank = comm_.rank;
    if (d_.coll == Coll::kSendRecv) {
      for (auto& p : peers_) {
        size_t b = p.count * p.verifier->element_bytes();
        p.send.allocate(b, offset_, 0);
        if (fill) p.verifier->fill_input(rank, p.send.data(), 0, p.count);
        p.recv.allocate(b, offset_, kPoisonByte);
      }
      return;
    }
    const Verifier& v = *verifier_;
    const size_t esize = v.element_bytes();
    const size_t one = count_ * esize, all = one * static_cast<size_t>(comm_.nranks);
    const size_t block = one * static_cast<size_t>(rank);
    const bool root = rank == root_;
    const bool ip = d_.in_place;
    switch (d_.coll) {
      case Coll::kAllReduce:
      case Coll::kReduce:
      case Coll::kBroadcast:
        a_.allocate(one, offset_, kPoisonByte);
        recv_ = a_.data();
        if (ip) {
          send_ = recv_;
        } else {
          b_.allocate(one, offset_, 0);
          send_ = b_.data();
        }
        break;
      case Coll::kReduceScatter:
        a_.allocate(all, offset_, 0);
        send_ = a_.data();
        if (ip) {
          recv_ = send_ + block;
        } else {
          b_.allocate(one, offset_, kPoisonByte);
          recv_ = b_.data();
        }
        break;
      case Coll::kAllGather:
      case Coll::kGather:
        a_.allocate(all, offset_, kPoisonByte);
        recv_ = a_.data();
        if (ip && (d_.coll == Coll::kAllGather || root)) {
          send_ = recv_ + block;
        } else {
          b_.allocate(one, offset_, 0);
          send_ = b_.data();
        }
        break;
      case Coll::kAlltoAll:
        a_.allocate(all, offset_, kPoisonByte);
        recv_ = a_.data();
        if (ip) {
          send_ = recv_;
        } else {
          b_.allocate(all, offset_, 0);
          send_ = b_.data();
        }
        break;
      case Coll::kScatter:
        a_.allocate(all, offset_, 0);
        send_ = a_.data();
        if (ip && root) {
          recv_ = send_ + block;
        } else {
          b_.allocate(one, offset_, kPoisonByte);
          recv_ = b_.data();
        }
        break;
      case Coll::kSendRecv: break;
    }
    if (fill) v.fill_input(rank, send_, 0, v.input_count(rank));
    // The send buffer is its own allocation (b_ holds it, or a_ does and recv_ is in b_).
    out_of_place_send_ = (b_.mem && send_ == b_.data()) || (b_.mem && recv_ == b_.data());
    if (chorus::verify::coll_reduces(d_.coll) && d_.op == chorus::verify::kPreMulSum) {
      alignas(8) unsigned char scalar[8];
      v.encode_scalar(rank, scalar);
      check_nccl(ncclRedOpCreatePreMulSum(&redop_, scalar, d_.dtype, ncclScalarHostImmediate,
                                          comm_.comm),
                 "ncclRedOpCreatePreMulSum for " + describe());
      premul_ = true;
    } else {
      redop_ = static_cast<ncclRedOp_t>(chorus::verify::coll_reduces(d_.coll) ? d_.op : 0);
    }
  }

  // Makes the call (inside the caller's group, if any). A PreMulSum operator is destroyed as
  // soon as the call returns, as NCCL allows.
  void issue() {
    ncclComm_t c = comm_.comm;
    cudaStream_t s = comm_.stream;
    ncclResult_t r = ncclSuccess;
    switch (d_.coll) {
      case Coll::kAllReduce: r = ncclAllReduce(send_, recv_, count_, d_.dtype, redop_, c, s); break;
      case Coll::kReduce:
        r = ncclReduce(send_, recv_, count_, d_.dtype, redop_, root_, c, s);
        break;
      case Coll::kBroadcast: r = ncclBroadcast(send_, recv_, count_, d_.dtype, root_, c, s); break;
      case Coll::kReduceScatter:
        r = ncclReduceScatter(send_, recv_, count_, d_.dtype, redop_, c, s);
        break;
      case Coll::kAllGather: r = ncclAllGather(send_, recv_, count_, d_.dtype, c, s); break;
      case Coll::kGather: r = ncclGather(send_, recv_, count_, d_.dtype, root_, c, s); break;
      case Coll::kAlltoAll: r = ncclAlltoAll(send_, recv_, count_, d_.dtype, c, s); break;
      case Coll::kScatter: r = ncclScatter(send_, recv_, count_, d_.dtype, root_, c, s); break;
      case Coll::kSendRecv: {
        const int n = comm_.nranks, me = comm_.rank;
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        // Alternate the order of sends and receives across ranks: any order must work.
        for (int pass = 0; pass < 2; ++pass) {
          bool sends = (pass == 0) == (me % 2 == 0);
          for (auto& p : peers_) {
            if (sends) {
              r = ncclSend(p.send.data(), p.count, d_.dtype, (me + p.shift) % n, c, s);
            } else {
              r = ncclRecv(p.recv.data(), p.count, d_.dtype, (me - p.shift + n) % n, c, s);
            }
            check_nccl(r, describe());
          }
        }
        r = ncclGroupEnd();
        break;
      }
    }
    check_nccl(r, describe());
    if (premul_) {
      check_nccl(ncclRedOpDestroy(redop_, c), "ncclRedOpDestroy after " + describe());
      premul_ = false;
    }
  }

  // Compares every output element; returns the receive-buffer bytes of this rank.
  uint64_t check() const {
    const int rank = comm_.rank;
    uint64_t bytes = 0;
    if (d_.coll == Coll::kSendRecv) {
      for (const auto& p : peers_) {
        size_t b = p.count * p.verifier->element_bytes();
        std::vector<unsigned char> want(b);
        int src = (rank - p.shift + comm_.nranks) % comm_.nranks;
        p.verifier->fill_input(src, want.data(), 0, p.count);
        if (b != 0 && std::memcmp(want.data(), p.recv.data(), b) != 0) {
          size_t i = 0;
          while (p.recv.data()[i] == want[i]) ++i;
          fail(fmt::format("{}: data from rank {} (shift {}) differs at byte {} of {}", describe(),
                           src, p.shift, i, b));
        }
        std::vector<unsigned char> sent(b);
        p.verifier->fill_input(rank, sent.data(), 0, p.count);
        if (b != 0 && std::memcmp(sent.data(), p.send.data(), b) != 0)
          fail(describe() + ": a send buffer was modified");
        if (!p.send.guards_intact() || !p.recv.guards_intact())
          fail(describe() + ": bytes around a buffer were overwritten");
        bytes += b;
      }
      return bytes;
    }
    const Verifier& v = *verifier_;
    chorus::verify::Mismatch m = v.check(rank, recv_);
    if (m.wrong != 0)
      fail(fmt::format("{}: {} of {} elements wrong:{}", describe(), m.wrong, v.output_count(rank),
                       m.first));
    if (!a_.guards_intact() || !b_.guards_intact())
      fail(describe() + ": bytes around a buffer were overwritten");
    if (out_of_place_send_ && v.input_count(rank) != 0) {
      std::vector<unsigned char> sent(v.input_count(rank) * v.element_bytes());
      v.fill_input(rank, sent.data(), 0, v.input_count(rank));
      if (std::memcmp(sent.data(), send_, sent.size()) != 0)
        fail(describe() + ": the send buffer was modified");
    }
    return v.output_count(rank) * v.element_bytes();
  }

  const CommRef& comm() const { return comm_; }

 private:
  struct Peer {
    int shift = 0;
    size_t count = 0;
    std::unique_ptr<Verifier> verifier;
    Buffer send, recv;
  };
  CommRef comm_;
  Draw d_;
  int root_ = 0;
  size_t offset_ = 0, count_ = 0;
  std::unique_ptr<Verifier> verifier_;
  Buffer a_, b_;
  unsigned char* send_ = nullptr;
  unsigned char* recv_ = nullptr;
  bool out_of_place_send_ = false;
  ncclRedOp_t redop_ = ncclSum;
  bool premul_ = false;
  std::vector<Peer> peers_;
};

// ---------------------------------------------------------------------------------------------
// Per-process shared state.

struct Process {
  Options opt;
  int nranks = 1;                 // world size
  std::vector<int> local_ranks;   // world ranks run by this process
  bool launched = false;
  Clock::time_point start = Clock::now();

  // Checkpoints: every --checkpoint-every epochs all lanes of the process meet; the last to
  // arrive samples the resources (a quiescent point: no call in flight, only the long-lived
  // comms alive) and decides whether this process wants to stop (read by the lanes after the
  // barrier, then agreed with the other processes by a vote on each lane's comm).
  std::unique_ptr<std::barrier<std::function<void()>>> checkpoint;
  int checkpoints = 0;
  int baseline_checkpoint = -1;    // the first checkpoint after warm-up
  bool stop = false;
  std::atomic<uint64_t> calls{0};  // made by this process's lanes
  Resources at_start, baseline, at_end, at_teardown;
  Clock::time_point baseline_time{}, end_time{};
  void on_checkpoint();

  // Watchdog: each lane's step and when it began.
  struct LaneState {
    std::mutex mu;
    std::string what = "starting";
    int64_t since_ns = 0;
  };
  std::vector<std::unique_ptr<LaneState>> lanes;  // [local rank index * lanes + lane]
  std::atomic<bool> done{false};
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void watchdog(Process* p) {
  while (!p->done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int64_t now = now_ns();
    for (size_t i = 0; i < p->lanes.size(); ++i) {
      auto& l = *p->lanes[i];
      std::lock_guard<std::mutex> lock(l.mu);
      if (l.since_ns == 0 || now - l.since_ns < static_cast<int64_t>(p->opt.stall_seconds * 1e9))
        continue;
      std::string all;
      for (size_t k = 0; k < p->lanes.size(); ++k) {
        if (k != i) p->lanes[k]->mu.lock();
        all += fmt::format("\n  rank {} lane {}: {} ({:.1f} s)",
                           p->local_ranks[k / static_cast<size_t>(p->opt.lanes)],
                           k % static_cast<size_t>(p->opt.lanes), p->lanes[k]->what,
                           (now - p->lanes[k]->since_ns) / 1e9);
        if (k != i) p->lanes[k]->mu.unlock();
      }
      fail(fmt::format("no progress for {} s; lanes:{}", p->opt.stall_seconds, all));
    }
  }
}

std::string format_resources(const Resources& r);

void Process::on_checkpoint() {
  Resources r = sample(100);
  const Clock::time_point now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start).count();
  ++checkpoints;
  if (baseline_checkpoint < 0 && checkpoints * opt.checkpoint_every >= opt.warmup) {
    baseline_checkpoint = checkpoints;
    baseline = r;
    baseline_time = now;
  }
  at_end = r;
  end_time = now;
  // Stop only with some churn after the baseline.
  stop = baseline_checkpoint >= 0 && checkpoints > baseline_checkpoint &&
         ((opt.seconds > 0 && elapsed >= opt.seconds) ||
          (opt.max_ops > 0 && calls.load() >= opt.max_ops));
  if (opt.verbose) {
    fmt::print("soak: rank {} checkpoint {} at {:.1f} s{}: {}\n", local_ranks.front(), checkpoints,
               elapsed, checkpoints == baseline_checkpoint ? " (baseline)" : "",
               format_resources(r));
  }
}

// ---------------------------------------------------------------------------------------------
// A lane: one thread of one rank, with its own communicators.

class Lane {
 public:
  Lane(Process* p, uint64_t seed, int local_index, int lane, CommRef base)
      : p_(p), opt_(p->opt), seed_(seed), lane_(lane), kind_(p->opt.kinds[static_cast<size_t>(lane)]),
        base_(std::move(base)),
        state_(p->lanes[static_cast<size_t>(local_index * p->opt.lanes + lane)].get()) {}

  const Stats& stats() const { return stats_; }

  void run() {
    if (kind_ == 't') {
      check_nccl(chorusStreamCreate(&base_.stream), "chorusStreamCreate");
      ++stats_.v[kStreams];
    }
    prime();
    uint64_t counted = 0;
    for (epoch_ = 0;; ++epoch_) {
      if (kind_ == 'w') world_epoch();
      else if (kind_ == 's') split_epoch();
      else stream_epoch();
      ++stats_.v[kEpochs];
      p_->calls += stats_.v[kCalls] - counted;
      counted = stats_.v[kCalls];
      if ((epoch_ + 1) % static_cast<uint64_t>(opt_.checkpoint_every) != 0) continue;
      step("at a checkpoint");
      p_->checkpoint->arrive_and_wait();
      if (vote_stop(p_->stop)) break;
    }
    if (base_.stream != nullptr) {
      check_nccl(chorusStreamDestroy(base_.stream), "chorusStreamDestroy");
      base_.stream = nullptr;
    }
    step_done();
  }

 private:
  void step(const std::string& what) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->what = fmt::format("epoch {}: {}", epoch_, what);
    state_->since_ns = now_ns();
  }
  void step_done() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->what = "done";
    state_->since_ns = 0;
  }

  Rng rng(uint64_t salt) const { return Rng{seed_, static_cast<uint64_t>(lane_), epoch_, salt}; }

  void count(const Call& c, uint64_t bytes) {
    ++stats_.v[kCalls];
    if (c.comm().rank == 0) ++stats_.v[kCollectives];
    stats_.v[kBytes] += bytes;
  }

  // One blocking (or non-blocking, waited) call, checked.
  // verify = false (priming): no inputs written, nothing checked.
  void run_one(const Draw& d, const CommRef& c, bool verify = true) {
    Call call(d, c);
    step("preparing " + call.describe());
    call.prepare(verify);
    step(call.describe());
    call.issue();
    if (c.stream != nullptr) check_nccl(chorusStreamSynchronize(c.stream), call.describe());
    wait_ready(c, call.describe());
    step("checking " + call.describe());
    count(call, verify ? call.check() : 0);
  }

  // Several calls (on one or two comms) in one ncclGroupStart/End, then checked.
  void run_group(std::vector<std::unique_ptr<Call>>& calls) {
    if (calls.empty()) return;
    std::string what = fmt::format("group of {}: {} ...", calls.size(), calls.front()->describe());
    step("preparing " + what);
    for (auto& c : calls) c->prepare();
    step(what);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (auto& c : calls) c->issue();
    check_nccl(ncclGroupEnd(), "ncclGroupEnd of " + what);
    for (auto& c : calls) {
      if (c->comm().stream != nullptr)
        check_nccl(chorusStreamSynchronize(c->comm().stream), c->describe());
      wait_ready(c->comm(), c->describe());
    }
    step("checking " + what);
    for (auto& c : calls) count(*c, c->check());
    ++stats_.v[kGroups];
  }

  // The calls of an epoch on one comm: mostly single calls, some groups.
  void mixed_calls(Rng& r, const CommRef& c, int n) {
    for (int i = 0; i < n; ++i) {
      int kind = static_cast<int>(r.below(10));
      if (kind < 7) {
        Draw d = draw(r, opt_.max_bytes);
        if (!c) continue;
        if (d.coll == Coll::kSendRecv) ++stats_.v[kP2P];
        run_one(d, c);
      } else {
        // A group of 2..4 collectives, maybe with a send/recv set among them.
        int k = 2 + static_cast<int>(r.below(3));
        std::vector<Draw> draws;
        for (int j = 0; j < k; ++j) draws.push_back(draw(r, opt_.max_bytes / 2, false));
        if (r.chance(40)) draws.push_back(draw_p2p(r));
        if (!c) continue;
        std::vector<std::unique_ptr<Call>> calls;
        for (const auto& d : draws) calls.push_back(std::make_unique<Call>(d, c));
        run_group(calls);
      }
    }
  }

  Draw draw_p2p(Rng& r) {
    Draw d = draw(r, opt_.max_bytes);
    d.coll = Coll::kSendRecv;
    return d;
  }

  void destroy(CommRef& c, int how) {
    if (!c) return;
    step("destroying " + c.name);
    if (how == 1) {
      check_nccl(ncclCommFinalize(c.comm), "ncclCommFinalize of " + c.name);
      wait_ready(c, "ncclCommFinalize of " + c.name);
      ++stats_.v[kFinalizes];
    }
    if (how == 2) {
      check_nccl(ncclCommAbort(c.comm), "ncclCommAbort of " + c.name);
      ++stats_.v[kAborts];
    } else {
      check_nccl(ncclCommDestroy(c.comm), "ncclCommDestroy of " + c.name);
      ++stats_.v[kDestroys];
    }
    c = CommRef();
  }

  // Colour and key of this rank for a split, drawn alike by every rank of `parent`.
  struct SplitPlan {
    int color, key;
  };
  SplitPlan plan_split(Rng& r, const CommRef& parent) {
    int n = parent.nranks, me = parent.rank;
    int ncolors = 1 + static_cast<int>(r.below(3));
    bool blocks = r.chance(50);
    int keyscheme = static_cast<int>(r.below(3));
    uint64_t keysalt = r.next();
    int nocolor = r.chance(25) ? static_cast<int>(r.below(static_cast<uint64_t>(n))) : -1;
    SplitPlan s;
    s.color = blocks ? me * ncolors / n : me % ncolors;
    if (me == nocolor) s.color = NCCL_SPLIT_NOCOLOR;
    s.key = keyscheme == 0 ? me : keyscheme == 1 ? n - me
                                                 : static_cast<int>(splitmix(keysalt ^ me) & 0xffff);
    return s;
  }

  // A non-blocking split (or a split of a non-blocking comm, which inherits its config) is
  // waited for with ncclCommGetAsyncError before the new comm is used.
  CommRef split(const CommRef& parent, SplitPlan s, const std::string& name,
                bool nonblocking = false) {
    step("ncclCommSplit of " + parent.name + " into " + name);
    ncclComm_t c = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommSplit(parent.comm, s.color, s.key, &c, nonblocking ? &config : nullptr),
               "ncclCommSplit of " + parent.name);
    ++stats_.v[kSplits];
    if (nonblocking) ++stats_.v[kNonBlocking];
    if (s.color == NCCL_SPLIT_NOCOLOR && c != nullptr)
      fail("ncclCommSplit with NCCL_SPLIT_NOCOLOR returned a communicator");
    if (s.color != NCCL_SPLIT_NOCOLOR && c == nullptr)
      fail("ncclCommSplit returned no communicator");
    CommRef out;
    out.comm = c;
    out.blocking = parent.blocking && !nonblocking;
    out.name = fmt::format("{}@{}.{}", name, lane_, epoch_);
    wait_ready(out, "ncclCommSplit of " + parent.name);
    return describe_comm(c, out.name, out.blocking);
  }

  // Every collective at sizes from the largest down, in place and not, on this lane's long-lived
  // comm: caches that grow with the largest call (per-comm scratch buffers) reach their size
  // before the baseline sample, so that later growth means a leak.
  // Which slot an algorithm uses, and how much, depends on the size, the root (a rank's place
  // in a chain or tree) and the operator (PreMulSum scales a copy of the input): the large
  // sizes are tried with every root. Not checked (these are not the soak's calls).
  void prime() {
    const size_t m = opt_.max_bytes;
    std::vector<size_t> sizes = {m, m / 4 * 3, m / 2, m / 8 * 3, m / 4};
    for (size_t b = m / 16; b >= 64; b /= 4) sizes.push_back(b);
    for (Coll coll : kColls) {
      for (size_t bytes : sizes) {
        int roots = chorus::verify::coll_rooted(coll) && bytes >= m / 4 ? base_.nranks : 1;
        for (int root = 0; root < roots; ++root) {
          for (int in_place = 0; in_place < 2; ++in_place) {
            Draw d;
            d.coll = coll;
            d.dtype = ncclUint8;
            d.op = chorus::verify::kPreMulSum;
            d.bytes = bytes;
            d.root_pick = static_cast<uint64_t>(root);
            d.in_place = in_place != 0;
            d.shifts_pick = static_cast<uint64_t>(std::min(base_.nranks, 3) - 1);  // 3 shifts
            for (auto& p2p : d.p2p_sizes) p2p = bytes;
            run_one(d, base_, false);
          }
        }
      }
    }
  }

  // lane 0: the world comm, and new comms by ncclCommInitRank.
  void world_epoch() {
    Rng r = rng(0);
    mixed_calls(r, base_, opt_.ops_per_epoch);
    // Epoch 0 makes one (non-blocking) too, so that warm-up has started whatever a first
    // non-blocking comm starts (the progress thread) before the baseline sample.
    if (epoch_ != 0 &&
        epoch_ % static_cast<uint64_t>(opt_.init_every) != static_cast<uint64_t>(opt_.init_every - 1))
      return;
    // A new communicator: rank 0 makes a unique id and broadcasts it over the world comm.
    step("broadcasting a unique id");
    ncclUniqueId id{};
    if (base_.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    check_nccl(ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, base_.comm, nullptr),
               "ncclBroadcast of a unique id");
    bool nonblocking = r.chance(40) || epoch_ == 0;
    bool permute = r.chance(50);
    uint64_t rot = r.below(static_cast<uint64_t>(base_.nranks));
    int how = static_cast<int>(r.below(3));  // destroy, finalize+destroy, abort
    int n = base_.nranks;
    int newrank = permute ? static_cast<int>((static_cast<uint64_t>(base_.rank) + rot) % n)
                          : base_.rank;
    step(fmt::format("ncclCommInitRank{} as rank {}", nonblocking ? "Config (non-blocking)" : "",
                     newrank));
    ncclComm_t c = nullptr;
    if (nonblocking) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      config.commName = "soak-nonblocking";
      check_nccl(ncclCommInitRankConfig(&c, n, id, newrank, &config), "ncclCommInitRankConfig");
      ++stats_.v[kNonBlocking];
    } else {
      check_nccl(ncclCommInitRank(&c, n, id, newrank), "ncclCommInitRank");
    }
    ++stats_.v[kInits];
    CommRef fresh;
    fresh.comm = c;
    fresh.blocking = !nonblocking;
    fresh.name = fmt::format("init@{}.{}", lane_, epoch_);
    wait_ready(fresh, "ncclCommInitRank");
    fresh = describe_comm(c, fresh.name, !nonblocking);
    if (fresh.rank != newrank || fresh.nranks != n)
      fail(fmt::format("{}: rank {}/{}, want {}/{}", fresh.name, fresh.rank, fresh.nranks, newrank, n));
    mixed_calls(r, fresh, std::max(1, opt_.ops_per_epoch / 2));
    destroy(fresh, how);
  }

  // lane 1, 3, ...: splits of this lane's comm, and splits of those.
  void split_epoch() {
    Rng r = rng(1);
    SplitPlan s = split_plan_or_default(r);
    bool nonblocking = r.chance(25);
    CommRef child = split(base_, s, "child", nonblocking);
    bool grandchild_too = r.chance(40);
    SplitPlan gs{0, 0};
    if (grandchild_too) gs = plan_split_for(r, child);
    CommRef grand;
    if (grandchild_too && child) grand = split(child, gs, "grandchild");
    int per = std::max(1, opt_.ops_per_epoch / 3);
    // Calls on the base comm, the child and the grandchild; each comm's sequence is drawn from
    // its own stream of randomness, so that ranks of different colours stay in step.
    Rng rb = rng(2), rc = rng(3 + static_cast<uint64_t>(s.color + 1) * 16),
        rg = rng(5 + static_cast<uint64_t>(gs.color + 1) * 16 + static_cast<uint64_t>(s.color + 1) * 256);
    mixed_calls(rb, base_, per);
    mixed_calls(rc, child, per);
    if (grand) mixed_calls(rg, grand, per);
    // A group spanning two comms: one call on the base comm, one on the child.
    if (r.chance(60)) {
      Draw db = draw(r, opt_.max_bytes / 2, false);
      Draw dc = draw(rc, opt_.max_bytes / 2, false);
      std::vector<std::unique_ptr<Call>> calls;
      calls.push_back(std::make_unique<Call>(db, base_));
      if (child) calls.push_back(std::make_unique<Call>(dc, child));
      if (calls.size() == 2) ++stats_.v[kCrossGroups];
      run_group(calls);
    }
    int how_child = static_cast<int>(r.below(4)) % 3;
    // Sometimes the child goes before its own child: a comm must not depend on its parent.
    bool child_first = r.chance(50);
    if (child_first) destroy(child, how_child);
    destroy(grand, 0);
    destroy(child, how_child);
  }

  SplitPlan split_plan_or_default(Rng& r) { return plan_split(r, base_); }
  SplitPlan plan_split_for(Rng& r, const CommRef& parent) {
    // Drawn even where this rank has no parent (a NOCOLOR rank), to stay in step.
    CommRef shape = parent;
    if (!shape) {
      shape.nranks = 1;
      shape.rank = 0;
    }
    return plan_split(r, shape);
  }

  // lane 2, 4, ...: host streams; two splits made in one group, each with a new stream.
  void stream_epoch() {
    Rng r = rng(7);
    SplitPlan sa = plan_split(r, base_);
    SplitPlan sb{0, base_.nranks - base_.rank};  // everyone, reversed
    step("two ncclCommSplit in one group");
    ncclComm_t ca = nullptr, cb = nullptr;
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclCommSplit(base_.comm, sa.color, sa.key, &ca, nullptr), "ncclCommSplit (a)");
    check_nccl(ncclCommSplit(base_.comm, sb.color, sb.key, &cb, nullptr), "ncclCommSplit (b)");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd of two splits");
    stats_.v[kSplits] += 2;
    CommRef a = describe_comm(ca, fmt::format("a@{}.{}", lane_, epoch_));
    CommRef b = describe_comm(cb, fmt::format("b@{}.{}", lane_, epoch_));
    if (b.nranks != base_.nranks || b.rank != base_.nranks - 1 - base_.rank)
      fail(fmt::format("{}: rank {}/{} after a reversing split of rank {}/{}", b.name, b.rank,
                       b.nranks, base_.rank, base_.nranks));
    for (CommRef* c : {&a, &b}) {
      if (!*c) continue;
      check_nccl(chorusStreamCreate(&c->stream), "chorusStreamCreate");
      ++stats_.v[kStreams];
    }
    // Batches: each call goes to one of the three comms (drawn alike by their members), is
    // queued on that comm's stream, sometimes in a group with the next; then all are checked.
    Rng ra = rng(8 + static_cast<uint64_t>(sa.color + 1) * 16), rb = rng(9);
    std::atomic<int> host_fns{0};
    int launched = 0;
    for (int batch = 0; batch < 2; ++batch) {
      std::vector<std::unique_ptr<Call>> calls;
      int per = std::max(1, opt_.ops_per_epoch / 2);
      for (int i = 0; i < per; ++i) {
        int which = static_cast<int>(rb.below(3));  // base, a, b
        Draw d = draw(which == 1 ? ra : rb, opt_.max_bytes / 2);
        const CommRef& c = which == 0 ? base_ : which == 1 ? a : b;
        if (!c) continue;
        calls.push_back(std::make_unique<Call>(d, c));
      }
      step(fmt::format("preparing a batch of {}", calls.size()));
      for (auto& c : calls) c->prepare();
      step(fmt::format("queueing a batch of {}", calls.size()));
      bool grouped = rb.chance(50);
      if (grouped) check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (auto& c : calls) c->issue();
      if (grouped) check_nccl(ncclGroupEnd(), "ncclGroupEnd of a stream batch");
      for (CommRef* c : {&base_, &a, &b}) {
        if (!*c) continue;
        check_nccl(chorusLaunchHostFunc(
                       c->stream, [](void* arg) { static_cast<std::atomic<int>*>(arg)->fetch_add(1); },
                       &host_fns),
                   "chorusLaunchHostFunc");
        ++launched;
      }
      step(fmt::format("synchronizing a batch of {}", calls.size()));
      for (CommRef* c : {&base_, &a, &b}) {
        if (!*c) continue;
        ncclResult_t q = chorusStreamQuery(c->stream);
        if (q != ncclSuccess && q != ncclInProgress) check_nccl(q, "chorusStreamQuery");
        check_nccl(chorusStreamSynchronize(c->stream), "chorusStreamSynchronize of " + c->name);
      }
      step(fmt::format("checking a batch of {}", calls.size()));
      for (auto& c : calls) count(*c, c->check());
      if (grouped) ++stats_.v[kGroups];
    }
    if (host_fns.load() != launched)
      fail(fmt::format("{} host functions ran, {} launched", host_fns.load(), launched));
    stats_.v[kHostFns] += static_cast<uint64_t>(launched);
    int how = static_cast<int>(r.below(3));
    for (CommRef* c : {&a, &b}) {
      if (!*c) continue;
      check_nccl(chorusStreamDestroy(c->stream), "chorusStreamDestroy");
      c->stream = nullptr;
    }
    destroy(a, how);
    destroy(b, 0);
  }

  // All ranks of this lane's comm agree whether to stop: if any process wants to. Every lane of
  // every rank votes at the same checkpoint with its process's decision, so all lanes stop
  // after the same epoch.
  bool vote_stop(bool mine) {
    int32_t stop = mine ? 1 : 0;
    step("voting to stop");
    check_nccl(ncclAllReduce(&stop, &stop, 1, ncclInt32, ncclMax, base_.comm, nullptr),
               "ncclAllReduce of the stop vote");
    return stop != 0;
  }

  Process* p_;
  const Options& opt_;
  uint64_t seed_;
  int lane_;
  char kind_;  // 'w' world-style (inits), 's' splits, 't' streams
  CommRef base_;
  Process::LaneState* state_;
  uint64_t epoch_ = 0;
  Stats stats_;
};

// ---------------------------------------------------------------------------------------------
// A rank: the world comm, one base comm per lane, the lanes, the totals.

struct RankResult {
  Stats stats;
  // Per process (filled on rank 0): leaders' resource rows.
  std::vector<std::vector<int64_t>> rows;
};

constexpr int kResFields = 13;
void put(const Resources& r, int64_t* out) {
  int64_t v[kResFields] = {r.fds,     r.sockets,  r.eventfds, r.memfds, r.pipes,
                           r.threads, r.rss_kb,   r.anon_kb,  r.shmem_kb, r.heap_kb,
                           r.maps,    r.shm_entries, r.shm_chorus};
  std::memcpy(out, v, sizeof(v));
}
Resources get(const int64_t* in) {
  Resources r;
  r.fds = in[0];
  r.sockets = in[1];
  r.eventfds = in[2];
  r.memfds = in[3];
  r.pipes = in[4];
  r.threads = in[5];
  r.rss_kb = in[6];
  r.anon_kb = in[7];
  r.shmem_kb = in[8];
  r.heap_kb = in[9];
  r.maps = in[10];
  r.shm_entries = in[11];
  r.shm_chorus = in[12];
  return r;
}

// Mappings come and go with glibc's cache of thread stacks (transient init and bootstrap-root
// threads; two mappings each, up to 40 MiB of stacks) and arena heaps: some slack. A mapping
// leaked per communicator (a shared-memory segment) would pass it within a few epochs.
constexpr int64_t kMapsTolerance = 16;

// What grew beyond its tolerance between two samples ("" if nothing).
std::string growth(const Resources& a, const Resources& b, const Options& o) {
  std::string out;
  auto check = [&](const char* what, int64_t before, int64_t after, int64_t tol) {
    if (after > before + tol) out += fmt::format(" {} {} -> {} (tolerance {});", what, before, after, tol);
  };
  check("fds", a.fds, b.fds, 0);
  check("threads", a.threads, b.threads, 0);
  check("anonymous RSS KiB", a.anon_kb, b.anon_kb, o.rss_tolerance_kb);
  check("heap KiB", a.heap_kb, b.heap_kb, o.heap_tolerance_kb);
  check("maps", a.maps, b.maps, kMapsTolerance);
  check("chorus /dev/shm entries", a.shm_chorus, b.shm_chorus, 0);
  return out;
}

std::string format_resources(const Resources& r) {
  return fmt::format("fds {} (sockets {}, eventfds {}, memfds {}, pipes {}), threads {}, RSS {:.1f} MiB "
                     "(anonymous {:.1f} not counting the soak's buffer cache, shared memory {:.1f}), "
                     "heap in use {:.1f} MiB, maps {}, /dev/shm entries {} ({} chorus)",
                     r.fds, r.sockets, r.eventfds, r.memfds, r.pipes, r.threads, r.rss_kb / 1024.0,
                     r.anon_kb / 1024.0, r.shmem_kb / 1024.0, r.heap_kb / 1024.0, r.maps,
                     r.shm_entries, r.shm_chorus);
}

void run_rank(Process* p, int local_index, ncclUniqueId id, RankResult* out) {
  const Options& o = p->opt;
  const int rank = p->local_ranks[static_cast<size_t>(local_index)];
  ncclComm_t world = nullptr;
  check_nccl(ncclCommInitRank(&world, p->nranks, id, rank), "ncclCommInitRank (world)");
  CommRef w = describe_comm(world, "world");

  // The seed: given, or drawn by rank 0 and broadcast (printed, to reproduce a failure).
  uint64_t seed = o.seed;
  if (seed == 0 && rank == 0) seed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  check_nccl(ncclBroadcast(&seed, &seed, 1, ncclUint64, 0, world, nullptr), "ncclBroadcast (seed)");
  g_seed = seed;

  // One base comm per lane > 0, split from the world (keys reverse or keep the order).
  std::vector<CommRef> bases(static_cast<size_t>(o.lanes));
  bases[0] = w;
  for (int l = 1; l < o.lanes; ++l) {
    ncclComm_t c = nullptr;
    int key = l % 2 == 1 ? p->nranks - rank : rank;
    check_nccl(ncclCommSplit(world, 0, key, &c, nullptr), "ncclCommSplit (lane base)");
    bases[static_cast<size_t>(l)] = describe_comm(c, fmt::format("base{}", l));
  }

  std::vector<std::unique_ptr<Lane>> lanes;
  for (int l = 0; l < o.lanes; ++l)
    lanes.push_back(std::make_unique<Lane>(p, seed, local_index, l, bases[static_cast<size_t>(l)]));
  std::vector<std::thread> threads;
  for (auto& l : lanes) threads.emplace_back([&l] { l->run(); });
  for (auto& t : threads) t.join();

  // Totals over every rank, and every process's resources, on the world comm.
  Stats mine;
  for (auto& l : lanes) mine.add(l->stats());
  Stats total = mine;
  check_nccl(ncclAllReduce(total.v, total.v, kNumStats, ncclUint64, ncclSum, world, nullptr),
             "ncclAllReduce (totals)");
  constexpr int kRow = 2 + 2 * kResFields;
  std::vector<int64_t> row(kRow, 0), rows(static_cast<size_t>(kRow * p->nranks), 0);
  row[0] = local_index == 0 ? 1 : 0;
  row[1] = getpid();
  put(p->baseline, row.data() + 2);
  put(p->at_end, row.data() + 2 + kResFields);
  check_nccl(ncclAllGather(row.data(), rows.data(), kRow, ncclInt64, world, nullptr),
             "ncclAllGather (resources)");
  out->stats = total;
  for (int r = 0; r < p->nranks; ++r)
    out->rows.emplace_back(rows.begin() + r * kRow, rows.begin() + (r + 1) * kRow);

  for (int l = 1; l < o.lanes; ++l)
    check_nccl(ncclCommDestroy(bases[static_cast<size_t>(l)].comm), "ncclCommDestroy (lane base)");
  check_nccl(ncclCommDestroy(world), "ncclCommDestroy (world)");
}

}  // namespace

int main(int argc, char** argv) {
  // Large blocks straight from mmap and back at free, and arena tops trimmed: otherwise glibc
  // keeps what the lanes' 1 MiB buffers used in each thread's arena and RSS wanders by tens of
  // MiB between samples, hiding what the resource check is for.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 2 << 20);
  Process p;
  p.opt = parse(argc, argv);
  const Options& o = p.opt;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  ncclUniqueId id{};
  int launch_rank = 0, launch_nranks = 1;
  p.launched = std::getenv("CHORUS_UNIQUE_ID") != nullptr;
  if (p.launched) {
    if (chorusLaunchInfo(&id, &launch_rank, &launch_nranks) != ncclSuccess) {
      fmt::print(stderr, "soak: {}\n", ncclGetLastError(nullptr));
      return 2;
    }
    p.nranks = launch_nranks * o.ranks_per_proc;
    for (int i = 0; i < o.ranks_per_proc; ++i) p.local_ranks.push_back(launch_rank * o.ranks_per_proc + i);
  } else {
    p.nranks = o.ranks;
    for (int r = 0; r < o.ranks; ++r) p.local_ranks.push_back(r);
  }
  if (p.nranks > 8) {
    fmt::print(stderr, "soak: at most 8 ranks (the exact-result generator's limit)\n");
    return 2;
  }
  const bool leader = p.local_ranks.front() == 0;
  p.at_start = sample(0);
  if (!p.launched) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");

  const size_t lanes_here = p.local_ranks.size() * static_cast<size_t>(o.lanes);
  for (size_t i = 0; i < lanes_here; ++i) p.lanes.push_back(std::make_unique<Process::LaneState>());
  p.checkpoint = std::make_unique<std::barrier<std::function<void()>>>(
      static_cast<std::ptrdiff_t>(lanes_here), std::function<void()>([&p] { p.on_checkpoint(); }));
  std::thread dog(watchdog, &p);

  std::vector<RankResult> results(p.local_ranks.size());
  std::vector<std::thread> ranks;
  for (size_t i = 0; i < p.local_ranks.size(); ++i)
    ranks.emplace_back(run_rank, &p, static_cast<int>(i), id, &results[i]);
  for (auto& t : ranks) t.join();
  p.done = true;
  dog.join();
  p.at_teardown = sample(300);
  const double seconds = std::chrono::duration<double>(Clock::now() - p.start).count();

  // Judge this process: from the baseline (after warm-up) to the end (after the churn), with
  // the same communicators alive; after teardown, nothing more than at the baseline.
  std::string grown = growth(p.baseline, p.at_end, o);
  std::string teardown;
  if (p.at_teardown.fds > p.baseline.fds)
    teardown += fmt::format(" fds {} -> {};", p.baseline.fds, p.at_teardown.fds);
  if (p.at_teardown.threads > p.baseline.threads)
    teardown += fmt::format(" threads {} -> {};", p.baseline.threads, p.at_teardown.threads);

  const RankResult& r0 = results.front();
  const Stats& t = r0.stats;
  if (leader) {
    const double churn = std::chrono::duration<double>(p.end_time - p.baseline_time).count();
    fmt::print("soak: {} ranks ({}), {} lanes each, seed {}, {:.1f} s ({:.1f} s between the resource samples)\n",
               p.nranks,
               p.launched ? fmt::format("{} processes of {}", launch_nranks, o.ranks_per_proc)
                          : std::string("threads of one process"),
               o.lanes, g_seed.load(), seconds, churn);
    fmt::print("soak: operations: {} calls on ranks = {} collectives and send/recv groups; {} groups "
               "({} across two comms), {} send/recv sets\n",
               t.v[kCalls], t.v[kCollectives], t.v[kGroups], t.v[kCrossGroups], t.v[kP2P]);
    fmt::print("soak: churn: {} epochs, {} splits, {} inits ({} non-blocking inits and splits), {} destroys, {} finalizes, "
               "{} aborts, {} streams, {} host functions\n",
               t.v[kEpochs], t.v[kSplits], t.v[kInits], t.v[kNonBlocking], t.v[kDestroys],
               t.v[kFinalizes], t.v[kAborts], t.v[kStreams], t.v[kHostFns]);
    fmt::print("soak: bytes moved: {} ({:.2f} GiB received, summed over ranks), {:.1f} MiB/s\n",
               t.v[kBytes], t.v[kBytes] / double(1 << 30), t.v[kBytes] / double(1 << 20) / seconds);
    for (int r = 0; r < p.nranks; ++r) {
      const auto& row = r0.rows[static_cast<size_t>(r)];
      if (row[0] == 0) continue;  // not the first rank of its process
      Resources b = get(row.data() + 2), e = get(row.data() + 2 + kResFields);
      fmt::print("soak: process of rank {} (pid {}):\n  after warm-up: {}\n  at the end:    {}\n", r,
                 row[1], format_resources(b), format_resources(e));
    }
  }
  fmt::print("soak: rank {} process after teardown: {}\n", p.local_ranks.front(),
             format_resources(p.at_teardown));
  if (!grown.empty() || !teardown.empty()) {
    fmt::print(stderr, "soak: FAIL (seed {}): rank {}'s process grew:{}{}\n", g_seed.load(),
               p.local_ranks.front(), grown, teardown.empty() ? "" : " after teardown:" + teardown);
    return 1;
  }
  if (leader) fmt::print("soak: PASS\n");
  return 0;
}
