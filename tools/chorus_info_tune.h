// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info_tune.h
// The tuner section of chorus-info and `chorus-info --tune [FILE]`.
#pragma once

namespace chorus::info {

// The cost model, the algorithms of each collective and the tuner's choices by size.
void print_tuner();
// Measures each local transport between two ranks, prints the models and choices, and writes a
// CHORUS_TUNER_FILE to `path` (if not null). Returns the exit status.
int tune(const char* path);

}  // namespace chorus::info
