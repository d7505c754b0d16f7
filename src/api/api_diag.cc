// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_diag.cc
// Diagnosis: the flight recorder of a communicator.
#include <chorus/chorus.h>

#include <algorithm>
#include <cstring>

#include "api/api_util.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_API ncclResult_t chorusCommDumpFlightRecorder(ncclComm_t comm, char* buffer, size_t size,
                                                     size_t* needed) {
  return guard("chorusCommDumpFlightRecorder", [&]() -> Status {
    if (buffer == nullptr && size > 0) return invalid_argument("buffer is NULL with size {}", size);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    std::string text = c->dump_flight_recorder();
    if (needed != nullptr) *needed = text.size() + 1;
    if (size > 0) {
      size_t n = std::min(size - 1, text.size());
      std::memcpy(buffer, text.data(), n);
      buffer[n] = '\0';
    }
    return Status();
  });
}
