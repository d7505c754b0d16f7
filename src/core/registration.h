// SPDX-License-Identifier: Apache-2.0
// File: src/core/registration.h
// Registered memory, one concept for every transport.
//
// A communicator's RegistrationCache holds entries: address ranges [base, base + bytes),
// nested or overlapping freely. An entry lives while something references it:
//  - user handles (ncclCommRegister, ncclCommWindowRegister): one per call, distinct even for
//    the same range, which then share one entry (as in NCCL). Never evicted;
//  - pins: an operation in flight holds a RegistrationPin on the entry covering each buffer it
//    uses. While pinned, an entry's last handle cannot be deregistered and its memory cannot be
//    ncclMemFree'd (ncclInvalidUsage naming the operation, not a crash);
//  - nothing: implicit entries, made by pin(..., OnMiss::kRegister) for buffers the user did not
//    register (the registration cache of NCCL and UCX), stay cached for the next operation and
//    are evicted least recently used first once the registered bytes exceed the limit
//    (CHORUS_REG_CACHE_BYTES). They span whole pages.
// Each entry carries per-transport keys (a verbs MR, a UCX memory handle), made on first use
// by the transport's factory (TransportInstance::key_factory, which the communicator adds and
// removes) and destroyed with the entry or the factory, and, when the range lies in
// ncclMemAlloc memory, the memfd and offset that same-host peers map it with.
//
// ncclMemAlloc memory is tracked process-wide (alloc_shared, free_shared), and every live cache
// is listed so that freeing memory a communicator still registers or pins fails.
//
// Locking: each cache has a mutex (user thread registering, progress thread pinning). Order:
// the list of caches -> a cache -> the allocation table. A pin of a registered buffer costs
// one lock, a map lookup and a slot from a free list: it allocates only when more pins are held
// at once than ever before (or when it creates an implicit entry).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transports/registration_key.h"
#include "transports/transport.h"

namespace chorus {

// Where a range of ncclMemAlloc memory lives: MemfdLocation (transports/transport.h). What
// transports keep for a range: RegistrationKey, RegisteredRange, KeyFactory
// (transports/registration_key.h).

// ---- ncclMemAlloc memory (process-wide) ----
// `bytes` (> 0) rounded up to pages, memfd-backed and mapped shared.
Result<void*> alloc_shared(size_t bytes);
// Unmaps memory from alloc_shared. Fails (ncclInvalidUsage) while a live communicator
// registers or pins any of it; implicit registrations of it are dropped.
Status free_shared(void* p);
// Where [p, p + bytes) lies when it is inside one alloc_shared allocation (the fd is valid
// until that allocation is freed).
std::optional<MemfdLocation> find_shared(const void* p, size_t bytes);

struct SharedAllocation;  // one alloc_shared allocation
class RegistrationPin;

class RegistrationCache {
 public:
  enum class OnMiss { kEmptyPin, kRegister };
  struct Stats {
    size_t entries = 0;
    size_t implicit_entries = 0;  // entries without user handles
    size_t handles = 0;
    size_t pins = 0;
    size_t bytes = 0;  // over all entries (overlaps counted twice)
  };

  // `label` names the owner in messages ("comm 0x12ab rank 0/2"). Unpinned implicit entries are
  // evicted while the entries' bytes exceed `limit_bytes`.
  explicit RegistrationCache(std::function<std::string()> label,
                             size_t limit_bytes = default_limit());
  // Releases every entry and key. Every pin must have been released.
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;
  static size_t default_limit();  // CHORUS_REG_CACHE_BYTES

  // A user registration of [p, p + bytes): a new handle, also for a range already registered.
  Result<void*> register_range(const void* p, size_t bytes);
  // kInvalidArgument for a handle that is not one of ours; kInvalidUsage, leaving it
  // registered, when it is the entry's last handle and an operation pins the entry.
  Status deregister(void* handle);
  // Pins the entry covering [p, p + bytes) for an operation described by `what` (a string that
  // outlives the pin, used in error messages). Without one: an empty pin, or with kRegister a
  // new implicit entry. Zero bytes: an empty pin.
  Result<RegistrationPin> pin(const void* p, size_t bytes, const char* what,
                              OnMiss miss = OnMiss::kEmptyPin);

  // A transport's key factory; returns the slot to pass to RegistrationPin::key().
  int add_key_factory(std::string transport, KeyFactory make);
  // Destroys every key made by the factory in `slot` and retires it (transport shutdown).
  void remove_key_factory(int slot);

  Stats stats() const;
  // No entries (one uncontended lock: what an operation checks before pinning anything).
  bool empty() const;

 private:
  friend class RegistrationPin;
  friend Status free_shared(void* p);
  friend Result<void*> alloc_shared(size_t bytes);

  struct Entry {
    RegisteredRange range;  // immutable once made
    uintptr_t begin = 0, end = 0;
    std::shared_ptr<const SharedAllocation> shared;  // keeps the memfd open
    int handles = 0;
    int pins = 0;
    std::list<Entry*>::iterator lru;                     // valid while handles == 0
    std::vector<std::unique_ptr<RegistrationKey>> keys;  // [factory slot]
  };
  struct Handle {
    Entry* entry;
  };
  struct PinSlot {
    Entry* entry = nullptr;  // null while free
    const char* what = nullptr;
    PinSlot* next_free = nullptr;
  };
  struct Factory {
    std::string transport;
    KeyFactory make;  // empty once removed
  };

  Entry* find_covering(uintptr_t begin, uintptr_t end);
  Entry* insert(uintptr_t begin, uintptr_t end);  // an implicit entry, at the MRU end
  void erase(Entry* e);
  void evict();
  // Calls fn(entry) for each entry overlapping [begin, end) (fn must not erase).
  template <typename Fn>
  void for_overlapping(uintptr_t begin, uintptr_t end, Fn&& fn);
  void unpin(PinSlot* slot);
  Result<RegistrationKey*> key(PinSlot* slot, int factory);
  // Before freeing shared memory [begin, end): fails if registered or pinned, else drops the
  // implicit entries overlapping it.
  Status release_for_free(uintptr_t begin, uintptr_t end);
  // Drops the unpinned implicit entries overlapping new memory [begin, end) (stale ranges).
  void drop_stale(uintptr_t begin, uintptr_t end);
  // "AllReduce #12 (...)" and "and N more" for the pins of e.
  std::string pinned_by(const Entry* e) const;

  const std::function<std::string()> label_;
  const size_t limit_;
  mutable std::mutex mutex_;
  std::map<std::pair<uintptr_t, uintptr_t>, Entry> entries_;  // by (begin, end)
  // entries_.size(), kept beside it (under mutex_) so that empty(), asked before every
  // operation, takes no lock.
  std::atomic<size_t> entry_count_{0};
  size_t max_entry_bytes_ = 0;  // bounds the backward scan of find_covering
  size_t bytes_ = 0;
  std::list<Entry*> lru_;  // entries without handles, least recently used first
  std::unordered_map<const void*, std::unique_ptr<Handle>> handles_;
  std::deque<PinSlot> slots_;
  PinSlot* free_slots_ = nullptr;
  size_t pins_ = 0;
  std::vector<Factory> factories_;
};

// An operation's hold on the registration covering one of its buffers; releasing it (reset or
// destruction) unpins. Empty when the buffer is not registered.
class RegistrationPin {
 public:
  RegistrationPin() = default;
  RegistrationPin(RegistrationPin&& other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)), slot_(std::exchange(other.slot_, nullptr)) {}
  RegistrationPin& operator=(RegistrationPin&& other) noexcept;
  RegistrationPin(const RegistrationPin&) = delete;
  RegistrationPin& operator=(const RegistrationPin&) = delete;
  ~RegistrationPin() { reset(); }

  explicit operator bool() const { return slot_ != nullptr; }
  // The registration covering the pinned buffer (pin must not be empty).
  const RegisteredRange& range() const { return slot_->entry->range; }
  // The key of the transport whose factory is in `factory`, made on first use.
  Result<RegistrationKey*> key(int factory) const { return cache_->key(slot_, factory); }
  void reset();

 private:
  friend class RegistrationCache;
  RegistrationPin(RegistrationCache* cache, RegistrationCache::PinSlot* slot)
      : cache_(cache), slot_(slot) {}
  RegistrationCache* cache_ = nullptr;
  RegistrationCache::PinSlot* slot_ = nullptr;
};

}  // namespace chorus
