// SPDX-License-Identifier: Apache-2.0
// Multi-process: the collective matrix (smaller than the threaded one) across processes, over
// shared memory and over TCP (forced), started by the project's launcher.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "tools/launcher.h"
#include "transports/registry.h"

namespace {

// Chorus's entries in /dev/shm (it makes none: its segments are memfds). Other programs'
// entries (e.g. Open MPI's) are not ours to judge.
std::set<std::string> shm_entries() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).find("chorus") != std::string::npos) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

// `args`: the suite's arguments (mp_worker.cc), e.g. the matrix's largest count.
void run_workers(int nranks, const std::string& transport, const std::string& suite,
                 const std::vector<std::string>& env = {},
                 const std::vector<std::string>& args = {}) {
  auto before = shm_entries();
  chorus::launch::Options o;
  o.nranks = nranks;
  o.argv = {CHORUS_MP_WORKER, suite};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = env;
  o.env.push_back("CHORUS_TRANSPORT=" + transport);
  o.timeout_ms = 600000;
  auto result = chorus::launch::run(o);
  REQUIRE(result.ok());
  for (const auto& r : *result) {
    INFO(r.describe());
    CHECK(r.ok());
  }
  CHECK(shm_entries() == before);  // nothing left behind in /dev/shm
  CHECK(before.empty());
}

}  // namespace

TEST_CASE("multi-process matrix over shared memory with 2 ranks", "[mp][shm]") { run_workers(2, "SHM", "matrix"); }
TEST_CASE("multi-process matrix over shared memory with 3 ranks", "[mp][shm]") { run_workers(3, "SHM", "matrix"); }
TEST_CASE("multi-process matrix over shared memory with 4 ranks", "[mp][shm]") { run_workers(4, "SHM", "matrix"); }
TEST_CASE("multi-process matrix over TCP with 2 ranks", "[mp][tcp]") { run_workers(2, "TCP", "matrix"); }
TEST_CASE("multi-process matrix over TCP with 3 ranks", "[mp][tcp]") { run_workers(3, "TCP", "matrix"); }
TEST_CASE("multi-process matrix on host streams over shared memory with 3 ranks", "[mp][shm][stream]") {
  run_workers(3, "SHM", "stream-matrix");
}
TEST_CASE("multi-process matrix with automatic transports with 4 ranks", "[mp]") { run_workers(4, "AUTO", "matrix"); }
TEST_CASE("multi-process matrix over shared memory, every message by reference", "[mp][shm]") {
  run_workers(3, "SHM", "matrix", {"CHORUS_SHM_CMA_BYTES=1"});
}
// Registered ncclMemAlloc buffers: messages from them are read by the receiver through its own
// mapping of the sender's memfd (one copy); SHM_MAP_BYTES=1 sends every message that way.
TEST_CASE("multi-process matrix over shared memory, registered buffers, every message mapped",
          "[mp][shm][reg]") {
  run_workers(3, "SHM", "matrix", {"CHORUS_TEST_REGISTERED=1", "CHORUS_SHM_MAP_BYTES=1"});
}
TEST_CASE("multi-process matrix on host streams over shared memory, registered buffers",
          "[mp][shm][reg][stream]") {
  run_workers(2, "SHM", "stream-matrix", {"CHORUS_TEST_REGISTERED=1"});
}

TEST_CASE("multi-process matrix over shared memory, no message by reference", "[mp][shm]") {
  run_workers(2, "SHM", "matrix", {"CHORUS_SHM_CMA_BYTES=0"});
}

// Several paths per peer (transports/chunk.h): messages over 64 KiB travel as chunks over all
// of them at once and are matched by the message they name.
const std::vector<std::string> kThreePaths = {"CHORUS_NCHANNELS=3", "CHORUS_PATH_CHUNK_BYTES=65536"};
TEST_CASE("multi-process matrix over TCP, chunks over 3 paths per peer", "[mp][tcp][chunk]") {
  run_workers(3, "TCP", "matrix", kThreePaths);
}
TEST_CASE("multi-process matrix over shared memory, registered buffers, chunks over 3 paths",
          "[mp][shm][chunk][reg]") {
  std::vector<std::string> env = kThreePaths;
  env.push_back("CHORUS_TEST_REGISTERED=1");
  run_workers(2, "SHM", "matrix", env);
}
TEST_CASE("AllReduce is bit-identical on every rank over TCP, chunks over 3 paths",
          "[mp][tcp][chunk][identical]") {
  run_workers(4, "TCP", "identical", kThreePaths);
}

// AllReduce results bit-identical on every rank, every algorithm, float datatype and operator
// (tests/support/identical_check.h; 2 to 8 ranks as threads in tests/ranks/identical_test.cc).
TEST_CASE("AllReduce is bit-identical on every rank over shared memory with 2 ranks", "[mp][shm][identical]") {
  run_workers(2, "SHM", "identical");
}
TEST_CASE("AllReduce is bit-identical on every rank over shared memory with 3 ranks", "[mp][shm][identical]") {
  run_workers(3, "SHM", "identical");
}
TEST_CASE("AllReduce is bit-identical on every rank over shared memory with 4 ranks", "[mp][shm][identical]") {
  run_workers(4, "SHM", "identical");
}
TEST_CASE("AllReduce is bit-identical on every rank over shared memory with 8 ranks", "[mp][shm][identical]") {
  run_workers(8, "SHM", "identical");
}
TEST_CASE("AllReduce is bit-identical on every rank over TCP with 3 ranks", "[mp][tcp][identical]") {
  run_workers(3, "TCP", "identical");
}

// The compressed collectives on processes (tests/support/compress_check.h; threads:
// tests/ranks/compressed_test.cc).
// Hosts simulated by CHORUS_HOST_ID (mp_worker.cc): ranks of one "host" use shared memory,
// the others TCP, and the hierarchical algorithms run their stages over both.
TEST_CASE("multi-process matrix on 2 hosts x 2 ranks", "[mp][hosts]") {
  run_workers(4, "AUTO", "matrix", {"CHORUS_TEST_HOST_OF=0,1,0,1"});
}
TEST_CASE("multi-process matrix, hierarchical algorithms forced, on 3 hosts x 2 ranks", "[mp][hosts]") {
  run_workers(6, "AUTO", "matrix",
              {"CHORUS_TEST_HOST_OF=0,1,2,2,1,0",
               "CHORUS_ALGO=allreduce:hier,reducescatter:hier,allgather:hier,broadcast:hier,reduce:hier,"
               "alltoall:hier"});
}
TEST_CASE("multi-process matrix, hierarchical algorithms forced, on 2 hosts x 3 ranks", "[mp][hosts]") {
  run_workers(6, "AUTO", "matrix",
              {"CHORUS_TEST_HOST_OF=0,0,0,1,1,1",
               "CHORUS_ALGO=allreduce:hier,reducescatter:hier,allgather:hier,broadcast:hier,reduce:hier,"
               "alltoall:hier"});
}
// The hierarchical Broadcast (broadcast_hier.cc) of random bytes from every root, in place and
// not, every datatype; hosts interleaved in rank order; every rank checks its output and what
// crossed hosts. Then counts large enough for its pipeline (2 MiB pieces of whole 512 KiB chunks,
// at most 8), with short last chunks and pieces, under the model of 1 Gbit/s Ethernet between
// hosts (a tuner file), which plans a tree across 2 hosts (one message per piece) and a chain
// across 3, a tree within hosts of 2 ranks and a chain within hosts of 3.
struct EthernetTunerFile {
  std::string path;
  EthernetTunerFile() {
    char name[] = "/tmp/chorus-tuner-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    const std::string text = "tcp 25 0.125\nshm 1 8\ndirect 1 8\nreduce 10\n";
    REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    close(fd);
    path = name;
  }
  ~EthernetTunerFile() { std::remove(path.c_str()); }
};
namespace {
// CHORUS_TEST_NARROW=1: the ASan stage, where the pipelined tests below take minutes. They
// then run two of their three host layouts, which between them plan every stage shape (a chain
// across 3 hosts with a tree within, a tree across 2 hosts with a chain within), with fewer
// datatypes: the Broadcast int8 and double (the smallest and largest element size), the Reduce
// double.
bool narrow() {
  const char* v = std::getenv("CHORUS_TEST_NARROW");
  return v != nullptr && std::string(v) == "1";
}
// The host layouts: 2 x 2, 3 x 2 round robin and 2 x 3 alternating.
std::vector<const char*> pipelined_shapes() {
  if (narrow()) return {"0,1,2,0,1,2", "1,0,1,0,1,0"};
  return {"0,0,1,1", "0,1,2,0,1,2", "1,0,1,0,1,0"};
}
}  // namespace
TEST_CASE("hierarchical Broadcast from every root on 2 hosts x 2 ranks", "[mp][hosts]") {
  run_workers(4, "AUTO", "broadcast", {"CHORUS_TEST_HOST_OF=0,1,1,0"},
              {"0,1,7,1023,100003", "broadcast:hier"});
}
TEST_CASE("hierarchical Broadcast from every root on 3 hosts x 2 ranks", "[mp][hosts]") {
  run_workers(6, "AUTO", "broadcast", {"CHORUS_TEST_HOST_OF=0,1,2,2,1,0"},
              {"0,1,7,1023,100003", "broadcast:hier"});
}
TEST_CASE("hierarchical Broadcast in pipelined pieces on 2 x 2, 3 x 2 and 2 x 3 ranks",
          "[mp][hosts]") {
  const EthernetTunerFile tuner;
  for (const char* hosts : pipelined_shapes()) {
    const int n = static_cast<int>(std::string(hosts).size() + 1) / 2;
    run_workers(n, "AUTO", "broadcast",
                {std::string("CHORUS_TEST_HOST_OF=") + hosts, "CHORUS_TUNER_FILE=" + tuner.path,
                 narrow() ? "CHORUS_TEST_DATATYPES=int8,double"
                          : "CHORUS_TEST_DATATYPES=int8,float,double"},
                {"2500007", "broadcast:hier"});
  }
}
// The hierarchical Reduce (reduce_hier.cc) the same way: every operator, root and datatype, in
// place and not, checked exactly, and the bytes sent across hosts; then in pipelined pieces
// under the Ethernet model (the same plans as the Broadcast's: tree or chain across, tree or
// chain within).
TEST_CASE("hierarchical Reduce from every root on 2 hosts x 2 ranks", "[mp][hosts]") {
  run_workers(4, "AUTO", "reduce", {"CHORUS_TEST_HOST_OF=0,1,1,0"},
              {"0,1,7,1023,100003", "reduce:hier"});
}
TEST_CASE("hierarchical Reduce from every root on 3 hosts x 2 ranks", "[mp][hosts]") {
  run_workers(6, "AUTO", "reduce", {"CHORUS_TEST_HOST_OF=0,1,2,2,1,0"},
              {"0,1,7,1023,100003", "reduce:hier"});
}
TEST_CASE("hierarchical Reduce in pipelined pieces on 2 x 2, 3 x 2 and 2 x 3 ranks",
          "[mp][hosts]") {
  const EthernetTunerFile tuner;
  for (const char* hosts : pipelined_shapes()) {
    const int n = static_cast<int>(std::string(hosts).size() + 1) / 2;
    run_workers(n, "AUTO", "reduce",
                {std::string("CHORUS_TEST_HOST_OF=") + hosts, "CHORUS_TUNER_FILE=" + tuner.path,
                 narrow() ? "CHORUS_TEST_DATATYPES=double"
                          : "CHORUS_TEST_DATATYPES=float,double"},
                {"2500007", "reduce:hier"});
  }
}
TEST_CASE("AllReduce is bit-identical on every rank on 2 hosts x 2 ranks", "[mp][hosts][identical]") {
  run_workers(4, "AUTO", "identical", {"CHORUS_TEST_HOST_OF=0,0,1,1"});
}
// Large enough for the hierarchical AllReduce's pipeline (2 MiB pieces, at most 8), with counts
// that leave short last blocks and pieces (5 of them here); fp32 only.
TEST_CASE("hierarchical AllReduce in pipelined pieces on 2 hosts x 2 ranks", "[mp][hosts][identical]") {
  run_workers(4, "AUTO", "identical",
              {"CHORUS_TEST_HOST_OF=0,1,1,0", "CHORUS_TEST_DATATYPES=float"},
              {"2500007", "allreduce:hier"});
}
TEST_CASE("AllReduce is bit-identical on every rank on 3 hosts x 2 ranks", "[mp][hosts][identical]") {
  run_workers(6, "AUTO", "identical", {"CHORUS_TEST_HOST_OF=0,1,2,2,1,0"});
}
TEST_CASE("AllReduce is bit-identical on every rank on 2 hosts x 3 ranks", "[mp][hosts][identical]") {
  run_workers(6, "AUTO", "identical", {"CHORUS_TEST_HOST_OF=0,0,0,1,1,1"});
}
TEST_CASE("AllReduce is bit-identical on every rank on hosts of 1 and 2 ranks", "[mp][hosts][identical]") {
  run_workers(3, "AUTO", "identical", {"CHORUS_TEST_HOST_OF=0,1,1"});
}
// Ranks round robin over hosts: the tree algorithms run in the comm's ring order (a host's
// ranks together), roots anywhere in it.
TEST_CASE("multi-process matrix, tree algorithms forced, on 3 hosts x 2 ranks round robin",
          "[mp][hosts]") {
  run_workers(6, "AUTO", "matrix",
              {"CHORUS_TEST_HOST_OF=0,1,2,0,1,2",
               "CHORUS_ALGO=allreduce:tree,broadcast:tree,reduce:tree"});
}
// The trees in host order (algo::host_tree_order) on hosts of 2 ranks placed round robin: each
// rank's bytes checked, and what crossed hosts: once into each host, at the rank of the root's
// local index, as the hierarchical algorithms.
TEST_CASE("tree Broadcast from every root crosses into each host once, on 3 hosts x 2 ranks round robin",
          "[mp][hosts]") {
  run_workers(6, "AUTO", "broadcast", {"CHORUS_TEST_HOST_OF=0,1,2,0,1,2"},
              {"1,7,100003", "broadcast:tree"});
}
TEST_CASE("tree Reduce to every root crosses from each host once, on 3 hosts x 2 ranks round robin",
          "[mp][hosts]") {
  run_workers(6, "AUTO", "reduce", {"CHORUS_TEST_HOST_OF=0,1,2,0,1,2"},
              {"1,7,100003", "reduce:tree"});
}

TEST_CASE("compressed collectives over shared memory with 4 ranks", "[mp][shm][compress]") {
  run_workers(4, "SHM", "compressed");
}
// On simulated hosts a compressed AllReduce is the hierarchical one with an FP8 cross-host
// stage: the same error bound, identical ranks, exact bytes within a host.
TEST_CASE("compressed collectives on 2 hosts x 2 ranks", "[mp][hosts][compress]") {
  run_workers(4, "AUTO", "compressed", {"CHORUS_TEST_HOST_OF=0,1,0,1"});
}
TEST_CASE("compressed collectives over shared memory with 8 ranks", "[mp][shm][compress]") {
  run_workers(8, "SHM", "compressed");
}
TEST_CASE("compressed collectives over TCP with 2 ranks", "[mp][tcp][compress]") {
  run_workers(2, "TCP", "compressed");
}
TEST_CASE("compressed collectives over TCP with 3 ranks", "[mp][tcp][compress]") {
  run_workers(3, "TCP", "compressed");
}
// MoE dispatch and combine on processes (tests/support/ep_check.h; threads: tests/ranks/ep_test.cc).
TEST_CASE("ep dispatch and combine over shared memory with 2 ranks", "[mp][shm][ep]") { run_workers(2, "SHM", "ep"); }
TEST_CASE("ep dispatch and combine over shared memory with 4 ranks", "[mp][shm][ep]") { run_workers(4, "SHM", "ep"); }
TEST_CASE("ep dispatch and combine over TCP with 2 ranks", "[mp][tcp][ep]") { run_workers(2, "TCP", "ep"); }
// Combine's rows in pieces of 4 KiB: up to 16 messages a pair, summed as they arrive.
TEST_CASE("ep dispatch and combine over TCP with 4 ranks", "[mp][tcp][ep]") {
  run_workers(4, "TCP", "ep", {"CHORUS_EP_PIECE_BYTES=4096"});
}
// Low-latency mode (tests/support/ep_ll_check.h): the matrix, two micro-batches with hooks, bad input.
TEST_CASE("ep low latency over shared memory with 2 ranks", "[mp][shm][ep]") { run_workers(2, "SHM", "ep-ll"); }
TEST_CASE("ep low latency over shared memory with 4 ranks", "[mp][shm][ep]") { run_workers(4, "SHM", "ep-ll"); }
TEST_CASE("ep low latency over TCP with 2 ranks", "[mp][tcp][ep]") { run_workers(2, "TCP", "ep-ll"); }

// UCX: Chorus's ucx transport between every pair of processes, over UCX's tcp transport on the
// loopback device and over UCX's choice among its shared-memory transports.
namespace {
bool have_ucx() {
  if (chorus::find_transport("ucx") != nullptr) return true;
  WARN("this build has no UCX transport");
  return false;
}
const std::vector<std::string> kUcxTcp = {"UCX_TLS=tcp,self", "UCX_NET_DEVICES=lo"};
// UCX 1.13 picks among posix, sysv and cma; its endpoints then go without peer-failure
// handling, and a dead peer is caught by the communicator's liveness watch.
const std::vector<std::string> kUcxShm = {"UCX_TLS=sm,self"};
}  // namespace
TEST_CASE("multi-process matrix over UCX (tcp) with 2 ranks", "[mp][ucx]") {
  if (have_ucx()) run_workers(2, "UCX", "matrix", kUcxTcp);
}
TEST_CASE("multi-process matrix over UCX (tcp) with 3 ranks", "[mp][ucx]") {
  if (have_ucx()) run_workers(3, "UCX", "matrix", kUcxTcp);
}
TEST_CASE("multi-process matrix on host streams over UCX (tcp) with 3 ranks", "[mp][ucx][stream]") {
  if (have_ucx()) run_workers(3, "UCX", "stream-matrix", kUcxTcp);
}
TEST_CASE("AllReduce is bit-identical on every rank over UCX (tcp) with 3 ranks", "[mp][ucx]") {
  if (have_ucx()) run_workers(3, "UCX", "identical", kUcxTcp);
}
// Registered ncclMemAlloc buffers: their transfers carry UCP memory handles (counted in
// tests/ranks/ucx_registration_test.cc).
TEST_CASE("multi-process matrix over UCX (tcp), registered buffers", "[mp][ucx][reg]") {
  std::vector<std::string> env = kUcxTcp;
  env.push_back("CHORUS_TEST_REGISTERED=1");
  if (have_ucx()) run_workers(2, "UCX", "matrix", env);
}
TEST_CASE("multi-process matrix over UCX (tcp), chunks over 3 paths per peer", "[mp][ucx][chunk]") {
  std::vector<std::string> env = kUcxTcp;
  env.insert(env.end(), kThreePaths.begin(), kThreePaths.end());
  if (have_ucx()) run_workers(2, "UCX", "matrix", env);
}
TEST_CASE("multi-process matrix over UCX (shared memory) with 2 ranks", "[mp][ucx]") {
  if (have_ucx()) run_workers(2, "UCX", "matrix", kUcxShm);
}
TEST_CASE("multi-process matrix over UCX (shared memory) with 4 ranks", "[mp][ucx]") {
  if (have_ucx()) run_workers(4, "UCX", "matrix", kUcxShm);
}
TEST_CASE("AllReduce is bit-identical on every rank over UCX (shared memory) with 4 ranks",
          "[mp][ucx]") {
  if (have_ucx()) run_workers(4, "UCX", "identical", kUcxShm);
}

// Verbs (RDMA): these need a device; ctest runs them under label rdma (tests/rdma/if_rdma.sh
// skips them elsewhere), the test guest over soft-RoCE, which is slow: rings of 8 slots of
// 8 KiB, so that messages up to 8191 doubles (64 KiB) wrap them several times. NCCL's default
// retransmit timeout: no packet is sent before the peer's QP is ready (the side channel's ready
// round), so none waits for a retransmit.
const std::vector<std::string> kVerbs = {"CHORUS_IB_SLOTS=8", "CHORUS_IB_SLOT_BYTES=8192"};
TEST_CASE("multi-process matrix over verbs with 2 ranks", "[rdma][verbs]") {
  run_workers(2, "VERBS", "matrix", kVerbs, {"8191"});
}
TEST_CASE("multi-process matrix over verbs with 4 ranks", "[rdma][verbs]") {
  run_workers(4, "VERBS", "matrix", kVerbs, {"8191"});
}
TEST_CASE("AllReduce is bit-identical on every rank over verbs with 3 ranks", "[rdma][verbs]") {
  run_workers(3, "VERBS", "identical", kVerbs);
}
TEST_CASE("multi-process matrix over verbs with registered buffers and chunks over 2 paths",
          "[rdma][verbs][reg][chunk]") {
  std::vector<std::string> env = kVerbs;
  env.insert(env.end(), {"CHORUS_TEST_REGISTERED=1", "CHORUS_NCHANNELS=2",
                         "CHORUS_PATH_CHUNK_BYTES=65536"});
  run_workers(2, "VERBS", "matrix", env, {"40009"});
}

// Rendezvous (transports/verbs/README.md): messages of at least CHORUS_IB_RDV_BYTES from
// registered memory are written straight into a registered receive buffer. The worker checks
// the verbs byte counters: registered buffers on every rank move no payload byte through the
// rings, unregistered ones move all of it through them (so the check can fail).
TEST_CASE("verbs rendezvous: registered buffers move no byte through the rings",
          "[rdma][verbs][reg][rdv]") {
  std::vector<std::string> env = kVerbs;
  env.insert(env.end(), {"CHORUS_TEST_REGISTERED=1", "NCCL_IB_QPS_PER_CONNECTION=4"});
  run_workers(3, "VERBS", "zero-copy", env, {"262144"});
}
TEST_CASE("verbs rendezvous: unregistered buffers move every byte through the rings",
          "[rdma][verbs][rdv]") {
  run_workers(3, "VERBS", "zero-copy", kVerbs, {"262144"});
}
// The matrix with every message from 4 KiB on announced: zero copy between registered buffers,
// through the ring into reducing receives and scratch buffers; chunks over 2 paths, each
// connection over 4 QPs (NCCL_IB_QPS_PER_CONNECTION: slots and zero-copy parts round robin).
TEST_CASE("multi-process matrix over verbs with registered buffers and 4 QPs per connection and rendezvous from 4 KiB",
          "[rdma][verbs][reg][rdv]") {
  std::vector<std::string> env = kVerbs;
  env.insert(env.end(), {"CHORUS_TEST_REGISTERED=1", "CHORUS_IB_RDV_BYTES=4096",
                         "CHORUS_IB_QPS_PER_CONNECTION=4",
                         "CHORUS_NCHANNELS=2", "CHORUS_PATH_CHUNK_BYTES=65536",
                         "CHORUS_TEST_DATATYPES=int8,half,float,double"});
  run_workers(3, "VERBS", "matrix", env, {"40009"});
}
// Unregistered buffers over 4 QPs per connection: every message through the rings, its slots
// round robin over the QPs (landing out of order).
TEST_CASE("multi-process matrix over verbs with 4 QPs per connection", "[rdma][verbs]") {
  std::vector<std::string> env = kVerbs;
  env.insert(env.end(), {"NCCL_IB_QPS_PER_CONNECTION=4",
                         "CHORUS_TEST_DATATYPES=int8,half,float,double"});
  run_workers(3, "VERBS", "matrix", env, {"8191"});
}

// CHORUS_TOPO_FILE at communicator creation (src/algo/tuner_calibrate.cc, mp_worker.cc's
// "topology"): the file's link figures and rails make the cost model when it describes the
// communicator (its ranks, on its hosts in block order); otherwise the model is measured; a
// file some rank cannot use, or ranks given different files, fail creation on every rank.
namespace {
struct TempTextFile {
  std::string path;
  explicit TempTextFile(const std::string& text) {
    char name[] = "/tmp/chorus-topo-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    close(fd);
    path = name;
  }
  ~TempTextFile() { std::remove(path.c_str()); }
};
// 2 hosts x 2 ranks, two rails: the model takes the slower one (3 us, 50 Gbit/s).
const char* const kTwoByTwo =
    "intra 0.5us 40GB/s\nrail nic0 2us 100Gbit/s\nrail nic1 3us 50Gbit/s\nhost alpha 2\nhost beta 2\n";
}  // namespace

TEST_CASE("a topology file that describes the communicator makes its cost model",
          "[mp][hosts][topo]") {
  TempTextFile two(kTwoByTwo);
  run_workers(4, "AUTO", "topology", {"CHORUS_TEST_HOST_OF=0,0,1,1", "CHORUS_TOPO_FILE=" + two.path},
              {"file"});
  TempTextFile one("intra 0.25 12\nrail nic0 2 100\nhosts 1 3\n");
  run_workers(3, "SHM", "topology", {"CHORUS_TOPO_FILE=" + one.path}, {"file"});
}
TEST_CASE("a topology file that does not describe the communicator leaves it measured",
          "[mp][hosts][topo]") {
  TempTextFile two(kTwoByTwo);
  // Hosts interleaved: not the file's block order.
  run_workers(4, "AUTO", "topology", {"CHORUS_TEST_HOST_OF=0,1,0,1", "CHORUS_TOPO_FILE=" + two.path},
              {"measured"});
  // Fewer ranks than the file's (as a split communicator would have).
  run_workers(2, "SHM", "topology", {"CHORUS_TOPO_FILE=" + two.path}, {"measured"});
}
TEST_CASE("a topology file that some rank cannot use, or differs between ranks, is refused by all",
          "[mp][hosts][topo]") {
  TempTextFile good(kTwoByTwo);
  TempTextFile other("intra 0.5us 40GB/s\nrail nic0 2us 100Gbit/s\nhost alpha 2\nhost beta 2\n");
  TempTextFile bad("intra 0.5us 40GB/s\nrail nic0 0us 100Gbit/s\nhost alpha 4\n");
  const std::string hosts = "CHORUS_TEST_HOST_OF=0,0,1,1";
  for (const std::string& files :
       {good.path + "," + bad.path + "," + good.path + "," + good.path,
        good.path + "," + good.path + "," + good.path + "," + other.path,
        good.path + ",," + good.path + "," + good.path,
        good.path + "," + good.path + "," + good.path + ",/nonexistent/chorus.topo"}) {
    INFO(files);
    run_workers(4, "AUTO", "topology", {hosts, "CHORUS_TEST_TOPO_FILE_OF=" + files}, {"refused"});
  }
}
