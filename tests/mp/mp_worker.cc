// SPDX-License-Identifier: Apache-2.0
// File: tests/mp/mp_worker.cc
// One rank of a multi-process test, started by the launcher (chorus-run's library):
//   chorus_mp_worker matrix [max_count]   every collective x datatype x op x count, in place and
//                                         not, on this process's rank; exit 0 iff all correct.
//   chorus_mp_worker identical            AllReduce with every algorithm (CHORUS_ALGO switched
//                                         between them), float datatype and operator on random
//                                         data: every rank's output bit-identical to every
//                                         other's, and right against fp64 (identical_check.h).
//   chorus_mp_worker broadcast counts spec
//                                         Broadcast (CHORUS_ALGO=spec) of random bytes (any
//                                         bit pattern: non-integer values, NaNs) from every root,
//                                         in place and not, every datatype, each of the
//                                         comma-separated counts; every rank checks its output
//                                         byte for byte. With broadcast:hier (or broadcast:tree
//                                         on hosts of 2^k ranks) on simulated hosts
//                                         of equal size (CHORUS_TEST_HOST_OF), also what crossed
//                                         hosts: the whole buffer into the rank of the root's
//                                         local index on every other host, nothing else.
//   chorus_mp_worker reduce counts spec
//                                         Reduce (CHORUS_ALGO=spec), every operator, root,
//                                         datatype and count, in place and not, checked exactly
//                                         (coll_check.h); with reduce:hier (or reduce:tree, hosts
//                                         of 2^k ranks) on simulated hosts,
//                                         also the bytes sent across hosts.
//   chorus_mp_worker compressed           the compressed collectives (compress_check.h): error
//                                         bound, identical results, volume, non-finite blocks,
//                                         error feedback.
//   chorus_mp_worker ep                   MoE dispatch and combine (ep_check.h): every routing
//                                         and datatype checked against each rank's own
//                                         reference; outputs allocated during the call (and
//                                         a failed allocation); bad input refused on every
//                                         rank. Then the verbs byte counters: with
//                                         CHORUS_TEST_EP_ZERO_COPY=1 this rank must have sent
//                                         and received EP tokens zero copy (its staging area
//                                         is registered).
//   chorus_mp_worker ep-ll                the same in low-latency mode (ep_ll_check.h), two
//                                         micro-batches in flight with hooks, and (with a
//                                         forced CHORUS_TRANSPORT) the bytes the communicator
//                                         carried: none of a dispatch's messages over SHM
//                                         (written into the peers' buffers), all of them
//                                         otherwise or when the ranks' slots differ; the same verbs
//                                         counters (its messages are all under the default
//                                         CHORUS_IB_RDV_BYTES: zero copy only below it).
//   chorus_mp_worker topology file|measured|refused
//                                         CHORUS_TOPO_FILE at creation: the cost model the
//                                         file's, measured, or creation refused on every rank.
//   chorus_mp_worker zero-copy [count]    Send/Recv, AllGather and AlltoAll of `count` floats
//                                         per rank over verbs, checked; then the verbs byte
//                                         counters: with CHORUS_TEST_REGISTERED=1 no payload
//                                         byte may have gone through a ring (all by zero copy),
//                                         without it none by zero copy.
#include <chorus/compress.h>
#include <chorus/launch.h>
#include <fmt/format.h>
#include <strings.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algo/tuner.h"
#include "api/api_util.h"
#include "common/params.h"
#include "core/comm.h"
#include "topo/cluster.h"
#include "support/coll_check.h"
#include "support/compress_check.h"
#include "support/ep_check.h"
#include "support/ep_ll_check.h"
#include "support/identical_check.h"
#include "support/test_hosts.h"
#if CHORUS_MP_VERBS
#include "transports/verbs/verbs_stats.h"
#endif

using namespace chorus::test;

namespace {

int run_matrix(ncclComm_t comm, int rank, int nranks, size_t max_count, bool streams) {
  const Coll colls[] = {Coll::kAllReduce, Coll::kReduceScatter, Coll::kAllGather,
                        Coll::kBroadcast, Coll::kReduce,        Coll::kAlltoAll,
                        Coll::kGather,    Coll::kScatter,       Coll::kSendRecv};
  const size_t counts[] = {0, 1, 7, 1023, max_count};
  cudaStream_t stream = nullptr;
  if (streams && chorusStreamCreate(&stream) != ncclSuccess) return 3;
  int failures = 0, cases = 0;
  for (Coll coll : colls) {
    for (ncclDataType_t dtype : all_datatypes()) {
      for (int op = 0; op < (coll_reduces(coll) ? kNumTestOps : 1); ++op) {
        for (size_t count : counts) {
          const bool both = coll == Coll::kAllGather || coll == Coll::kReduceScatter ||
                            coll == Coll::kAlltoAll;
          for (int in_place = 0; in_place < (both ? 2 : 1); ++in_place) {
            Case c;
            c.coll = coll;
            c.dtype = dtype;
            c.op = op;
            c.count = count;
            c.in_place = in_place != 0;
            c.root = coll_rooted(coll) ? static_cast<int>((dtype + count + op) % nranks) : 0;
            c.stream = stream;
            std::string error = run_case(comm, c);
            ++cases;
            if (!error.empty()) {
              if (++failures <= 5) fmt::print(stderr, "rank {}: {}: {}\n", rank, c.describe(), error);
              if (error.find("returned") != std::string::npos) return 1;  // the comm is broken
            }
          }
        }
      }
    }
  }
  if (stream) chorusStreamDestroy(stream);
  if (rank == 0) fmt::print("rank 0: {} cases, {} failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}

// Every rank switches CHORUS_ALGO at the same point of its sequence of calls, so all ranks run
// each call with the same algorithm.
std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::string item;
  for (char c : list + ",") {
    if (c != ',') {
      item += c;
    } else if (!item.empty()) {
      out.push_back(item);
      item.clear();
    }
  }
  return out;
}

// `counts`, `specs`: comma-separated counts and CHORUS_ALGO values (empty: the defaults).
int run_identical(ncclComm_t comm, int rank, int nranks, const std::string& counts,
                  const std::string& specs) {
  std::vector<size_t> count_list;
  for (const std::string& c : split(counts)) count_list.push_back(std::strtoull(c.c_str(), nullptr, 0));
  if (count_list.empty()) count_list = {1001, 4096};
  const std::vector<std::string> spec_list =
      specs.empty() ? allreduce_algorithm_specs() : split(specs);
  int failures = 0;
  for (const std::string& spec : spec_list) {
    setenv("CHORUS_ALGO", spec.c_str(), 1);
    chorus::params::reload_for_testing();
    uint64_t seed = 7919 * static_cast<uint64_t>(nranks);
    std::string error = check_allreduce_identical(comm, seed, count_list);
    if (!error.empty()) {
      ++failures;
      fmt::print(stderr, "rank {}: CHORUS_ALGO={}:\n{}", rank, spec, error);
      if (error.find("returned") != std::string::npos) return 1;  // the comm is broken
    }
  }
  if (rank == 0)
    fmt::print("rank 0: {} algorithms, {} with failures\n", spec_list.size(), failures);
  return failures == 0 ? 0 : 1;
}

// The byte i of a Broadcast's input from `root` (a splitmix64 stream per call).
uint8_t broadcast_byte(uint64_t call, size_t i) {
  uint64_t z = call * 0x9E3779B97F4A7C15ull + (i / 8 + 1) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> (8 * (i % 8)));
}

// Simulated hosts (CHORUS_TEST_HOST_OF): each rank's host and local index (its place among its
// host's ranks); `hier` when there are several hosts of equal size, two ranks or more each
// (where the hierarchical algorithms run).
struct TestHosts {
  std::vector<std::string> host_of;
  std::vector<int> local_index;
  bool hier = false;
  // Hosts of 2^k ranks: a binomial tree in the host order of the tree algorithms
  // (algo::host_tree_order) then crosses hosts once into each host, at the rank of the root's
  // local index, as the hierarchical algorithms do.
  bool power_of_two = false;
  explicit TestHosts(int nranks) : host_of(test_host_of()), local_index(host_of.size()) {
    const auto size = [&](size_t r) { return std::count(host_of.begin(), host_of.end(), host_of[r]); };
    hier = host_of.size() == static_cast<size_t>(nranks) && size(0) > 1 && size(0) < nranks;
    power_of_two = hier && (size(0) & (size(0) - 1)) == 0;
    for (size_t r = 0; hier && r < host_of.size(); ++r) {
      local_index[r] = static_cast<int>(std::count(host_of.begin(), host_of.begin() + r, host_of[r]));
      hier = size(r) == size(0);
    }
  }
  // A rank of the root's local index on another host than the root's.
  bool leader(int rank, int root) const {
    return local_index[rank] == local_index[root] && host_of[rank] != host_of[root];
  }
  // Bytes this rank received from (or sent to) ranks of other hosts since the counters' reset.
  unsigned long long across(ncclComm_t comm, int rank, bool sent) const {
    unsigned long long bytes = 0;
    for (size_t peer = 0; peer < host_of.size(); ++peer) {
      chorusByteCounters_t b{};
      if (host_of[peer] == host_of[rank]) continue;
      if (chorusCommGetByteCounters(comm, static_cast<int>(peer), &b) != ncclSuccess) return ~0ull;
      bytes += sent ? b.dataBytesSent : b.dataBytesReceived;
    }
    return bytes;
  }
};

// What the Broadcast and Reduce modes share: the counts, CHORUS_ALGO=spec, the simulated
// hosts, and whether to check what crossed hosts: with <coll>:hier on hosts of equal size, or
// <coll>:tree on hosts of 2^k ranks (both cross into each host once, at one rank).
struct RootedSetup {
  std::vector<size_t> count_list;
  TestHosts hosts;
  bool check_volume = false;
  RootedSetup(int nranks, const std::string& counts, const std::string& spec,
              const std::string& coll)
      : hosts(nranks) {
    for (const std::string& c : split(counts))
      count_list.push_back(std::strtoull(c.c_str(), nullptr, 0));
    setenv("CHORUS_ALGO", spec.c_str(), 1);
    chorus::params::reload_for_testing();
    check_volume = hosts.hier && (spec == coll + ":hier" ||
                                  (spec == coll + ":tree" && hosts.power_of_two));
  }
};

int run_broadcast(ncclComm_t comm, int rank, int nranks, const std::string& counts,
                  const std::string& spec) {
  const RootedSetup setup(nranks, counts, spec, "broadcast");
  const TestHosts& hosts = setup.hosts;
  const bool check_volume = setup.check_volume;
  int failures = 0, cases = 0;
  uint64_t call = 0;
  for (ncclDataType_t dtype : all_datatypes()) {
    const size_t elem = chorus::verify::datatype_size(dtype);
    for (size_t count : setup.count_list) {
      const size_t bytes = count * elem;
      std::vector<uint8_t> in(bytes);
      for (int root = 0; root < nranks; ++root) {
        for (int in_place = 0; in_place < 2; ++in_place, ++call) {
          ++cases;
          // Guard bytes past the end stay untouched: one more element, filled alike everywhere.
          std::vector<uint8_t> buf(bytes + elem, 0xA5);
          uint8_t* recv = buf.data();
          const uint8_t* send = in_place ? recv : in.data();
          if (rank == root) {
            uint8_t* src = in_place ? recv : in.data();
            for (size_t i = 0; i < bytes; ++i) src[i] = broadcast_byte(call, i);
          }
          if (check_volume) chorusCommResetByteCounters(comm);
          ncclResult_t r = ncclBroadcast(send, recv, count, dtype, root, comm, nullptr);
          if (r != ncclSuccess) {
            fmt::print(stderr, "rank {}: Broadcast of {} x dtype {} from {} returned {}: {}\n", rank,
                       count, static_cast<int>(dtype), root, static_cast<int>(r),
                       ncclGetLastError(comm));
            return 1;  // the comm is broken
          }
          size_t wrong = 0, first = bytes;
          for (size_t i = 0; i < bytes; ++i) {
            if (recv[i] != broadcast_byte(call, i)) {
              ++wrong;
              first = std::min(first, i);
            }
          }
          for (size_t i = bytes; i < bytes + elem; ++i) wrong += recv[i] != 0xA5 ? 1 : 0;
          if (check_volume) {
            // Bytes this rank received from other hosts: the buffer once on the rank of the
            // root's local index of every host but the root's.
            const unsigned long long across = hosts.across(comm, rank, false);
            const unsigned long long want = hosts.leader(rank, root) ? bytes : 0;
            if (across != want && ++failures <= 5)
              fmt::print(stderr, "rank {}: Broadcast of {} bytes from {}: {} bytes from other "
                         "hosts, want {}\n", rank, bytes, root, across, want);
          }
          if (wrong > 0 && ++failures <= 5)
            fmt::print(stderr, "rank {}: {} Broadcast of {} x dtype {} from {}: {} bytes wrong, "
                       "the first at {}\n", rank, in_place ? "in-place" : "out-of-place", count,
                       static_cast<int>(dtype), root, wrong, first);
        }
      }
    }
  }
  if (rank == 0) fmt::print("rank 0: {} Broadcast cases ({}), {} failures\n", cases, spec, failures);
  return failures == 0 ? 0 : 1;
}

// Reduce (CHORUS_ALGO=spec) with every operator, from every root, in place and not, every
// datatype, each count: the result checked exactly (coll_check.h); with reduce:hier on
// simulated hosts of equal size, also what crossed hosts: the buffer once from the rank of the
// root's local index on every other host, nothing else.
int run_reduce(ncclComm_t comm, int rank, int nranks, const std::string& counts,
               const std::string& spec) {
  const RootedSetup setup(nranks, counts, spec, "reduce");
  const TestHosts& hosts = setup.hosts;
  const bool check_volume = setup.check_volume;
  int failures = 0, cases = 0;
  for (ncclDataType_t dtype : all_datatypes()) {
    for (int op = 0; op < kNumTestOps; ++op) {
      for (size_t count : setup.count_list) {
        for (int root = 0; root < nranks; ++root) {
          for (int in_place = 0; in_place < 2; ++in_place) {
            Case c;
            c.coll = Coll::kReduce;
            c.dtype = dtype;
            c.op = op;
            c.count = count;
            c.root = root;
            c.in_place = in_place != 0;
            ++cases;
            if (check_volume) chorusCommResetByteCounters(comm);
            std::string error = run_case(comm, c);
            if (error.empty() && check_volume) {
              const unsigned long long across = hosts.across(comm, rank, true);
              const unsigned long long want =
                  hosts.leader(rank, root) ? count * chorus::verify::datatype_size(dtype) : 0;
              if (across != want)
                error = fmt::format("{} bytes sent to other hosts, want {}", across, want);
            }
            if (!error.empty()) {
              if (++failures <= 5) fmt::print(stderr, "rank {}: {}: {}\n", rank, c.describe(), error);
              if (error.find("returned") != std::string::npos) return 1;  // the comm is broken
            }
          }
        }
      }
    }
  }
  if (rank == 0) fmt::print("rank 0: {} Reduce cases ({}), {} failures\n", cases, spec, failures);
  return failures == 0 ? 0 : 1;
}

#if CHORUS_MP_VERBS
// Every message here is at least CHORUS_IB_RDV_BYTES: between registered buffers each goes
// zero copy, else through the rings. What this rank receives at the least: one message of the
// Send/Recv ring, and nranks - 1 blocks per AllGather (in place and not) and AlltoAll (not in
// place: in place, it sends from a copy of its input in scratch memory, which is unregistered).
int run_zero_copy(ncclComm_t comm, int rank, int nranks, size_t count) {
  using chorus::verbs::ByteCounts;
  const bool registered = std::getenv("CHORUS_TEST_REGISTERED") != nullptr &&
                          std::strcmp(std::getenv("CHORUS_TEST_REGISTERED"), "1") == 0;
  const ByteCounts before = chorus::verbs::process_byte_counts();
  int failures = 0;
  for (Coll coll : {Coll::kSendRecv, Coll::kAllGather, Coll::kAlltoAll}) {
    for (int in_place = 0; in_place < (coll == Coll::kAllGather ? 2 : 1); ++in_place) {
      Case c;
      c.coll = coll;
      c.dtype = ncclFloat;
      c.count = count;
      c.in_place = in_place != 0;
      std::string error = run_case(comm, c);
      if (!error.empty()) {
        ++failures;
        fmt::print(stderr, "rank {}: {}: {}\n", rank, c.describe(), error);
        if (error.find("returned") != std::string::npos) return 1;
      }
    }
  }
  const ByteCounts after = chorus::verbs::process_byte_counts();
  const uint64_t ring_sent = after.ring_sent - before.ring_sent;
  const uint64_t ring_received = after.ring_received - before.ring_received;
  const uint64_t zc_sent = after.zero_copy_sent - before.zero_copy_sent;
  const uint64_t zc_received = after.zero_copy_received - before.zero_copy_received;
  const uint64_t least = count * sizeof(float) * (1 + 3 * static_cast<uint64_t>(nranks - 1));
  fmt::print("rank {}: verbs payload bytes ({} buffers): through rings {} sent, {} received; "
             "zero copy {} sent, {} received (at least {} expected one way)\n",
             rank, registered ? "registered" : "unregistered", ring_sent, ring_received, zc_sent,
             zc_received, least);
  const uint64_t way = registered ? zc_received : ring_received;
  const uint64_t other = registered ? ring_sent + ring_received : zc_sent + zc_received;
  if (way < least || other != 0) {
    fmt::print(stderr, "rank {}: expected at least {} bytes {} and none the other way\n", rank,
               least, registered ? "zero copy" : "through the rings");
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

// After the EP checks over verbs: the payload bytes each way since `before`, printed; with
// CHORUS_TEST_EP_ZERO_COPY=1, "" only if some went zero copy both ways and, of the bytes this
// rank sent, more went zero copy than through the rings. The DeepEP-shaped case of
// check_ep_matrix dispatches and combines messages of hundreds of KiB between staging areas,
// registered by the EP buffer (combine copies its rows into the area first): each is
// RDMA-written into the receiver's area. The smaller ones (under CHORUS_IB_RDV_BYTES) go
// through the rings. (With combine's rows sent from the caller's x, through the rings, this
// rank sent 2-5x more through the rings than zero copy; with them staged, 1.8-2x less.)
std::string check_ep_zero_copy(int rank, const chorus::verbs::ByteCounts& before) {
  const chorus::verbs::ByteCounts after = chorus::verbs::process_byte_counts();
  const uint64_t zc_sent = after.zero_copy_sent - before.zero_copy_sent;
  const uint64_t zc_received = after.zero_copy_received - before.zero_copy_received;
  const char* want = std::getenv("CHORUS_TEST_EP_ZERO_COPY");
  const bool required = want != nullptr && std::strcmp(want, "1") == 0;
  if (!required && after.ring_sent == before.ring_sent && zc_sent == 0) return "";  // no verbs
  fmt::print("rank {}: EP verbs payload bytes: through rings {} sent, {} received; zero copy {} "
             "sent, {} received\n",
             rank, after.ring_sent - before.ring_sent, after.ring_received - before.ring_received,
             zc_sent, zc_received);
  const uint64_t ring_sent = after.ring_sent - before.ring_sent;
  if (!required || (zc_sent > 0 && zc_received > 0 && zc_sent > ring_sent)) return "";
  return fmt::format("EP tokens went zero copy over verbs only for {} bytes sent ({} through the "
                     "rings) and {} received\n",
                     zc_sent, ring_sent, zc_received);
}
#endif

// CHORUS_TEST_HOST_OF (support/test_hosts.h): this rank's CHORUS_HOST_ID, set before anything
// reads the host identity. CHORUS_TEST_TOPO_FILE_OF: this rank's CHORUS_TOPO_FILE (an empty
// item: none).
void place_on_test_host() {
  const std::vector<std::string> hosts = test_host_of();
  const std::vector<std::string> topo = test_env_list("CHORUS_TEST_TOPO_FILE_OF");
  const char* rank = std::getenv("CHORUS_RANK");
  if (rank == nullptr) return;
  const size_t r = std::strtoul(rank, nullptr, 10);
  if (r < hosts.size()) setenv("CHORUS_HOST_ID", ("test-host-" + hosts[r]).c_str(), 1);
  if (r < topo.size()) {
    if (topo[r].empty()) {
      unsetenv("CHORUS_TOPO_FILE");
    } else {
      setenv("CHORUS_TOPO_FILE", topo[r].c_str(), 1);
    }
  }
}

// CHORUS_TOPO_FILE at communicator creation: `expect` is "file" (the cost model is the
// file's: its slowest rail, its intra-host link, its rails), "measured" (the file does not
// describe the communicator: it is measured), or "refused" (creation fails on every rank with
// an error that names CHORUS_TOPO_FILE: a bad file somewhere, or different files). Then an
// AllReduce of non-integer floats, checked, on a communicator that was created.
int run_topology(const std::string& expect, const ncclUniqueId& id, int rank, int nranks) {
  ncclComm_t comm;
  const ncclResult_t init = ncclCommInitRank(&comm, nranks, id, rank);
  const std::string path = std::getenv("CHORUS_TOPO_FILE") ? std::getenv("CHORUS_TOPO_FILE") : "";
  if (expect == "refused") {
    if (init == ncclSuccess) {
      fmt::print(stderr, "rank {}: created a communicator with CHORUS_TOPO_FILE '{}'\n", rank, path);
      ncclCommDestroy(comm);
      return 1;
    }
    const std::string error = ncclGetLastError(nullptr);
    const bool named = error.find("CHORUS_TOPO_FILE") != std::string::npos;
    const bool code = init == ncclInvalidArgument || init == ncclInvalidUsage;
    fmt::print("rank {}: refused ({}): {}\n", rank, ncclGetErrorString(init), error);
    return named && code ? 0 : 1;
  }
  if (init != ncclSuccess) {
    fmt::print(stderr, "rank {}: ncclCommInitRank: {}\n", rank, ncclGetLastError(nullptr));
    return 1;
  }
  int failures = 0;
  chorus::algo::CostModel m;
  int shape_rails = 0;
  {
    auto c = chorus::api::find_comm(comm);
    if (!c.ok()) return 1;
    m = (*c)->cost_model();
    shape_rails = (*c)->shape().rails;
  }
  if (expect == "file") {
    auto cluster = chorus::topo::read_cluster_file(path);
    if (!cluster.ok()) return 1;
    const chorus::algo::CostModel want = chorus::algo::model_of(*cluster);
    const bool hosts = cluster->hosts().size() > 1;
    const bool same = m.source == "topology file " + path &&
                      m.alpha_us == (hosts ? want.alpha_us : want.intra_alpha_us) &&
                      m.beta_gbps == (hosts ? want.beta_gbps : want.intra_beta_gbps) &&
                      m.intra_alpha_us == want.intra_alpha_us &&
                      m.intra_beta_gbps == want.intra_beta_gbps &&
                      m.rails == (hosts ? static_cast<int>(cluster->rails().size()) : 1) &&
                      shape_rails == m.rails;
    if (!same) {
      fmt::print(stderr, "rank {}: cost model {}, not the file's\n", rank, m.to_string());
      ++failures;
    }
  } else if (m.source.rfind("measured", 0) != 0 || m.rails != 1) {
    fmt::print(stderr, "rank {}: cost model {}, not measured\n", rank, m.to_string());
    ++failures;
  }
  // 0.25 + 0.5 r: exact in float, so the sum is too.
  const size_t count = 1001;
  std::vector<float> in(count, 0.25f + 0.5f * static_cast<float>(rank)), out(count, -1.0f);
  const float want = 0.25f * nranks + 0.25f * nranks * (nranks - 1);
  if (ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess ||
      std::count(out.begin(), out.end(), want) != static_cast<long>(count)) {
    fmt::print(stderr, "rank {}: AllReduce gave {}, want {}\n", rank, out[0], want);
    ++failures;
  }
  ncclCommDestroy(comm);
  if (failures == 0) fmt::print("rank {}: cost model {}\n", rank, m.to_string());
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  place_on_test_host();
  if (argc < 2) {
    fmt::print(stderr,
               "usage: {} matrix|stream-matrix [max_count] | identical [counts [algos]] | broadcast|reduce [counts [algo]] | compressed | ep | zero-copy "
               "[count]\n",
               argv[0]);
    return 2;
  }
  ncclUniqueId id;
  int rank = 0, nranks = 0;
  if (chorusLaunchInfo(&id, &rank, &nranks) != ncclSuccess) {
    fmt::print(stderr, "{}\n", ncclGetLastError(nullptr));
    return 2;
  }
  if (std::strcmp(argv[1], "topology") == 0)
    return run_topology(argc > 2 ? argv[2] : "file", id, rank, nranks);
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) {
    fmt::print(stderr, "rank {}: ncclCommInitRank: {}\n", rank, ncclGetLastError(nullptr));
    return 1;
  }
  size_t max_count = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 100003;
  int rc = 2;
  if (std::strcmp(argv[1], "matrix") == 0) rc = run_matrix(comm, rank, nranks, max_count, false);
  if (std::strcmp(argv[1], "stream-matrix") == 0) rc = run_matrix(comm, rank, nranks, max_count, true);
  if (std::strcmp(argv[1], "identical") == 0)
    rc = run_identical(comm, rank, nranks, argc > 2 ? argv[2] : "", argc > 3 ? argv[3] : "");
  if (std::strcmp(argv[1], "broadcast") == 0)
    rc = run_broadcast(comm, rank, nranks, argc > 2 ? argv[2] : "0,1,7,1023,100003",
                       argc > 3 ? argv[3] : "broadcast:hier");
  if (std::strcmp(argv[1], "reduce") == 0)
    rc = run_reduce(comm, rank, nranks, argc > 2 ? argv[2] : "0,1,7,1023,100003",
                    argc > 3 ? argv[3] : "reduce:hier");
  if (std::strcmp(argv[1], "compressed") == 0) {
    std::string f = check_compressed_matrix(comm, 77, /*large=*/nranks <= 4) +
                    check_compressed_volume(comm) + check_compressed_nonfinite(comm) +
                    check_error_feedback(comm);
    if (!f.empty()) fmt::print(stderr, "rank {}:\n{}", rank, f);
    rc = f.empty() ? 0 : 1;
  }
  if (std::strcmp(argv[1], "ep") == 0) {
#if CHORUS_MP_VERBS
    const chorus::verbs::ByteCounts before = chorus::verbs::process_byte_counts();
#endif
    std::string f = check_ep_matrix(comm, 4242) + check_ep_async(comm) +
                    check_ep_allocate(comm) + check_ep_bad_input(comm);
#if CHORUS_MP_VERBS
    f += check_ep_zero_copy(rank, before);
#endif
    if (!f.empty()) fmt::print(stderr, "rank {}:\n{}", rank, f);
    rc = f.empty() ? 0 : 1;
  }
  if (std::strcmp(argv[1], "ep-ll") == 0) {
#if CHORUS_MP_VERBS
    const chorus::verbs::ByteCounts before = chorus::verbs::process_byte_counts();
#endif
    // A forced transport: shared memory (one host) maps the peers' buffers unless
    // CHORUS_EP_MAP=0; any other carries everything itself.
    const char* transport = std::getenv("CHORUS_TRANSPORT");
    const char* map = std::getenv("CHORUS_EP_MAP");
    const bool forced = transport != nullptr && strcasecmp(transport, "auto") != 0 &&
                        strcasecmp(transport, "direct") != 0;
    const bool mapped = forced && strcasecmp(transport, "shm") == 0 &&
                        !(map != nullptr && std::strcmp(map, "0") == 0);
    std::string f = check_ep_ll_matrix(comm, 4343) + check_ep_ll_hooks(comm, 4344) +
                    (forced ? check_ep_ll_paths(comm, 4345, mapped) : "") +
                    check_ep_ll_bad_input(comm);
#if CHORUS_MP_VERBS
    f += check_ep_zero_copy(rank, before);
#endif
    if (!f.empty()) fmt::print(stderr, "rank {}:\n{}", rank, f);
    rc = f.empty() ? 0 : 1;
  }
#if CHORUS_MP_VERBS
  if (std::strcmp(argv[1], "zero-copy") == 0) {
    rc = run_zero_copy(comm, rank, nranks, argc > 2 ? max_count : 262144);
  }
#endif
  if (ncclCommDestroy(comm) != ncclSuccess) {
    fmt::print(stderr, "rank {}: ncclCommDestroy: {}\n", rank, ncclGetLastError(nullptr));
    return 1;
  }
  return rc;
}
