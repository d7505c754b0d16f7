// SPDX-License-Identifier: Apache-2.0
// File: src/common/scope_guard.h
// Runs a callable when the scope ends, unless cancelled (absl::Cleanup in spirit).
#pragma once

#include <utility>

namespace chorus {

template <typename F>
class [[nodiscard]] ScopeGuard {
 public:
  explicit ScopeGuard(F fn) : fn_(std::move(fn)) {}
  ~ScopeGuard() {
    if (active_) fn_();
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  void cancel() { active_ = false; }

 private:
  F fn_;
  bool active_ = true;
};

}  // namespace chorus
