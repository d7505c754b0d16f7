// SPDX-License-Identifier: Apache-2.0
// Must compile: the control case, core including what it may (tests/layers/CMakeLists.txt).
#include "core/comm.h"
#include "transports/registry.h"
