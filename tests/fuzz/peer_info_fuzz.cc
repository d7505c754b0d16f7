// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/peer_info_fuzz.cc
// PeerInfo::parse() (src/core/comm_setup.cc): the record each rank publishes about itself
// (host, pid, rendezvous address, one length-prefixed connect blob per transport), which
// every other rank parses after the bootstrap. A record that parses must survive serialize -> parse unchanged.
#include "core/comm.h"
#include "fuzz_common.h"

using chorus::PeerInfo;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto info = PeerInfo::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!info.ok()) return 0;
  FUZZ_CHECK(info->rendezvous.len <= sizeof(info->rendezvous.storage));
  FUZZ_CHECK(info->blobs.size() <= chorus::kMaxTransports);
  (void)info->describe();
  (void)info->rendezvous.to_string();
  for (const auto& b : info->blobs) {
    FUZZ_CHECK(b.bytes.size() <= chorus::kMaxTransportBlob);
    auto e = info->endpoint(b.transport.c_str());
    FUZZ_CHECK(e.open && e.blob == b.bytes);
  }
  auto again = PeerInfo::parse(info->serialize());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->rank == info->rank && again->nranks == info->nranks);
  FUZZ_CHECK(again->host_hash == info->host_hash && again->hostname == info->hostname);
  FUZZ_CHECK(again->pid == info->pid && again->process_token == info->process_token);
  FUZZ_CHECK(again->rendezvous.len == info->rendezvous.len);
  FUZZ_CHECK(std::memcmp(&again->rendezvous.storage, &info->rendezvous.storage,
                         info->rendezvous.len) == 0);
  FUZZ_CHECK(again->blobs.size() == info->blobs.size());
  for (size_t i = 0; i < info->blobs.size(); ++i) {
    FUZZ_CHECK(again->blobs[i].transport == info->blobs[i].transport);
    FUZZ_CHECK(again->blobs[i].bytes == info->blobs[i].bytes);
  }
  FUZZ_CHECK(again->channels == info->channels);
  return 0;
}
