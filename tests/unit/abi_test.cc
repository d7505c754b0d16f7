// SPDX-License-Identifier: Apache-2.0
// include/nccl.h against the NCCL 2.28 ABI (../shared/reference/FIELD_NOTES.md §1): enum values,
// struct sizes and offsets, the version macros, and NCCL's ncclConfig_t version rules.
#include <catch2/catch.hpp>
#include <nccl.h>

#include <climits>
#include <cstddef>
#include <cstring>

#include "api/api_util.h"

static_assert(sizeof(ncclUniqueId) == 128);
static_assert(NCCL_UNIQUE_ID_BYTES == 128);
static_assert(sizeof(ncclConfig_t) == 80);
static_assert(offsetof(ncclConfig_t, size) == 0);
static_assert(offsetof(ncclConfig_t, magic) == 8);
static_assert(offsetof(ncclConfig_t, version) == 12);
static_assert(offsetof(ncclConfig_t, blocking) == 16);
static_assert(offsetof(ncclConfig_t, cgaClusterSize) == 20);
static_assert(offsetof(ncclConfig_t, minCTAs) == 24);
static_assert(offsetof(ncclConfig_t, maxCTAs) == 28);
static_assert(offsetof(ncclConfig_t, netName) == 32);
static_assert(offsetof(ncclConfig_t, splitShare) == 40);
static_assert(offsetof(ncclConfig_t, trafficClass) == 44);
static_assert(offsetof(ncclConfig_t, commName) == 48);
static_assert(offsetof(ncclConfig_t, collnetEnable) == 56);
static_assert(offsetof(ncclConfig_t, CTAPolicy) == 60);
static_assert(offsetof(ncclConfig_t, shrinkShare) == 64);
static_assert(offsetof(ncclConfig_t, nvlsCTAs) == 68);
static_assert(offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72);
static_assert(offsetof(ncclConfig_t, nvlinkCentricSched) == 76);
static_assert(sizeof(ncclSimInfo_t) == 24);
static_assert(sizeof(ncclRedOp_t) == 4);
static_assert(sizeof(ncclDataType_t) == 4);

TEST_CASE("enum values match NCCL 2.28", "[unit][abi]") {
  CHECK(ncclSuccess == 0);
  CHECK(ncclUnhandledCudaError == 1);
  CHECK(ncclSystemError == 2);
  CHECK(ncclInternalError == 3);
  CHECK(ncclInvalidArgument == 4);
  CHECK(ncclInvalidUsage == 5);
  CHECK(ncclRemoteError == 6);
  CHECK(ncclInProgress == 7);
  CHECK(ncclNumResults == 8);
  CHECK(ncclInt8 == 0);
  CHECK(ncclChar == 0);
  CHECK(ncclUint8 == 1);
  CHECK(ncclInt32 == 2);
  CHECK(ncclInt == 2);
  CHECK(ncclUint32 == 3);
  CHECK(ncclInt64 == 4);
  CHECK(ncclUint64 == 5);
  CHECK(ncclFloat16 == 6);
  CHECK(ncclHalf == 6);
  CHECK(ncclFloat32 == 7);
  CHECK(ncclFloat == 7);
  CHECK(ncclFloat64 == 8);
  CHECK(ncclDouble == 8);
  CHECK(ncclBfloat16 == 9);
  CHECK(ncclFloat8e4m3 == 10);
  CHECK(ncclFloat8e5m2 == 11);
  CHECK(ncclNumTypes == 12);
  CHECK(ncclSum == 0);
  CHECK(ncclProd == 1);
  CHECK(ncclMax == 2);
  CHECK(ncclMin == 3);
  CHECK(ncclAvg == 4);
  CHECK(ncclNumOps == 5);
  CHECK(ncclMaxRedOp == INT_MAX);
  CHECK(ncclScalarDevice == 0);
  CHECK(ncclScalarHostImmediate == 1);
  CHECK(NCCL_CONFIG_UNDEF_INT == INT_MIN);
  CHECK(NCCL_SPLIT_NOCOLOR == -1);
  CHECK(NCCL_SHRINK_DEFAULT == 0);
  CHECK(NCCL_SHRINK_ABORT == 1);
  CHECK(NCCL_WIN_REQUIRED_ALIGNMENT == 4096);
}

TEST_CASE("version macros follow NCCL's encoding", "[unit][abi]") {
  CHECK(NCCL_VERSION(2, 8, 4) == 2804);
  CHECK(NCCL_VERSION(2, 28, 9) == 22809);
  CHECK(NCCL_VERSION(2, 30, 7) == 23007);
  CHECK(NCCL_VERSION_CODE == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  CHECK(c.size == sizeof(ncclConfig_t));
  CHECK(c.magic == 0xcafebeef);
  CHECK(c.version == NCCL_VERSION_CODE);
  CHECK(c.blocking == NCCL_CONFIG_UNDEF_INT);
  CHECK(c.netName == nullptr);
  CHECK(c.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT);
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  CHECK(s.magic == 0x74685283u);
  CHECK(s.estimatedTime == NCCL_UNDEF_FLOAT);
}

TEST_CASE("ncclConfig_t follows NCCL's size, magic and version rules", "[unit][abi]") {
  using chorus::api::parse_config;
  chorus::CommConfig defaults;
  SECTION("a bad magic is rejected") {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.magic = 0;
    auto r = parse_config(&c, defaults);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == chorus::Code::kInvalidArgument);
  }
  SECTION("fields past the caller's size are not read") {
    // A program built against NCCL 2.18 has a 48-byte struct; what follows it is not its own.
    unsigned char raw[sizeof(ncclConfig_t)];
    std::memset(raw, 0x7f, sizeof(raw));
    ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
    old.size = 48;
    old.version = NCCL_VERSION(2, 18, 0);
    old.blocking = 0;
    std::memcpy(raw, &old, 48);
    auto r = parse_config(reinterpret_cast<ncclConfig_t*>(raw), defaults);
    REQUIRE(r.ok());
    CHECK(r->blocking == false);
    CHECK(r->name.empty());  // commName (offset 48) was not read
  }
  SECTION("fields newer than the caller's version take their defaults") {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.version = NCCL_VERSION(2, 26, 0);  // commName arrived in 2.27
    c.commName = "ignored";
    c.CTAPolicy = 77;                    // would be invalid if it were read
    auto r = parse_config(&c, defaults);
    REQUIRE(r.ok());
    CHECK(r->name.empty());
    c.version = NCCL_VERSION(2, 27, 0);
    CHECK(!parse_config(&c, defaults).ok());  // now CTAPolicy 77 is read and rejected
    c.CTAPolicy = NCCL_CONFIG_UNDEF_INT;
    auto r2 = parse_config(&c, defaults);
    REQUIRE(r2.ok());
    CHECK(r2->name == "ignored");
  }
  SECTION("invalid values are rejected with their field name") {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking = 2;
    auto r = parse_config(&c, defaults);
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("blocking") != std::string::npos);
    c = NCCL_CONFIG_INITIALIZER;
    c.minCTAs = 8;
    c.maxCTAs = 4;
    CHECK(!parse_config(&c, defaults).ok());
  }
  SECTION("a NULL config gives the defaults") {
    auto r = parse_config(nullptr, defaults);
    REQUIRE(r.ok());
    CHECK(r->blocking == true);
  }
}
