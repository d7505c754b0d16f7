// SPDX-License-Identifier: Apache-2.0
// File: src/core/comm_resources.cc
// Per-communicator user resources: PreMulSum operators and buffer registrations.
#include <cstring>

#include "core/comm.h"

namespace chorus {

namespace {
constexpr int kFirstDynamicOp = 5;  // ncclNumOps
constexpr int kMaxDynamicOps = 1 << 16;
}  // namespace

Result<int> Comm::create_premul(DataType dtype, const void* scalar, bool immediate) {
  std::lock_guard<std::mutex> lock(redop_mutex_);
  size_t slot = 0;
  while (slot < premul_.size() && premul_[slot].in_use) ++slot;
  if (slot == premul_.size()) {
    if (premul_.size() >= kMaxDynamicOps)
      return invalid_usage("{} already has {} reduction operators", describe(), kMaxDynamicOps);
    premul_.emplace_back();
  }
  PremulOp& p = premul_[slot];
  p = PremulOp{};
  p.in_use = true;
  p.dtype = dtype;
  p.op.kind = RedOpKind::kPreMulSum;
  if (immediate) {
    std::memcpy(p.op.scalar, scalar, datatype_size(dtype));
  } else {
    p.op.scalar_ptr = scalar;  // read when each collective runs
  }
  return kFirstDynamicOp + static_cast<int>(slot);
}

Status Comm::destroy_redop(int id) {
  std::lock_guard<std::mutex> lock(redop_mutex_);
  size_t slot = static_cast<size_t>(id - kFirstDynamicOp);
  if (id < kFirstDynamicOp || slot >= premul_.size() || !premul_[slot].in_use)
    return invalid_argument("op {} is not a reduction operator created on {}", id, describe());
  premul_[slot].in_use = false;
  return Status();
}

Result<RedOp> Comm::resolve_redop(int id, DataType dtype) const {
  std::lock_guard<std::mutex> lock(redop_mutex_);
  size_t slot = static_cast<size_t>(id - kFirstDynamicOp);
  if (id < kFirstDynamicOp || slot >= premul_.size() || !premul_[slot].in_use)
    return invalid_argument("op {} is neither a built-in ncclRedOp_t nor an operator created on "
                            "{}", id, describe());
  if (premul_[slot].dtype != dtype) {
    return invalid_argument("op {} was created for {} but the call uses {}", id,
                            datatype_name(premul_[slot].dtype), datatype_name(dtype));
  }
  return premul_[slot].op;
}

Result<void*> Comm::register_buffer(void* buf, size_t bytes) {
  return registrations_.register_range(buf, bytes);
}

Status Comm::deregister_buffer(void* handle) { return registrations_.deregister(handle); }

}  // namespace chorus
