// SPDX-License-Identifier: Apache-2.0
// File: src/core/registration.cc
// The registration cache and the table of ncclMemAlloc memory (design in registration.h).
#include "core/registration.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/params.h"
#include "common/unique_fd.h"

namespace chorus {

struct SharedAllocation {
  uintptr_t begin = 0, end = 0;
  UniqueFd fd;
  uint64_t inode = 0;
};

namespace {

// Lock order: g_caches_mutex -> RegistrationCache::mutex_ -> g_shared_mutex.
std::mutex g_caches_mutex;
std::vector<RegistrationCache*>& live_caches() {
  static auto* caches = new std::vector<RegistrationCache*>();
  return *caches;
}

std::mutex g_shared_mutex;
std::map<uintptr_t, std::shared_ptr<const SharedAllocation>>& shared_allocations() {
  static auto* table = new std::map<uintptr_t, std::shared_ptr<const SharedAllocation>>();
  return *table;
}

// The allocation holding all of [begin, end), or null.
std::shared_ptr<const SharedAllocation> find_allocation(uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(g_shared_mutex);
  auto& table = shared_allocations();
  auto it = table.upper_bound(begin);
  if (it == table.begin()) return nullptr;
  --it;
  return end <= it->second->end ? it->second : nullptr;
}

uintptr_t page_size() {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// "[0x7f0000001000, 0x7f0000002000) (4096 bytes)".
std::string describe_range(uintptr_t begin, uintptr_t end) {
  return fmt::format("[{:#x}, {:#x}) ({} bytes)", begin, end, end - begin);
}

Status check_range(const void* p, size_t bytes, uintptr_t* begin, uintptr_t* end) {
  *begin = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr) return invalid_argument("buffer is NULL");
  if (bytes == 0) return invalid_argument("size is 0");
  if (bytes > UINTPTR_MAX - *begin)
    return invalid_argument("{} + {} bytes overflows the address space", p, bytes);
  *end = *begin + bytes;
  return Status();
}

}  // namespace

// ---- ncclMemAlloc memory ----

Result<void*> alloc_shared(size_t bytes) {
  if (bytes == 0) return invalid_argument("size is 0");
  if (bytes > SIZE_MAX - page_size()) return invalid_argument("size {} is too large", bytes);
  size_t rounded = (bytes + page_size() - 1) / page_size() * page_size();
  UniqueFd fd(static_cast<int>(
      syscall(SYS_memfd_create, "chorus-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!fd.valid()) return system_error(errno, "memfd_create");
  fchmod(fd.get(), 0600);
  if (ftruncate(fd.get(), static_cast<off_t>(rounded)) != 0)
    return system_error(errno, fmt::format("ftruncate to {} bytes", rounded));
  // Same-host peers map it (the shm transport): sealed, its size never changes under them.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return system_error(errno, "sealing the memfd");
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return system_error(errno, "fstat of the memfd");
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return system_error(errno, fmt::format("mmap of {} bytes", rounded));
  auto alloc = std::make_shared<SharedAllocation>();
  alloc->begin = reinterpret_cast<uintptr_t>(p);
  alloc->end = alloc->begin + rounded;
  alloc->fd = std::move(fd);
  alloc->inode = static_cast<uint64_t>(st.st_ino);
  {
    std::lock_guard<std::mutex> lock(g_shared_mutex);
    shared_allocations()[alloc->begin] = alloc;
  }
  // Implicit entries left from memory once mapped here describe pages that are gone.
  std::lock_guard<std::mutex> lock(g_caches_mutex);
  for (RegistrationCache* cache : live_caches()) cache->drop_stale(alloc->begin, alloc->end);
  return p;
}

Status free_shared(void* p) {
  std::lock_guard<std::mutex> caches_lock(g_caches_mutex);  // no registration races the checks
  std::shared_ptr<const SharedAllocation> alloc;
  {
    std::lock_guard<std::mutex> lock(g_shared_mutex);
    auto it = shared_allocations().find(reinterpret_cast<uintptr_t>(p));
    if (it == shared_allocations().end())
      return invalid_argument("{} was not allocated by ncclMemAlloc (or was freed)", p);
    alloc = it->second;
  }
  for (RegistrationCache* cache : live_caches())
    CHORUS_RETURN_IF_ERROR(cache->release_for_free(alloc->begin, alloc->end));
  {
    std::lock_guard<std::mutex> lock(g_shared_mutex);
    shared_allocations().erase(alloc->begin);
  }
  munmap(p, alloc->end - alloc->begin);
  return Status();  // the memfd closes with the last reference to alloc
}

std::optional<MemfdLocation> find_shared(const void* p, size_t bytes) {
  auto begin = reinterpret_cast<uintptr_t>(p);
  if (bytes > UINTPTR_MAX - begin) return std::nullopt;
  auto alloc = find_allocation(begin, begin + bytes);
  if (!alloc) return std::nullopt;
  return MemfdLocation{alloc->fd.get(), begin - alloc->begin, alloc->inode};
}

// ---- The cache ----

RegistrationCache::RegistrationCache(std::function<std::string()> label, size_t limit_bytes)
    : label_(std::move(label)), limit_(limit_bytes) {
  std::lock_guard<std::mutex> lock(g_caches_mutex);
  live_caches().push_back(this);
}

RegistrationCache::~RegistrationCache() {
  std::lock_guard<std::mutex> lock(g_caches_mutex);
  auto& caches = live_caches();
  caches.erase(std::find(caches.begin(), caches.end(), this));
}

size_t RegistrationCache::default_limit() {
  return static_cast<size_t>(params::kRegCacheBytes.get());
}

Result<void*> RegistrationCache::register_range(const void* p, size_t bytes) {
  uintptr_t begin = 0, end = 0;
  CHORUS_RETURN_IF_ERROR(check_range(p, bytes, &begin, &end));
  auto handle = std::make_unique<Handle>();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find({begin, end});
  Entry* e = it != entries_.end() ? &it->second : insert(begin, end);
  if (e->handles++ == 0) lru_.erase(e->lru);  // no longer implicit: never evicted
  handle->entry = e;
  void* key = handle.get();
  handles_.emplace(key, std::move(handle));
  evict();
  return key;
}

Status RegistrationCache::deregister(void* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(handle);
  if (it == handles_.end())
    return invalid_argument("handle {} is not a registration of {}", handle, label_());
  Entry* e = it->second->entry;
  if (e->handles == 1 && e->pins > 0) {
    return invalid_usage("handle {} of {}: {} is in use by {}; it stays registered (deregister "
                         "it once the operation completes)",
                         handle, label_(), describe_range(e->begin, e->end), pinned_by(e));
  }
  handles_.erase(it);
  if (e->handles > 1) {
    --e->handles;
  } else {
    erase(e);  // not in the LRU list: it has a handle until now
  }
  return Status();
}

Result<RegistrationPin> RegistrationCache::pin(const void* p, size_t bytes, const char* what,
                                               OnMiss miss) {
  if (bytes == 0) return RegistrationPin();
  uintptr_t begin = 0, end = 0;
  CHORUS_RETURN_IF_ERROR(check_range(p, bytes, &begin, &end));
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find_covering(begin, end);
  const bool created = e == nullptr;
  if (created) {
    if (miss == OnMiss::kEmptyPin) return RegistrationPin();
    const uintptr_t page = page_size();
    if (end > UINTPTR_MAX - (page - 1))
      return invalid_argument("{} + {} bytes overflows the address space", p, bytes);
    e = insert(begin & ~(page - 1), (end + page - 1) & ~(page - 1));
  }
  if (e->handles == 0) lru_.splice(lru_.end(), lru_, e->lru);  // most recently used
  PinSlot* slot = free_slots_;
  if (slot != nullptr) {
    free_slots_ = slot->next_free;
  } else {
    slot = &slots_.emplace_back();
  }
  slot->entry = e;
  slot->what = what;
  ++e->pins;
  ++pins_;
  if (created) evict();  // never e: it is pinned
  return RegistrationPin(this, slot);
}

void RegistrationCache::unpin(PinSlot* slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = slot->entry;
  *slot = PinSlot{nullptr, nullptr, free_slots_};
  free_slots_ = slot;
  --pins_;
  if (--e->pins == 0 && e->handles == 0 && bytes_ > limit_) evict();
}

Result<RegistrationKey*> RegistrationCache::key(PinSlot* slot, int factory) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto index = static_cast<size_t>(factory);
  if (factory < 0 || index >= factories_.size() || !factories_[index].make)
    return internal_error("{} has no registration key factory in slot {}", label_(), factory);
  const Factory& f = factories_[index];
  Entry* e = slot->entry;
  if (e->keys.size() <= index) e->keys.resize(factories_.size());
  std::unique_ptr<RegistrationKey>& key = e->keys[index];
  if (!key) {
    Result<std::unique_ptr<RegistrationKey>> made = f.make(e->range);
    if (!made.ok()) {
      Status s = made.take_status();
      return s.with_context(fmt::format("{} registering {} on {}", f.transport,
                                        describe_range(e->begin, e->end), label_()));
    }
    if (!*made) return internal_error("{} made a null registration key", f.transport);
    key = std::move(made).value();
  }
  return key.get();
}

int RegistrationCache::add_key_factory(std::string transport, KeyFactory make) {
  std::lock_guard<std::mutex> lock(mutex_);
  factories_.push_back(Factory{std::move(transport), std::move(make)});
  return static_cast<int>(factories_.size() - 1);
}

void RegistrationCache::remove_key_factory(int slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto index = static_cast<size_t>(slot);
  if (slot < 0 || index >= factories_.size()) return;
  factories_[index].make = nullptr;
  for (auto& [range, e] : entries_) {
    if (e.keys.size() > index) e.keys[index].reset();
  }
}

bool RegistrationCache::empty() const {
  return entry_count_.load(std::memory_order_acquire) == 0;
}

RegistrationCache::Stats RegistrationCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return Stats{entries_.size(), lru_.size(), handles_.size(), pins_, bytes_};
}

// ---- Helpers (mutex_ held) ----

RegistrationCache::Entry* RegistrationCache::find_covering(uintptr_t begin, uintptr_t end) {
  // Candidates start at or before begin; none starting more than max_entry_bytes_ before end
  // can reach it.
  auto it = entries_.upper_bound({begin, UINTPTR_MAX});
  while (it != entries_.begin()) {
    --it;
    Entry& e = it->second;
    if (end - e.begin > max_entry_bytes_) break;
    if (e.end >= end) return &e;
  }
  return nullptr;
}

RegistrationCache::Entry* RegistrationCache::insert(uintptr_t begin, uintptr_t end) {
  Entry& e = entries_[{begin, end}];
  e.begin = begin;
  e.end = end;
  e.shared = find_allocation(begin, end);
  e.range.base = reinterpret_cast<const void*>(begin);
  e.range.bytes = end - begin;
  if (e.shared)
    e.range.memfd = MemfdLocation{e.shared->fd.get(), begin - e.shared->begin, e.shared->inode};
  e.lru = lru_.insert(lru_.end(), &e);
  bytes_ += e.range.bytes;
  max_entry_bytes_ = std::max(max_entry_bytes_, e.range.bytes);
  entry_count_.store(entries_.size(), std::memory_order_release);
  return &e;
}

void RegistrationCache::erase(Entry* e) {
  if (e->handles == 0) lru_.erase(e->lru);
  const size_t bytes = e->range.bytes;
  bytes_ -= bytes;
  entries_.erase({e->begin, e->end});
  entry_count_.store(entries_.size(), std::memory_order_release);
  if (bytes == max_entry_bytes_) {
    max_entry_bytes_ = 0;
    for (const auto& [range, other] : entries_)
      max_entry_bytes_ = std::max(max_entry_bytes_, other.range.bytes);
  }
}

void RegistrationCache::evict() {
  for (auto it = lru_.begin(); it != lru_.end() && bytes_ > limit_;) {
    Entry* e = *it++;
    if (e->pins == 0) erase(e);
  }
}

template <typename Fn>
void RegistrationCache::for_overlapping(uintptr_t begin, uintptr_t end, Fn&& fn) {
  uintptr_t from = begin - std::min<uintptr_t>(begin, max_entry_bytes_);
  for (auto it = entries_.lower_bound({from, 0}); it != entries_.end() && it->first.first < end;
       ++it) {
    if (it->second.end > begin) fn(it->second);
  }
}

Status RegistrationCache::release_for_free(uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  Status busy;
  std::vector<Entry*> implicit;
  for_overlapping(begin, end, [&](Entry& e) {
    if (!busy.ok()) return;
    if (e.pins > 0) {
      busy = invalid_usage("memory {} is in use by {} on {}", describe_range(begin, end),
                           pinned_by(&e), label_());
    } else if (e.handles > 0) {
      busy = invalid_usage("memory {} is still registered on {} (as {}): ncclCommDeregister it "
                           "first", describe_range(begin, end), label_(),
                           describe_range(e.begin, e.end));
    } else {
      implicit.push_back(&e);
    }
  });
  if (!busy.ok()) return busy;
  for (Entry* e : implicit) erase(e);
  return Status();
}

void RegistrationCache::drop_stale(uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry*> stale;
  for_overlapping(begin, end, [&](Entry& e) {
    if (e.handles == 0 && e.pins == 0) stale.push_back(&e);
  });
  for (Entry* e : stale) erase(e);
}

std::string RegistrationCache::pinned_by(const Entry* e) const {
  const PinSlot* first = nullptr;
  for (const PinSlot& s : slots_) {
    if (s.entry == e) {
      first = &s;
      break;
    }
  }
  std::string text = first != nullptr && first->what != nullptr ? first->what : "an operation";
  if (e->pins > 1) text += fmt::format(" and {} more", e->pins - 1);
  return text;
}

// ---- Pins ----

RegistrationPin& RegistrationPin::operator=(RegistrationPin&& other) noexcept {
  if (this != &other) {
    reset();
    cache_ = std::exchange(other.cache_, nullptr);
    slot_ = std::exchange(other.slot_, nullptr);
  }
  return *this;
}

void RegistrationPin::reset() {
  if (slot_ == nullptr) return;
  cache_->unpin(std::exchange(slot_, nullptr));
  cache_ = nullptr;
}

}  // namespace chorus
