// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/bootstrap.h
// Rendezvous of the ranks of one communicator: ncclGetUniqueId starts a root server and
// returns its id; every rank then sends its blob (its listen addresses, host identity ...) to
// the root and gets every rank's blob back. Connections are mutually authenticated with the
// id's secret, and every wait is bounded by a deadline.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/unique_id.h"
#include "common/clock.h"
#include "common/status.h"

namespace chorus::bootstrap {

// Largest blob a rank may publish.
inline constexpr size_t kMaxBlobBytes = size_t{1} << 20;

// Picks the interface (net::pick_interface), starts a root server thread in this process on an
// ephemeral port of that address, and returns an id with a fresh random secret and a non-zero
// random comm_uid. The root serves exactly one communicator, then exits; it also gives up
// (logging which ranks never joined) after `timeout_ms` (0: CHORUS_BOOTSTRAP_TIMEOUT_MS) and
// stops at process exit. Thread-safe.
Result<UniqueId> create_unique_id(int64_t timeout_ms = 0);

// As create_unique_id, for an id every rank derived alike (chorusCommInitFromEnv's rank 0):
// the root listens on id.root exactly. kSystemError naming the address when it cannot (the
// port is taken, or the address is not one of this host's).
Status start_root_at(const UniqueId& id, int64_t timeout_ms = 0);

// Called once by every rank of the communicator with the same id and nranks. Blocks until the
// root has every rank's blob, then returns them (index = rank). `blob` <= kMaxBlobBytes.
// Errors: kInvalidArgument for bad arguments; kRemoteError when the root cannot be reached,
// fails authentication, rejects this rank (duplicate rank, nranks mismatch ...; the root's
// reason is in the message), or does not answer before `deadline` ("bootstrap: no answer from
// root <addr> after N ms (CHORUS_BOOTSTRAP_TIMEOUT_MS); J of N ranks had joined").
Result<std::vector<std::string>> exchange(const UniqueId& id, int rank, int nranks,
                                          std::string_view blob, Deadline deadline);

// ncclCommInitRankScalable: rank r contacts the root of ids[r * ids.size() / nranks]. The root
// of each group k > 0 forwards its group's blobs to the root of ids[0] (authenticating with
// ids[0]'s secret, which the ranks hand it encrypted under their session key) and relays the
// full table back. Every rank must pass the same ids in the same order; ids.size() <= nranks.
// With one id this is exchange(). Errors as exchange().
Result<std::vector<std::string>> exchange_scalable(const std::vector<UniqueId>& ids, int rank,
                                                   int nranks, std::string_view blob,
                                                   Deadline deadline);

// Root servers of this process whose thread is still running (tests, diagnostics).
int active_root_servers();

}  // namespace chorus::bootstrap
