// SPDX-License-Identifier: Apache-2.0
// File: tests/support/test_hosts.h
// Simulated hosts for the multi-process tests: CHORUS_TEST_HOST_OF="0,0,1,1" puts rank r on host
// number r of the list (mp_worker.cc gives it that CHORUS_HOST_ID), so that one machine runs
// the multi-host algorithms (ranks on different "hosts" reach each other over TCP).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace chorus::test {

// The items of the comma-separated list in environment variable `name` (kept as written, empty
// ones too); empty when it is not set.
inline std::vector<std::string> test_env_list(const char* name) {
  std::vector<std::string> hosts;
  const char* list = std::getenv(name);
  if (list == nullptr) return hosts;
  std::string item;
  for (const char* p = list;; ++p) {
    if (*p == ',' || *p == '\0') {
      hosts.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return hosts;
}

// The host of every rank, as CHORUS_TEST_HOST_OF lists them.
inline std::vector<std::string> test_host_of() { return test_env_list("CHORUS_TEST_HOST_OF"); }

}  // namespace chorus::test
