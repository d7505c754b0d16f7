// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/unique_id_fuzz.cc
// decode_unique_id() (src/bootstrap/unique_id.h) on any 128 bytes: an ncclUniqueId comes from
// the application (MPI, a file, a socket) and is not trusted. Shorter inputs are zero-padded,
// longer ones cut. An id that decodes must have a usable root address and a non-zero uid, and
// survive encode -> decode unchanged.
#include <cstring>

#include "bootstrap/unique_id.h"
#include "fuzz_common.h"

using namespace chorus::bootstrap;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char in[kUniqueIdBytes] = {};
  std::memcpy(in, data, size < kUniqueIdBytes ? size : kUniqueIdBytes);
  auto id = decode_unique_id(in);
  if (!id.ok()) {
    FUZZ_CHECK(!id.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(!id->root.empty() && id->root.port() != 0 && id->comm_uid != 0);
  FUZZ_CHECK(!id->root.to_string().empty());
  char out[kUniqueIdBytes];
  encode_unique_id(*id, out);
  auto again = decode_unique_id(out);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->root == id->root && again->comm_uid == id->comm_uid);
  FUZZ_CHECK(again->secret == id->secret);
  char out2[kUniqueIdBytes];
  encode_unique_id(*again, out2);
  FUZZ_CHECK(std::memcmp(out, out2, kUniqueIdBytes) == 0);
  return 0;
}
