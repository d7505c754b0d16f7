// SPDX-License-Identifier: Apache-2.0
// File: tests/fuzz/peer_info_fuzz.cc
// PeerInfo::parse() (src/core/comm_setup.cc): the record each rank publishes about itself
// (host, pid, shared-memory and doorbell descriptors, TCP address), which every other rank
// parses after the bootstrap. A record that parses must survive serialize -> parse unchanged.
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
  FUZZ_CHECK(info->tcp_addr.len <= sizeof(info->tcp_addr.storage));
  (void)info->describe();
  (void)info->tcp_addr.to_string();
  auto again = PeerInfo::parse(info->serialize());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->rank == info->rank && again->nranks == info->nranks);
  FUZZ_CHECK(again->host_hash == info->host_hash && again->hostname == info->hostname);
  FUZZ_CHECK(again->pid == info->pid && again->process_token == info->process_token);
  FUZZ_CHECK(again->doorbell_fd == info->doorbell_fd && again->shm_fd == info->shm_fd);
  FUZZ_CHECK(again->tcp_addr.len == info->tcp_addr.len);
  FUZZ_CHECK(std::memcmp(&again->tcp_addr.storage, &info->tcp_addr.storage,
                         info->tcp_addr.len) == 0);
  FUZZ_CHECK(again->channels == info->channels);
  return 0;
}
