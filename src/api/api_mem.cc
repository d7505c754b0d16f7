// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_mem.cc
// Memory: ncclMemAlloc/Free (memfd-backed, so same-host peers could map it), buffer and window
// registration, PreMulSum operators.
#include <nccl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "api/api_util.h"
#include "common/unique_fd.h"

namespace chorus::api {
namespace {

struct Allocation {
  size_t bytes;
  int fd;
};
std::mutex g_alloc_mutex;
std::map<void*, Allocation>& allocations() {
  static auto* map = new std::map<void*, Allocation>();
  return *map;
}

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
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t bytes = (size + page - 1) / page * page;
    UniqueFd fd(static_cast<int>(syscall(SYS_memfd_create, "chorus-mem", MFD_CLOEXEC)));
    if (!fd.valid()) return system_error(errno, "memfd_create");
    fchmod(fd.get(), 0600);
    if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
      return system_error(errno, fmt::format("ftruncate to {} bytes", bytes));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return system_error(errno, fmt::format("mmap of {} bytes", bytes));
    std::lock_guard<std::mutex> lock(g_alloc_mutex);
    allocations()[p] = Allocation{bytes, fd.release()};
    *ptr = p;
    return Status();
  });
}

CHORUS_NCCL_API(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  return guard("ncclMemFree", [&]() -> Status {
    Allocation a;
    {
      std::lock_guard<std::mutex> lock(g_alloc_mutex);
      auto it = allocations().find(ptr);
      if (it == allocations().end())
        return invalid_argument("{} was not allocated by ncclMemAlloc (or was freed)", ptr);
      a = it->second;
      allocations().erase(it);
    }
    munmap(ptr, a.bytes);
    close(a.fd);
    return Status();
  });
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
    *handle = c->register_buffer(buff, size);
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
    auto* w = new Window{comm, c->register_buffer(buff, size), buff};
    *win = reinterpret_cast<ncclWindow_t>(w);
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
