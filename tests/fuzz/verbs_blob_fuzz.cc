// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/verbs_blob_fuzz.cc
// The verbs transport's published blob (transports/verbs/verbs_wire.h, parse_blob): what a rank
// reads from each peer before it connects QPs and writes into the peer's memory. Input: one byte
// (the reader's rank, modulo the blob's nranks), then the blob; the expectations (rank, nranks,
// channels, slots, slot bytes, QPs per connection) are taken from the blob's own header, so that
// the fuzzer gets past them. What parses must encode back to exactly the input.
#include <cstring>
#include <string>

#include "common/bytes.h"
#include "fuzz_common.h"
#include "transports/verbs/verbs_wire.h"

using namespace chorus::verbs;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string blob(reinterpret_cast<const char*>(data + 1), size - 1);
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
