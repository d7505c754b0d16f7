// SPDX-License-Identifier: Apache-2.0
// File: tests/support/require_error.h
// Bad-input assertions of the rank tests: a call returns the expected ncclResult_t and
// ncclGetLastError names what was wrong.
#pragma once

#include <catch2/catch.hpp>
#include <nccl.h>

#include <string>

namespace chorus::test {

inline std::string last_error() { return ncclGetLastError(nullptr); }

}  // namespace chorus::test

#define REQUIRE_ERROR(call, code, text)                                   \
  do {                                                                    \
    REQUIRE((call) == (code));                                            \
    INFO("last error: " << ::chorus::test::last_error());                 \
    REQUIRE(::chorus::test::last_error().find(text) != std::string::npos); \
  } while (0)
