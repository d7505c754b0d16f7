// SPDX-License-Identifier: Apache-2.0
// Bad input: each rejected argument gets the right ncclResult_t and a message that says what
// was wrong, and the communicator stays usable afterwards (a correct AllReduce still works).
#include <catch2/catch.hpp>
#include <chorus/stream.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/coll_check.h"
#include "support/rank_group.h"
#include "support/require_error.h"

namespace chorus::test {
namespace {

// The comm of a 1-rank group: calls return at once, so a bad call needs no partner.
struct Solo {
  RankGroup group{1};
  ncclComm_t comm() const { return group.comm(0); }
};


// A correct collective on every rank still works: the comm survived the bad call.
void require_usable(RankGroup& g) {
  Case c;
  c.coll = Coll::kAllReduce;
  c.dtype = ncclFloat;
  c.count = 1000;
  REQUIRE(g.run([&](int, ncclComm_t comm) { return run_case(comm, c); }) == "");
}

TEST_CASE("a NULL comm is rejected", "[ranks][bad-input]") {
  float x = 0;
  REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, nullptr, nullptr),
                ncclInvalidArgument, "comm is NULL");
  int n = 0;
  REQUIRE_ERROR(ncclCommCount(nullptr, &n), ncclInvalidArgument, "comm is NULL");
  REQUIRE_ERROR(ncclSend(&x, 1, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument, "comm is NULL");
}

TEST_CASE("NULL buffers with count > 0 are rejected for every collective", "[ranks][bad-input]") {
  Solo s;
  float x[4] = {};
  ncclComm_t c = s.comm();
  REQUIRE_ERROR(ncclAllReduce(nullptr, x, 4, ncclFloat, ncclSum, c, nullptr), ncclInvalidArgument, "sendbuff is NULL");
  REQUIRE_ERROR(ncclAllReduce(x, nullptr, 4, ncclFloat, ncclSum, c, nullptr), ncclInvalidArgument, "recvbuff is NULL");
  REQUIRE_ERROR(ncclReduceScatter(nullptr, x, 4, ncclFloat, ncclSum, c, nullptr), ncclInvalidArgument, "sendbuff");
  REQUIRE_ERROR(ncclAllGather(x, nullptr, 4, ncclFloat, c, nullptr), ncclInvalidArgument, "recvbuff");
  REQUIRE_ERROR(ncclAlltoAll(nullptr, x, 4, ncclFloat, c, nullptr), ncclInvalidArgument, "sendbuff");
  REQUIRE_ERROR(ncclBroadcast(nullptr, x, 4, ncclFloat, 0, c, nullptr), ncclInvalidArgument, "sendbuff");
  REQUIRE_ERROR(ncclBcast(nullptr, 4, ncclFloat, 0, c, nullptr), ncclInvalidArgument, "NULL");
  REQUIRE_ERROR(ncclReduce(x, nullptr, 4, ncclFloat, ncclSum, 0, c, nullptr), ncclInvalidArgument, "recvbuff");
  REQUIRE_ERROR(ncclGather(nullptr, x, 4, ncclFloat, 0, c, nullptr), ncclInvalidArgument, "sendbuff");
  REQUIRE_ERROR(ncclScatter(x, nullptr, 4, ncclFloat, 0, c, nullptr), ncclInvalidArgument, "recvbuff");
  REQUIRE_ERROR(ncclSend(nullptr, 4, ncclFloat, 0, c, nullptr), ncclInvalidArgument, "sendbuff");
  REQUIRE_ERROR(ncclRecv(nullptr, 4, ncclFloat, 0, c, nullptr), ncclInvalidArgument, "recvbuff");
  // count 0 with NULL buffers is valid.
  REQUIRE(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, c, nullptr) == ncclSuccess);
  require_usable(s.group);
}

TEST_CASE("an unknown datatype is rejected", "[ranks][bad-input]") {
  Solo s;
  float x = 0;
  for (int bad : {-1, 12, 1000}) {
    REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(bad), ncclSum, s.comm(), nullptr),
                  ncclInvalidArgument, "datatype");
    REQUIRE_ERROR(ncclBroadcast(&x, &x, 1, static_cast<ncclDataType_t>(bad), 0, s.comm(), nullptr),
                  ncclInvalidArgument, "datatype");
  }
  require_usable(s.group);
}

TEST_CASE("an unknown or mismatched reduction op is rejected", "[ranks][bad-input]") {
  Solo s;
  float x = 0;
  for (int bad : {-1, 5, 99, static_cast<int>(ncclMaxRedOp)}) {
    REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, ncclFloat, static_cast<ncclRedOp_t>(bad), s.comm(), nullptr),
                  ncclInvalidArgument, "op");
  }
  // A PreMulSum made for float may not be used with double, nor after it is destroyed.
  ncclRedOp_t op;
  float scalar = 2;
  REQUIRE(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, s.comm()) == ncclSuccess);
  double d = 0;
  REQUIRE_ERROR(ncclAllReduce(&d, &d, 1, ncclDouble, op, s.comm(), nullptr), ncclInvalidArgument, "created for float");
  REQUIRE(ncclRedOpDestroy(op, s.comm()) == ncclSuccess);
  REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, ncclFloat, op, s.comm(), nullptr), ncclInvalidArgument, "op");
  REQUIRE_ERROR(ncclRedOpDestroy(ncclSum, s.comm()), ncclInvalidArgument, "built in");
  require_usable(s.group);
}

TEST_CASE("a root or peer out of range is rejected", "[ranks][bad-input]") {
  RankGroup g(2);
  float x[8] = {};
  for (int bad : {-1, 2, 100}) {
    REQUIRE_ERROR(ncclBroadcast(x, x, 1, ncclFloat, bad, g.comm(0), nullptr), ncclInvalidArgument, "root");
    REQUIRE_ERROR(ncclReduce(x, x, 1, ncclFloat, ncclSum, bad, g.comm(0), nullptr), ncclInvalidArgument, "root");
    REQUIRE_ERROR(ncclGather(x, x, 1, ncclFloat, bad, g.comm(0), nullptr), ncclInvalidArgument, "root");
    REQUIRE_ERROR(ncclScatter(x, x, 1, ncclFloat, bad, g.comm(0), nullptr), ncclInvalidArgument, "root");
    REQUIRE_ERROR(ncclSend(x, 1, ncclFloat, bad, g.comm(0), nullptr), ncclInvalidArgument, "peer");
    REQUIRE_ERROR(ncclRecv(x, 1, ncclFloat, bad, g.comm(1), nullptr), ncclInvalidArgument, "peer");
  }
  require_usable(g);
}

TEST_CASE("a config not made by NCCL_CONFIG_INITIALIZER is rejected", "[ranks][bad-input]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0x12345678;
  ncclComm_t comm = nullptr;
  REQUIRE_ERROR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument,
                "NCCL_CONFIG_INITIALIZER");
  REQUIRE(comm == nullptr);
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.blocking = 7;
  REQUIRE_ERROR(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, "blocking");
  // The id is still good for a correct initialisation.
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("bad communicator-creation arguments are rejected", "[ranks][bad-input]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE_ERROR(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "nranks");
  REQUIRE_ERROR(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "rank 2 is out of range");
  REQUIRE_ERROR(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument, "rank");
  REQUIRE_ERROR(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument, "NULL");
  ncclUniqueId garbage;
  std::memset(&garbage, 0x5a, sizeof(garbage));
  REQUIRE_ERROR(ncclCommInitRank(&comm, 1, garbage, 0), ncclInvalidArgument, "ncclGetUniqueId");
  REQUIRE_ERROR(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument, "NULL");
  ncclComm_t comms[2];
  REQUIRE_ERROR(ncclCommInitAll(comms, 0, nullptr), ncclInvalidArgument, "ndev");
  int dup[2] = {3, 3};
  REQUIRE_ERROR(ncclCommInitAll(comms, 2, dup), ncclInvalidArgument, "twice");
  REQUIRE_ERROR(ncclGetUniqueId(nullptr), ncclInvalidArgument, "NULL");
}

TEST_CASE("a destroyed communicator is rejected", "[ranks][bad-input]") {
  ncclComm_t comm;
  REQUIRE(ncclCommInitAll(&comm, 1, nullptr) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  float x = 0;
  REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument,
                "not a live communicator");
  int n = 0;
  REQUIRE_ERROR(ncclCommCount(comm, &n), ncclInvalidArgument, "not a live communicator");
  REQUIRE_ERROR(ncclCommDestroy(comm), ncclInvalidArgument, "not a live communicator");
}

// Each thread remembers the last handle it looked up (src/api/api_util.cc): a comm that another
// thread destroyed must not come back from that memory, nor must its successor at that address.
TEST_CASE("a communicator destroyed by another thread is rejected here too", "[ranks][bad-input]") {
  ncclComm_t comm;
  REQUIRE(ncclCommInitAll(&comm, 1, nullptr) == ncclSuccess);
  float x = 1;
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  std::thread([&] { CHECK(ncclCommDestroy(comm) == ncclSuccess); }).join();
  REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument,
                "not a live communicator");
  int n = 0;
  REQUIRE_ERROR(ncclCommCount(comm, &n), ncclInvalidArgument, "not a live communicator");
}

TEST_CASE("unbalanced group calls are rejected", "[ranks][bad-input]") {
  REQUIRE_ERROR(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  REQUIRE_ERROR(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupStart");
  // A bad call inside a group fails the group, and the next group works.
  Solo s;
  float x = 1;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(42), ncclSum, s.comm(), nullptr) == ncclInvalidArgument);
  REQUIRE_ERROR(ncclGroupEnd(), ncclInvalidArgument, "group not launched");
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, s.comm(), nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
}

TEST_CASE("an invalid stream handle is rejected", "[ranks][bad-input]") {
  Solo s;
  float x = 0;
  int not_a_stream = 0;
  auto bogus = reinterpret_cast<cudaStream_t>(&not_a_stream);
  REQUIRE_ERROR(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, s.comm(), bogus), ncclInvalidArgument,
                "chorusStreamCreate");
  REQUIRE_ERROR(chorusStreamSynchronize(bogus), ncclInvalidArgument, "chorusStreamCreate");
  require_usable(s.group);
}

TEST_CASE("sizes that overflow are rejected", "[ranks][bad-input]") {
  Solo s;
  float x = 0;
  REQUIRE_ERROR(ncclAllReduce(&x, &x, SIZE_MAX / 2, ncclFloat, ncclSum, s.comm(), nullptr),
                ncclInvalidArgument, "overflows");
  require_usable(s.group);
}

TEST_CASE("bad memory and registration calls are rejected", "[ranks][bad-input]") {
  Solo s;
  int local = 0;
  REQUIRE_ERROR(ncclMemFree(&local), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  REQUIRE_ERROR(ncclMemAlloc(nullptr, 16), ncclInvalidArgument, "NULL");
  void* handle = nullptr;
  REQUIRE_ERROR(ncclCommRegister(s.comm(), nullptr, 16, &handle), ncclInvalidArgument, "buff");
  REQUIRE_ERROR(ncclCommDeregister(s.comm(), &local), ncclInvalidArgument, "not a registration");
  ncclWindow_t win;
  REQUIRE_ERROR(ncclCommWindowRegister(s.comm(), reinterpret_cast<char*>(&local) + 1, 16, &win, 0),
                ncclInvalidArgument, "aligned");
  require_usable(s.group);
}

}  // namespace
}  // namespace chorus::test
