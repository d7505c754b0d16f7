// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_util.h
// What every extern "C" entry point shares: the exception/Status guard, the last-error text,
// the registry that validates communicator handles, and argument checks.
#pragma once

#include <chorus/compress.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "compress/compressor.h"
#include "core/comm.h"
#include "core/stream.h"

// Declares the default-visibility NCCL entry point `func` (weak, so profilers can interpose)
// and its pnccl* alias. Follow with the definition of `func`.
#define CHORUS_NCCL_API(ret, func, ...)                                                 \
  extern "C" __attribute__((visibility("default"))) __attribute__((alias(#func))) ret \
      p##func(__VA_ARGS__);                                                            \
  extern "C" __attribute__((visibility("default"))) __attribute__((weak)) ret func(__VA_ARGS__)

// A Chorus extension entry point.
#define CHORUS_API extern "C" __attribute__((visibility("default")))

namespace chorus::api {

ncclResult_t to_nccl(Code code);

// Records `status` as the calling thread's last error ("<function>: <message>"), logs it at
// WARN (once, here, where the API reports it) and returns its ncclResult_t.
ncclResult_t report(const char* function, const Status& status);
// The log subsystem of an entry point's errors: INIT (communicator life cycle), ALLOC
// (memory and registration), SCHED (overlap scheduler), MOE (chorusEp*) or COLL (everything
// else).
log::Subsys subsys_of(std::string_view function);
const char* last_error();

// Runs body() (returning Status) inside the C boundary: exceptions never escape, bad_alloc
// becomes ncclSystemError.
template <typename F>
ncclResult_t guard(const char* function, F&& body) {
  try {
    Status status = body();
    if (status.ok()) return ncclSuccess;
    if (status.code() == Code::kInProgress) return ncclInProgress;
    return report(function, status);
  } catch (const std::bad_alloc&) {
    return report(function, Status(Code::kSystemError, "out of memory"));
  } catch (const std::exception& e) {
    return report(function, internal_error("unexpected exception: {}", e.what()));
  } catch (...) {
    return report(function, internal_error("unexpected exception"));
  }
}

// ---- Communicator handles ----
ncclComm_t register_comm(std::shared_ptr<Comm> comm);
void unregister_comm(ncclComm_t handle);
// The comm behind a handle: kInvalidArgument for NULL, destroyed or foreign handles.
Result<std::shared_ptr<Comm>> find_comm(ncclComm_t handle);
// find_comm plus: the comm must be initialised and not aborted/finalized.
Result<std::shared_ptr<Comm>> usable_comm(ncclComm_t handle);

// ---- Argument checks ----
// The int a C caller passed for an enum parameter (ncclDataType_t, ncclRedOp_t ...). C allows
// any int there, but in C++ reading an enum object that holds a value outside its enumerators'
// range is undefined (UBSan's -fsanitize=enum reports it), so entry points take the bits
// without reading the enum and validate the int before anything converts it back.
template <typename E>
int enum_bits(const E& value) {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int));
  int bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

Result<Stream*> find_stream(cudaStream_t stream);
// The compressor behind a chorusCompressor_t (api_compress.cc); kInvalidArgument for NULL.
Result<std::shared_ptr<compress::Compressor>> find_compressor(chorusCompressor_t handle);  // NULL is valid (the synchronous stream)
Status check_datatype(int datatype);                // an ncclDataType_t (enum_bits)
Status check_rank(const char* what, int value, int nranks);
// Resolves an ncclRedOp_t for comm and a valid datatype (built-in or PreMulSum).
Result<RedOp> resolve_op(const Comm& comm, int op, int datatype);
// count * elem_size * multiplier without overflow (datatype already checked).
Status check_size(size_t count, int datatype, size_t multiplier);

// ---- Configuration (ncclConfig_t rules of NCCL 2.28) ----
// Copies what the caller's header version knows, rejects a bad magic or bad values.
Result<CommConfig> parse_config(const ncclConfig_t* config, const CommConfig& defaults);

}  // namespace chorus::api
