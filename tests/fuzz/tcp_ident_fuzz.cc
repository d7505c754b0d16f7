// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/tcp_ident_fuzz.cc
// The TCP transport's identification message (transports/tcp/tcp_transport.h, decode_ident):
// the first thing an acceptor reads from an authenticated connection, which decides which
// (peer, channel) slot the socket fills. Inputs are zero-padded or cut to 24 bytes. What
// decodes must encode back to the same fields, and a message re-encoded from them decodes alike.
#include <cstring>

#include "fuzz_common.h"
#include "transports/tcp/tcp_transport.h"

using namespace chorus::tcp;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t in[kIdentBytes] = {};
  std::memcpy(in, data, size < kIdentBytes ? size : kIdentBytes);
  Ident ident;
  if (!decode_ident(in, &ident).ok()) return 0;
  uint8_t out[kIdentBytes];
  encode_ident(ident, out);
  Ident again;
  FUZZ_CHECK(decode_ident(out, &again).ok());
  FUZZ_CHECK(again.rank == ident.rank && again.channel == ident.channel &&
             again.comm_uid == ident.comm_uid);
  // Only the reserved word may differ from the input.
  FUZZ_CHECK(std::memcmp(out, in, 12) == 0 && std::memcmp(out + 16, in + 16, 8) == 0);
  return 0;
}
