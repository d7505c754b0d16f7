// SPDX-License-Identifier: Apache-2.0
// Placeholder until the kernel tests land.
#include <catch2/catch.hpp>

#include "kernels/fp8/convert.h"

TEST_CASE("half round trip of small integers", "[unit]") {
  for (int i = -2048; i <= 2048; ++i) {
    REQUIRE(chorus::kernels::half_to_float(chorus::kernels::float_to_half(static_cast<float>(i))) == i);
  }
}
