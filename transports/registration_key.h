// SPDX-License-Identifier: Apache-2.0
// File: transports/registration_key.h
// What a transport keeps for registered memory: its key for one registered range (a verbs MR, a
// UCX memory handle), made by the factory it hands core (TransportInstance::key_factory).
//
// Core's registration cache (src/core/registration.h) holds the ranges: it calls a transport's
// factory at most once per range, on the first transfer that needs the key, and destroys the
// key with the range (deregistered, evicted) or when the transport's factory is removed, which
// core does before it destroys the transport's instance. So a key may rely on the instance (a
// UCP context, a protection domain) outliving it. A posted request carries the key of the range
// its buffer lies in (Request::key).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

#include "common/status.h"
#include "transports/transport.h"

namespace chorus {

// A transport's key for one registered range. Destroyed by the cache, with the cache's lock
// held, on whichever thread deregisters or evicts the range, removes the factory or destroys
// the cache: a key's destructor must not call back into the cache.
class RegistrationKey {
 public:
  virtual ~RegistrationKey() = default;
};

// One registered range, as transports see it.
struct RegisteredRange {
  const void* base = nullptr;
  size_t bytes = 0;
  std::optional<MemfdLocation> memfd;  // of base, when in ncclMemAlloc memory; held open meanwhile
};

// Makes a transport's key for a range; called with the cache locked, for a range that has no
// key of this transport yet (again after an error). An error is not fatal to the transfer that
// asked: core logs it once and the transfer goes without a key.
using KeyFactory =
    std::function<Result<std::unique_ptr<RegistrationKey>>(const RegisteredRange& range)>;

}  // namespace chorus
