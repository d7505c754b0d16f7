// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_launch.cc
// The environment contract between chorus-run and the ranks it starts (include/chorus/launch.h).
#include <chorus/launch.h>

#include <cstdlib>
#include <cstring>

#include "api/api_util.h"
#include "common/params.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_API ncclResult_t chorusUniqueIdToHex(const ncclUniqueId* id, char* hex) {
  return guard("chorusUniqueIdToHex", [&]() -> Status {
    if (id == nullptr || hex == nullptr) return invalid_argument("id or hex is NULL");
    static const char kDigits[] = "0123456789abcdef";
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
      auto b = static_cast<unsigned char>(id->internal[i]);
      hex[2 * i] = kDigits[b >> 4];
      hex[2 * i + 1] = kDigits[b & 15];
    }
    hex[2 * NCCL_UNIQUE_ID_BYTES] = '\0';
    return Status();
  });
}

CHORUS_API ncclResult_t chorusUniqueIdFromHex(const char* hex, ncclUniqueId* id) {
  return guard("chorusUniqueIdFromHex", [&]() -> Status {
    if (id == nullptr || hex == nullptr) return invalid_argument("id or hex is NULL");
    if (std::strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES)
      return invalid_argument("a unique id has {} hex digits, not {}", 2 * NCCL_UNIQUE_ID_BYTES,
                              std::strlen(hex));
    auto nibble = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
      int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) return invalid_argument("'{}' is not a hex digit", hi < 0 ? hex[2 * i] : hex[2 * i + 1]);
      id->internal[i] = static_cast<char>(hi << 4 | lo);
    }
    return Status();
  });
}

CHORUS_API ncclResult_t chorusLaunchInfo(ncclUniqueId* id, int* rank, int* nranks) {
  return guard("chorusLaunchInfo", [&]() -> Status {
    if (id == nullptr || rank == nullptr || nranks == nullptr)
      return invalid_argument("id, rank or nranks is NULL");
    const char* hex = std::getenv("CHORUS_UNIQUE_ID");
    const char* r = std::getenv("CHORUS_RANK");
    const char* n = std::getenv("CHORUS_NRANKS");
    if (hex == nullptr || r == nullptr || n == nullptr)
      return invalid_usage("CHORUS_UNIQUE_ID, CHORUS_RANK and CHORUS_NRANKS are not all set: start "
                           "the program with chorus-run");
    int64_t rv = 0, nv = 0;
    if (!params::parse_int(r, &rv) || !params::parse_int(n, &nv) || nv < 1 || rv < 0 || rv >= nv)
      return invalid_argument("CHORUS_RANK={} / CHORUS_NRANKS={} are not a valid rank and size", r, n);
    if (chorusUniqueIdFromHex(hex, id) != ncclSuccess)
      return invalid_argument("CHORUS_UNIQUE_ID is not a unique id in hex");
    *rank = static_cast<int>(rv);
    *nranks = static_cast<int>(nv);
    return Status();
  });
}
