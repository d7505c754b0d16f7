// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_mem.cc
// Memory: ncclMemAlloc/Free (memfd-backed, so same-host peers can map it), buffer and window
// registration (core/registration.h), PreMulSum operators.
#include <nccl.h>

#include "api/api_util.h"
#include "core/registration.h"

namespace chorus::api {
namespace {

struct Window {
  ncclComm_t comm;
  void* handle;
  void* buff;
};

}  // namespace
}  // namespace chorus::api

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guard("ncclMemAlloc", [&]() -> Status {
    if (ptr == nullptr) return invalid_argument("ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return invalid_argument("size is 0");
    CHORUS_ASSIGN_OR_RETURN(*ptr, alloc_shared(size));
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  return guard("ncclMemFree", [&]() -> Status { return free_shared(ptr); });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size,
                void** handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guard("ncclCommRegister", [&]() -> Status {
    if (handle == nullptr) return invalid_argument("handle is NULL");
    *handle = nullptr;
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, usable_comm(comm));
    if (buff == nullptr) return invalid_argument("buff is NULL");
    if (size == 0) return invalid_argument("size is 0");
    CHORUS_ASSIGN_OR_RETURN(*handle, c->register_buffer(buff, size));
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guard("ncclCommDeregister", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    return c->deregister_buffer(handle);
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size,
                ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  return guard("ncclCommWindowRegister", [&]() -> Status {
    if (win == nullptr) return invalid_argument("win is NULL");
    *win = nullptr;
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, usable_comm(comm));
    if (buff == nullptr || size == 0) return invalid_argument("buff is NULL or size is 0");
    if ((winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING)) != 0)
      return invalid_argument("winFlags {:#x} has unknown bits", winFlags);
    if (reinterpret_cast<uintptr_t>(buff) % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
      return invalid_argument("buff {} is not aligned to NCCL_WIN_REQUIRED_ALIGNMENT", buff);
    auto w = std::make_unique<Window>(Window{comm, nullptr, buff});
    CHORUS_ASSIGN_OR_RETURN(w->handle, c->register_buffer(buff, size));
    *win = reinterpret_cast<ncclWindow_t>(w.release());
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return guard("ncclCommWindowDeregister", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    if (win == nullptr) return invalid_argument("win is NULL");
    auto* w = reinterpret_cast<Window*>(win);
    if (w->comm != comm) return invalid_argument("win belongs to another communicator");
    CHORUS_RETURN_IF_ERROR(c->deregister_buffer(w->handle));
    delete w;
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar,
                ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  return guard("ncclRedOpCreatePreMulSum", [&]() -> Status {
    if (op == nullptr) return invalid_argument("op is NULL");
    if (scalar == nullptr) return invalid_argument("scalar is NULL");
    int dtype = enum_bits(datatype), where = enum_bits(residence);
    CHORUS_RETURN_IF_ERROR(check_datatype(dtype));
    if (where != ncclScalarDevice && where != ncclScalarHostImmediate)
      return invalid_argument("residence {} is not a ncclScalarResidence_t", where);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, usable_comm(comm));
    CHORUS_ASSIGN_OR_RETURN(int id, c->create_premul(static_cast<DataType>(dtype), scalar,
                                                     where == ncclScalarHostImmediate));
    *op = static_cast<ncclRedOp_t>(id);
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guard("ncclRedOpDestroy", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    int id = enum_bits(op);
    if (id >= 0 && id < ncclNumOps)
      return invalid_argument("op {} is built in and cannot be destroyed", id);
    return c->destroy_redop(id);
  });
}
