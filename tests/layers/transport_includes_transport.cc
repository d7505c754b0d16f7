// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: one transport including another (tests/layers/CMakeLists.txt).
#include "transports/shm/shm_transport.h"
