// SPDX-License-Identifier: Apache-2.0
// File: src/common/status.h
// Status and Result<T>: how every internal function reports failure. No exceptions cross a
// Chorus function boundary; the C API layer maps Status::code() onto ncclResult_t one to one.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace chorus {

// Numerically identical to ncclResult_t (checked by a static_assert in src/api).
enum class Code : uint8_t {
  kOk = 0,
  kSystemError = 2,      // a system call failed locally (errno in the message)
  kInternalError = 3,    // a broken invariant: a bug in Chorus
  kInvalidArgument = 4,  // the caller passed a bad value
  kInvalidUsage = 5,     // the call is not valid in this state (or across ranks)
  kRemoteError = 6,      // a peer died, misbehaved or timed out
  kInProgress = 7,       // not an error: a non-blocking call has not finished yet
};

std::string_view code_name(Code code);

// An OK Status is a single null pointer, so returning it on hot paths costs nothing.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  // The human message; empty for OK.
  const std::string& message() const;
  // Prepends context: "while X: <message>". No-op on OK.
  Status& with_context(std::string_view context);
  // Errors are logged once, where they are detected: whoever logs one marks it, and the
  // layers it passes through on its way to the caller (Comm::poison, the API's report) do not
  // log it again. Copies keep the mark. No-op on OK.
  Status& mark_logged() {
    if (rep_) rep_->logged = true;
    return *this;
  }
  bool logged() const { return rep_ && rep_->logged; }
  std::string to_string() const;

 private:
  struct Rep {
    Code code;
    std::string message;
    bool logged = false;
  };
  std::unique_ptr<Rep> rep_;
};

inline Status ok_status() { return Status(); }

template <typename... Args>
Status make_status(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status invalid_usage(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInvalidUsage, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInternalError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status remote_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kRemoteError, fmt::format(f, std::forward<Args>(args)...));
}
// A failed system call: appends "(errno N: strerror)".
Status system_error(int err, std::string_view what);

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = internal_error("Result built from an OK status without a value");
  }
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  Status take_status() { return std::move(status_); }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace chorus

#define CHORUS_CONCAT_INNER(a, b) a##b
#define CHORUS_CONCAT(a, b) CHORUS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define CHORUS_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::chorus::Status chorus_status_ = (expr);        \
    if (!chorus_status_.ok()) return chorus_status_; \
  } while (0)

// `lhs = value of expr`, or returns its Status. lhs may be a declaration ("auto x").
#define CHORUS_ASSIGN_OR_RETURN(lhs, expr) \
  CHORUS_ASSIGN_OR_RETURN_IMPL(CHORUS_CONCAT(chorus_result_, __LINE__), lhs, expr)
#define CHORUS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.take_status();           \
  lhs = std::move(tmp).value()

// Coroutine forms of the two macros above.
#define CHORUS_CO_RETURN_IF_ERROR(expr)                 \
  do {                                                  \
    ::chorus::Status chorus_status_ = (expr);           \
    if (!chorus_status_.ok()) co_return chorus_status_; \
  } while (0)
