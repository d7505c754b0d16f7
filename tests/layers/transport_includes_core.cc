// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a transport including core (tests/layers/CMakeLists.txt).
#include "core/comm.h"
