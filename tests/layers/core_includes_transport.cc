// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: core including a concrete transport (tests/layers/CMakeLists.txt).
#include "transports/tcp/tcp_transport.h"
