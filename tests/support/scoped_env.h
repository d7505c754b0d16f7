// SPDX-License-Identifier: Apache-2.0
// File: tests/support/scoped_env.h
// Sets an environment variable for the scope of one test; parameters are re-read on entry and
// on exit.
#pragma once

#include <cstdlib>
#include <string>

#include "common/params.h"

namespace chorus::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
    params::reload_for_testing();
  }
  ~ScopedEnv() {
    unsetenv(name_);
    params::reload_for_testing();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace chorus::test
