// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: the base layer including the bootstrap (tests/layers/CMakeLists.txt).
#include "bootstrap/wire.h"
