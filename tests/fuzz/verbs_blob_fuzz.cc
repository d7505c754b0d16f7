// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/verbs_blob_fuzz.cc
// The verbs transport's published blob (transports/verbs/verbs_wire.h, parse_blob): what a rank
// reads from each peer before it connects QPs and writes into the peer's memory. Input: one byte
// (the reader's rank, modulo the blob's nranks), then the blob; the expectations (rank, nranks,
// channels, slots, slot bytes, QPs per connection) are taken from the blob's own header, so that
// the fuzzer gets past them. What parses must encode back to exactly the input. The same bytes
// also go through split_side_address (verbs_side.h), the trailer that carries the address of
// the peer's side channel: what splits is a prefix and an IPv4/IPv6 address, and appending that
// address again splits back to the same.
#include <sys/socket.h>

#include <cstring>
#include <string>

#include "common/bytes.h"
#include "fuzz_common.h"
#include "transports/verbs/verbs_side.h"
#include "transports/verbs/verbs_wire.h"

using namespace chorus::verbs;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string blob(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string_view verbs_part;
  chorus::net::SockAddr side;
  chorus::Status split = split_side_address(blob, &verbs_part, &side, "rank ?");
  if (split.ok()) {
    FUZZ_CHECK(verbs_part.size() < blob.size());
    FUZZ_CHECK(blob.compare(0, verbs_part.size(), verbs_part) == 0);
    FUZZ_CHECK(side.family() == AF_INET || side.family() == AF_INET6);
    const std::string again = append_side_address(std::string(verbs_part), side);
    std::string_view verbs_again;
    chorus::net::SockAddr side_again;
    FUZZ_CHECK(split_side_address(again, &verbs_again, &side_again, "rank ?").ok());
    FUZZ_CHECK(verbs_again == verbs_part && side_again == side);
  } else {
    FUZZ_CHECK(!split.message().empty());
  }
  BlobExpect e;
  if (blob.size() >= 32) {
    const auto* p = reinterpret_cast<const uint8_t*>(blob.data());
    e.rank = chorus::le::get_u32(p + 12);
    e.nranks = chorus::le::get_u32(p + 16);
    e.channels = chorus::le::get_u32(p + 20);
    e.slots = chorus::le::get_u32(p + 24);
    e.slot_bytes = chorus::le::get_u32(p + 28);
    e.my_rank = e.nranks > 0 ? data[0] % e.nranks : 0;
    e.qps_per_connection = p[11];
  }
  auto parsed = parse_blob(blob, e, "rank ?");
  if (!parsed.ok()) {
    FUZZ_CHECK(!parsed.status().message().empty());
    return 0;
  }
  const size_t per_rank = size_t{parsed->channels} * parsed->qps_per_connection;
  FUZZ_CHECK(parsed->qps_per_connection >= 1 && parsed->qps_per_connection <= kMaxQpsPerConnection);
  FUZZ_CHECK(parsed->qps.size() == size_t{parsed->nranks} * per_rank);
  FUZZ_CHECK(parsed->qps.size() <= kMaxEntries);
  FUZZ_CHECK(parsed->slots >= kMinSlots && parsed->slots <= kMaxSlots);
  FUZZ_CHECK(e.my_rank != parsed->rank);  // our entries name QPs, the publisher's do not
  for (size_t i = 0; i < per_rank; ++i) FUZZ_CHECK(parsed->qps[e.my_rank * per_rank + i].qpn != 0);
  FUZZ_CHECK(encode_blob(parsed.value()) == blob);
  return 0;
}
