// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_diag.cc
// Diagnosis: the flight recorder of a communicator, and its paths to its peers.
#include <chorus/chorus.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "api/api_util.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

namespace {

// `text` into the caller's buffer as the dump functions promise.
Status copy_text(const std::string& text, char* buffer, size_t size, size_t* needed) {
  if (needed != nullptr) *needed = text.size() + 1;
  if (size > 0) {
    size_t n = std::min(size - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return Status();
}

template <size_t N>
void copy_name(char (&dst)[N], const std::string& src) {
  size_t n = std::min(N - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

CHORUS_API ncclResult_t chorusCommDumpFlightRecorder(ncclComm_t comm, char* buffer, size_t size,
                                                     size_t* needed) {
  return guard("chorusCommDumpFlightRecorder", [&]() -> Status {
    if (buffer == nullptr && size > 0) return invalid_argument("buffer is NULL with size {}", size);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    return copy_text(c->dump_flight_recorder(), buffer, size, needed);
  });
}

CHORUS_API ncclResult_t chorusCommGetPathStats(ncclComm_t comm, int peer, chorusPathStats_t* stats,
                                               int maxPaths, int* nPaths) {
  return guard("chorusCommGetPathStats", [&]() -> Status {
    if (nPaths == nullptr) return invalid_argument("nPaths is NULL");
    if (maxPaths < 0) return invalid_argument("maxPaths is {}", maxPaths);
    if (stats == nullptr && maxPaths > 0)
      return invalid_argument("stats is NULL with maxPaths {}", maxPaths);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    if (peer < -1 || peer >= c->nranks())
      return invalid_argument("peer {} is not -1 or a rank of {} ({} ranks)", peer, c->describe(),
                              c->nranks());
    const std::vector<PathReport> reports = c->path_reports(peer);
    *nPaths = static_cast<int>(reports.size());
    for (size_t i = 0; i < reports.size() && i < static_cast<size_t>(maxPaths); ++i) {
      const PathReport& r = reports[i];
      chorusPathStats_t& s = stats[i];
      s = chorusPathStats_t{};
      s.peer = r.peer;
      s.path = r.path;
      copy_name(s.transport, r.transport);
      copy_name(s.name, r.name);
      s.failed = r.failed ? 1 : r.failed_over ? 2 : 0;
      s.chunks = r.stats.chunks;
      s.bytes = r.stats.bytes;
      s.busySeconds = static_cast<double>(r.stats.busy_ns) / 1e9;
      s.sentChunks = r.stats.sent_chunks;
      s.sentBytes = r.stats.sent_bytes;
      s.messages = r.stats.messages;
      s.messageBytes = r.stats.message_bytes;
      s.routeBytesPerSecond = r.stats.rate * 1e9;
      s.networkKnown = r.network_known ? 1 : 0;
      if (r.network_known) {
        s.unackedBytes = r.network.unacked_bytes;
        s.deliveryBytesPerSecond = r.network.delivery_rate * 1e9;
        s.rttSeconds = r.network.rtt_ns / 1e9;
      }
    }
    return Status();
  });
}

CHORUS_API ncclResult_t chorusCommDumpPaths(ncclComm_t comm, char* buffer, size_t size,
                                            size_t* needed) {
  return guard("chorusCommDumpPaths", [&]() -> Status {
    if (buffer == nullptr && size > 0) return invalid_argument("buffer is NULL with size {}", size);
    CHORUS_ASSIGN_OR_RETURN(std::shared_ptr<Comm> c, find_comm(comm));
    return copy_text(c->describe_paths(), buffer, size, needed);
  });
}
