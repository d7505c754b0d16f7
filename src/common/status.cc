// SPDX-License-Identifier: Apache-2.0
#include "common/status.h"

#include <cstring>

namespace chorus {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kSystemError: return "system error";
    case Code::kInternalError: return "internal error";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kInvalidUsage: return "invalid usage";
    case Code::kRemoteError: return "remote error";
    case Code::kInProgress: return "in progress";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) rep_ = std::make_unique<Rep>(Rep{code, std::move(message)});
}

Status::Status(const Status& other) {
  if (other.rep_) rep_ = std::make_unique<Rep>(*other.rep_);
}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

Status& Status::with_context(std::string_view context) {
  if (rep_) rep_->message = fmt::format("{}: {}", context, rep_->message);
  return *this;
}

std::string Status::to_string() const {
  if (!rep_) return "ok";
  return fmt::format("{} ({})", rep_->message, code_name(rep_->code));
}

Status system_error(int err, std::string_view what) {
  return Status(Code::kSystemError, fmt::format("{} (errno {}: {})", what, err, std::strerror(err)));
}

}  // namespace chorus
