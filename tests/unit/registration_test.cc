// SPDX-License-Identifier: Apache-2.0
// The registration cache on its own: range lookup, handles and pins, the errors of
// deregistering or freeing memory in use, eviction of implicit entries, transport keys, and the
// memfd behind ncclMemAlloc memory.
#include <catch2/catch.hpp>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/registration.h"

namespace chorus {
namespace {

using OnMiss = RegistrationCache::OnMiss;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

std::string label() { return "comm test"; }

// Page-aligned malloc'ed memory (not ncclMemAlloc'ed).
struct PlainBuffer {
  explicit PlainBuffer(size_t pages)
      : bytes(pages * kPage), p(static_cast<char*>(std::aligned_alloc(kPage, bytes))) {}
  ~PlainBuffer() { std::free(p); }
  size_t bytes;
  char* p;
};

// Pins [p, p + bytes) and reports the base of the registration found (nullptr: none).
const void* covering(RegistrationCache& cache, const char* p, size_t bytes) {
  Result<RegistrationPin> pin = cache.pin(p, bytes, "lookup");
  REQUIRE(pin.ok());
  return *pin ? pin->range().base : nullptr;
}

TEST_CASE("lookup finds a registration that covers the whole range, boundaries exact",
          "[unit][reg]") {
  RegistrationCache cache(label);
  PlainBuffer buf(1);
  char* b = buf.p;
  Result<void*> inner = cache.register_range(b + 100, 100);  // [100, 200)
  REQUIRE(inner.ok());
  CHECK(covering(cache, b + 100, 100) == b + 100);
  CHECK(covering(cache, b + 199, 1) == b + 100);  // last byte
  CHECK(covering(cache, b + 99, 1) == nullptr);   // one before
  CHECK(covering(cache, b + 99, 2) == nullptr);   // starts one before
  CHECK(covering(cache, b + 199, 2) == nullptr);  // ends one past
  CHECK(covering(cache, b + 200, 1) == nullptr);  // one past
  CHECK(covering(cache, b + 150, 0) == nullptr);  // zero bytes: nothing to pin

  SECTION("nested: the outer registration covers what the inner does not") {
    Result<void*> outer = cache.register_range(b, kPage);
    REQUIRE(outer.ok());
    CHECK(covering(cache, b + 99, 2) == b);
    CHECK(covering(cache, b + kPage - 1, 1) == b);
    CHECK(covering(cache, b + kPage - 1, 2) == nullptr);
    const void* either = covering(cache, b + 150, 10);
    CHECK((either == b || either == b + 100));
    REQUIRE(cache.deregister(*outer).ok());
    CHECK(covering(cache, b + 99, 2) == nullptr);
  }
  SECTION("overlapping: a range across two registrations is covered by neither") {
    REQUIRE(cache.register_range(b + 150, 150).ok());  // [150, 300)
    CHECK(covering(cache, b + 250, 50) == b + 150);
    CHECK(covering(cache, b + 120, 100) == nullptr);
    CHECK(cache.stats().entries == 2);
  }
  SECTION("bad ranges are rejected") {
    CHECK(cache.register_range(b, 0).status().code() == Code::kInvalidArgument);
    CHECK(cache.register_range(nullptr, 8).status().code() == Code::kInvalidArgument);
    CHECK(cache.register_range(b, SIZE_MAX).status().code() == Code::kInvalidArgument);
    CHECK(cache.pin(b, SIZE_MAX, "x").status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("registering a range twice gives two handles sharing one entry", "[unit][reg]") {
  RegistrationCache cache(label);
  PlainBuffer buf(1);
  Result<void*> h1 = cache.register_range(buf.p, 64);
  Result<void*> h2 = cache.register_range(buf.p, 64);
  REQUIRE((h1.ok() && h2.ok()));
  CHECK(*h1 != *h2);
  CHECK(cache.stats().entries == 1);
  CHECK(cache.stats().handles == 2);
  CHECK(cache.stats().bytes == 64);
  REQUIRE(cache.deregister(*h1).ok());
  CHECK(covering(cache, buf.p, 64) == buf.p);
  REQUIRE(cache.deregister(*h2).ok());
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().bytes == 0);

  Status again = cache.deregister(*h2);
  CHECK(again.code() == Code::kInvalidArgument);
  CHECK_THAT(again.message(), Catch::Contains("not a registration of comm test"));
  int local = 0;
  CHECK(cache.deregister(&local).code() == Code::kInvalidArgument);
}

TEST_CASE("a pinned registration cannot lose its last handle", "[unit][reg]") {
  RegistrationCache cache(label);
  PlainBuffer buf(1);
  Result<void*> h = cache.register_range(buf.p, 256);
  REQUIRE(h.ok());
  Result<RegistrationPin> pin = cache.pin(buf.p + 8, 8, "AllReduce #12 (count 2, float, sum)");
  REQUIRE((pin.ok() && *pin));
  CHECK(cache.stats().pins == 1);

  Status busy = cache.deregister(*h);
  CHECK(busy.code() == Code::kInvalidUsage);
  CHECK_THAT(busy.message(), Catch::Contains("in use by AllReduce #12 (count 2, float, sum)"));
  CHECK_THAT(busy.message(), Catch::Contains("comm test"));
  CHECK(cache.stats().handles == 1);  // still registered

  {
    Result<RegistrationPin> second = cache.pin(buf.p, 256, "Broadcast #13");
    REQUIRE((second.ok() && *second));
    CHECK_THAT(cache.deregister(*h).message(), Catch::Contains("and 1 more"));
    CHECK(cache.stats().pins == 2);
  }
  CHECK(cache.stats().pins == 1);

  // Another handle on the same entry may go: the entry stays.
  Result<void*> h2 = cache.register_range(buf.p, 256);
  REQUIRE(h2.ok());
  REQUIRE(cache.deregister(*h2).ok());

  // Pins move; the moved-from one is empty and releasing it does nothing.
  RegistrationPin moved = std::move(*pin);
  CHECK(!*pin);
  CHECK(moved);
  pin->reset();
  CHECK(cache.stats().pins == 1);
  moved.reset();
  CHECK(cache.stats().pins == 0);
  REQUIRE(cache.deregister(*h).ok());
  CHECK(cache.stats().entries == 0);
}

TEST_CASE("implicit registrations are evicted least recently used first", "[unit][reg]") {
  RegistrationCache cache(label, 3 * kPage);
  PlainBuffer buf(8);
  auto page = [&](size_t i) { return buf.p + i * kPage; };
  auto touch = [&](size_t i) {
    Result<RegistrationPin> pin = cache.pin(page(i) + 1, 10, "op", OnMiss::kRegister);
    REQUIRE((pin.ok() && *pin));
    CHECK(pin->range().base == page(i));  // whole pages
    CHECK(pin->range().bytes == kPage);
  };
  touch(0);
  touch(1);
  touch(2);
  CHECK(cache.stats().entries == 3);
  CHECK(cache.stats().implicit_entries == 3);
  CHECK(cache.stats().bytes == 3 * kPage);
  touch(0);  // order now 1, 2, 0
  touch(3);  // over the limit: 1 goes
  CHECK(cache.stats().entries == 3);
  CHECK(covering(cache, page(1), 1) == nullptr);
  CHECK(covering(cache, page(2), 1) == page(2));  // order now 0, 3, 2
  touch(4);                                       // 0 goes
  CHECK(covering(cache, page(0), 1) == nullptr);
  CHECK(covering(cache, page(3), 1) == page(3));
  CHECK(covering(cache, page(4), 1) == page(4));

  SECTION("pinned entries stay until released, then go") {
    std::vector<RegistrationPin> held;
    for (size_t i = 5; i < 8; ++i) {
      Result<RegistrationPin> pin = cache.pin(page(i), kPage, "op", OnMiss::kRegister);
      REQUIRE(pin.ok());
      held.push_back(std::move(*pin));
    }
    // 2, 3 and 4 were evicted for them; the three pinned exceed nothing yet.
    CHECK(cache.stats().entries == 3);
    Result<RegistrationPin> extra = cache.pin(page(0), kPage, "op", OnMiss::kRegister);
    REQUIRE(extra.ok());
    CHECK(cache.stats().entries == 4);  // every one pinned: over the limit for now
    held[1].reset();                    // page 6 is unpinned and least recently used: it goes
    CHECK(cache.stats().entries == 3);
    CHECK(covering(cache, page(6), 1) == nullptr);
  }
  SECTION("explicit registrations are never evicted, and adopt an implicit entry") {
    Result<void*> big = cache.register_range(buf.p, 8 * kPage);
    REQUIRE(big.ok());
    // Over the limit: every unpinned implicit entry went, the explicit one stays.
    CHECK(cache.stats().entries == 1);
    CHECK(cache.stats().implicit_entries == 0);
    PlainBuffer other(1);
    REQUIRE(cache.pin(other.p, 8, "op", OnMiss::kRegister).ok());  // dropped on release
    CHECK(cache.stats().entries == 1);
    Result<RegistrationPin> pin = cache.pin(other.p, 8, "op", OnMiss::kRegister);
    REQUIRE(pin.ok());
    Result<void*> adopt = cache.register_range(other.p, kPage);  // the implicit entry's range
    REQUIRE(adopt.ok());
    CHECK(cache.stats().entries == 2);
    CHECK(cache.stats().implicit_entries == 0);
    pin->reset();
    CHECK(cache.stats().entries == 2);
    REQUIRE(cache.deregister(*adopt).ok());
    REQUIRE(cache.deregister(*big).ok());
    CHECK(cache.stats().bytes == 0);
  }
}

TEST_CASE("with a zero limit, implicit entries last only while pinned", "[unit][reg]") {
  RegistrationCache cache(label, 0);
  PlainBuffer buf(1);
  {
    Result<RegistrationPin> pin = cache.pin(buf.p, 8, "op", OnMiss::kRegister);
    REQUIRE((pin.ok() && *pin));
    CHECK(cache.stats().entries == 1);
  }
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().bytes == 0);
}

// A transport's key double: counts how many exist.
struct FakeKey : RegistrationKey {
  explicit FakeKey(int* live) : live(live) { ++*live; }
  ~FakeKey() override { --*live; }
  int* live;
};

TEST_CASE("transport keys: made once per entry on first use, destroyed with it", "[unit][reg]") {
  int live = 0, made = 0;
  bool fail = false;
  std::vector<RegisteredRange> seen;
  auto cache = std::make_unique<RegistrationCache>(label, kPage);
  KeyFactory factory = [&](const RegisteredRange& range)
      -> Result<std::unique_ptr<RegistrationKey>> {
    if (fail) return invalid_usage("device refused");
    ++made;
    seen.push_back(range);
    return std::unique_ptr<RegistrationKey>(std::make_unique<FakeKey>(&live));
  };
  int slot = cache->add_key_factory("fake", factory);
  int other = cache->add_key_factory("other", factory);
  CHECK(slot != other);
  PlainBuffer buf(4);

  Result<void*> h = cache->register_range(buf.p, 1000);
  REQUIRE(h.ok());
  CHECK(made == 0);  // lazily
  {
    Result<RegistrationPin> a = cache->pin(buf.p, 10, "op");
    Result<RegistrationPin> b = cache->pin(buf.p + 10, 10, "op");
    REQUIRE((a.ok() && b.ok()));
    Result<RegistrationKey*> ka = a->key(slot);
    Result<RegistrationKey*> kb = b->key(slot);
    REQUIRE((ka.ok() && kb.ok()));
    CHECK(*ka == *kb);
    CHECK(made == 1);
    CHECK(seen.back().base == buf.p);
    CHECK(seen.back().bytes == 1000);
    CHECK(!seen.back().memfd);  // malloc'ed memory
    REQUIRE(a->key(other).ok());  // one key per transport
    CHECK(made == 2);
    CHECK(a->key(7).status().code() == Code::kInternalError);
  }
  CHECK(live == 2);
  REQUIRE(cache->deregister(*h).ok());
  CHECK(live == 0);

  SECTION("a factory error is reported with context, and retried next time") {
    Result<RegistrationPin> pin = cache->pin(buf.p, 10, "op", OnMiss::kRegister);
    REQUIRE(pin.ok());
    fail = true;
    Status s = pin->key(slot).status();
    CHECK(s.code() == Code::kInvalidUsage);
    CHECK_THAT(s.message(), Catch::Contains("fake registering"));
    CHECK_THAT(s.message(), Catch::Contains("device refused"));
    fail = false;
    CHECK(pin->key(slot).ok());
    CHECK(live == 1);
  }
  SECTION("eviction destroys the keys of an implicit entry") {
    {
      Result<RegistrationPin> pin = cache->pin(buf.p, 10, "op", OnMiss::kRegister);
      REQUIRE((pin.ok() && pin->key(slot).ok()));
    }
    CHECK(live == 1);  // cached: within the limit
    REQUIRE(cache->pin(buf.p + kPage, 10, "op", OnMiss::kRegister).ok());  // evicts the first
    CHECK(cache->stats().entries == 1);
    CHECK(live == 0);
  }
  SECTION("removing a factory destroys its keys and retires its slot") {
    Result<void*> h2 = cache->register_range(buf.p, 64);
    REQUIRE(h2.ok());
    Result<RegistrationPin> pin = cache->pin(buf.p, 64, "op");
    REQUIRE((pin.ok() && pin->key(slot).ok() && pin->key(other).ok()));
    CHECK(live == 2);
    cache->remove_key_factory(slot);
    CHECK(live == 1);
    CHECK(pin->key(slot).status().code() == Code::kInternalError);
    pin->reset();
    REQUIRE(cache->deregister(*h2).ok());
    CHECK(live == 0);
  }
  SECTION("destroying the cache destroys the keys") {
    REQUIRE(cache->register_range(buf.p, 64).ok());
    {
      Result<RegistrationPin> pin = cache->pin(buf.p, 64, "op");
      REQUIRE((pin.ok() && pin->key(slot).ok()));
    }
    CHECK(live == 1);
    cache.reset();
    CHECK(live == 0);
  }
}

TEST_CASE("transport keys: a pin gets the key of its registration, made for the whole range",
          "[unit][reg]") {
  int live = 0;
  std::vector<RegisteredRange> seen;
  RegistrationCache cache(label);
  int slot = cache.add_key_factory("fake", [&](const RegisteredRange& range)
                                               -> Result<std::unique_ptr<RegistrationKey>> {
    seen.push_back(range);
    return std::unique_ptr<RegistrationKey>(std::make_unique<FakeKey>(&live));
  });
  PlainBuffer buf(2);
  Result<void*> other = cache.register_range(buf.p + kPage, kPage);
  Result<void*> first = cache.register_range(buf.p + 256, 512);  // [256, 768)
  REQUIRE((first.ok() && other.ok()));
  {
    // Every pin of a part of one range shares its key; another range has its own.
    Result<RegistrationPin> a = cache.pin(buf.p + 256, 8, "op");
    Result<RegistrationPin> b = cache.pin(buf.p + 700, 68, "op");
    Result<RegistrationPin> c = cache.pin(buf.p + kPage + 8, 8, "op");
    REQUIRE((a.ok() && b.ok() && c.ok()));
    Result<RegistrationKey*> ka = a->key(slot);
    Result<RegistrationKey*> kb = b->key(slot);
    Result<RegistrationKey*> kc = c->key(slot);
    REQUIRE((ka.ok() && kb.ok() && kc.ok()));
    CHECK(*ka == *kb);
    CHECK(*ka != *kc);
    REQUIRE(seen.size() == 2);
    CHECK(seen[0].base == buf.p + 256);
    CHECK(seen[0].bytes == 512);
    CHECK(seen[1].base == buf.p + kPage);
    CHECK(seen[1].bytes == kPage);
  }
  CHECK(live == 2);  // unpinned, still registered: kept for the next operation
  REQUIRE(cache.deregister(*first).ok());
  CHECK(live == 1);
  // A retired slot makes no more keys; a factory added later gets a slot of its own.
  cache.remove_key_factory(slot);
  CHECK(live == 0);
  cache.remove_key_factory(slot);  // twice: nothing left to do
  int again = cache.add_key_factory("fake", [&](const RegisteredRange&)
                                                -> Result<std::unique_ptr<RegistrationKey>> {
    return std::unique_ptr<RegistrationKey>(std::make_unique<FakeKey>(&live));
  });
  CHECK(again != slot);
  Result<RegistrationPin> pin = cache.pin(buf.p + kPage, 8, "op");
  REQUIRE((pin.ok() && *pin));
  CHECK(pin->key(slot).status().code() == Code::kInternalError);
  CHECK(pin->key(again).ok());
  CHECK(seen.size() == 2);
  pin->reset();
  REQUIRE(cache.deregister(*other).ok());
  CHECK(live == 0);
}

TEST_CASE("ncclMemAlloc memory has a memfd, malloc'ed memory has none", "[unit][reg]") {
  Result<void*> alloc = alloc_shared(kPage + 1);  // rounded up to two pages
  REQUIRE(alloc.ok());
  char* p = static_cast<char*>(*alloc);
  CHECK(reinterpret_cast<uintptr_t>(p) % kPage == 0);

  std::optional<MemfdLocation> at = find_shared(p, 2 * kPage);
  REQUIRE(at);
  CHECK(at->fd >= 0);
  CHECK(at->offset == 0);
  std::optional<MemfdLocation> inside = find_shared(p + 100, 10);
  REQUIRE(inside);
  CHECK(inside->fd == at->fd);
  CHECK(inside->offset == 100);
  CHECK(!find_shared(p, 2 * kPage + 1));  // runs past the end
  CHECK(!find_shared(p - 1, 2));           // starts before
  PlainBuffer plain(1);
  CHECK(!find_shared(plain.p, 8));

  // The memfd maps the same memory: what a same-host peer would see.
  void* peer = mmap(nullptr, 2 * kPage, PROT_READ, MAP_SHARED, at->fd, 0);
  REQUIRE(peer != MAP_FAILED);
  std::strcpy(p + kPage + 5, "registered");
  CHECK(std::strcmp(static_cast<char*>(peer) + kPage + 5, "registered") == 0);
  munmap(peer, 2 * kPage);

  RegistrationCache cache(label);
  SECTION("a registration reports the memfd and offset of its range") {
    Result<void*> h = cache.register_range(p + kPage + 8, 100);
    REQUIRE(h.ok());
    Result<RegistrationPin> pin = cache.pin(p + kPage + 8, 100, "op");
    REQUIRE((pin.ok() && *pin));
    REQUIRE(pin->range().memfd);
    CHECK(pin->range().memfd->fd == at->fd);
    CHECK(pin->range().memfd->offset == kPage + 8);
    Result<void*> plain_h = cache.register_range(plain.p, 8);
    REQUIRE(plain_h.ok());
    Result<RegistrationPin> outside = cache.pin(plain.p, 8, "op");
    REQUIRE((outside.ok() && *outside));
    CHECK(!outside->range().memfd);
    pin->reset();
    outside->reset();
    REQUIRE(cache.deregister(*h).ok());
    REQUIRE(cache.deregister(*plain_h).ok());
  }
  SECTION("freeing registered memory fails until it is deregistered") {
    Result<void*> h = cache.register_range(p + 16, 32);
    REQUIRE(h.ok());
    Status busy = free_shared(p);
    CHECK(busy.code() == Code::kInvalidUsage);
    CHECK_THAT(busy.message(), Catch::Contains("still registered on comm test"));
    CHECK_THAT(busy.message(),
               Catch::Contains(fmt::format("{:#x}", reinterpret_cast<uintptr_t>(p))));
    CHECK(find_shared(p, 8));  // still allocated
    REQUIRE(cache.deregister(*h).ok());
  }
  SECTION("freeing memory an operation pins fails, naming the operation") {
    Result<RegistrationPin> pin = cache.pin(p, 8, "AlltoAll #3", OnMiss::kRegister);
    REQUIRE((pin.ok() && *pin));
    Status busy = free_shared(p);
    CHECK(busy.code() == Code::kInvalidUsage);
    CHECK_THAT(busy.message(), Catch::Contains("in use by AlltoAll #3 on comm test"));
    pin->reset();
    CHECK(cache.stats().entries == 1);  // implicit, cached
  }
  REQUIRE(free_shared(p).ok());  // drops implicit entries of it
  CHECK(cache.stats().entries == 0);
  CHECK(!find_shared(p, 8));
  CHECK(free_shared(p).code() == Code::kInvalidArgument);
  CHECK(free_shared(plain.p).code() == Code::kInvalidArgument);
  CHECK(alloc_shared(0).status().code() == Code::kInvalidArgument);
}

TEST_CASE("a destroyed cache no longer holds ncclMemAlloc memory", "[unit][reg]") {
  Result<void*> p = alloc_shared(64);
  REQUIRE(p.ok());
  {
    RegistrationCache cache(label);
    REQUIRE(cache.register_range(*p, 64).ok());
    CHECK(free_shared(*p).code() == Code::kInvalidUsage);
  }
  CHECK(free_shared(*p).ok());
}

TEST_CASE("pins from one thread, registrations from another", "[unit][reg]") {
  RegistrationCache cache(label, 4 * kPage);
  PlainBuffer buf(8);
  Result<void*> stable = cache.register_range(buf.p, kPage);
  REQUIRE(stable.ok());
  constexpr int kRounds = 20000;
  std::atomic<bool> failed{false};

  // The "progress thread": pins explicit and implicit ranges, as operations would.
  std::thread pinner([&] {
    for (int i = 0; i < kRounds && !failed; ++i) {
      Result<RegistrationPin> a = cache.pin(buf.p + 8, 64, "op A");
      Result<RegistrationPin> b = cache.pin(buf.p + kPage * (1 + i % 4), 64, "op B",
                                            OnMiss::kRegister);
      if (!a.ok() || !*a || !b.ok() || !*b) failed = true;
      std::this_thread::yield();  // hold the pins a while
    }
  });
  // The user thread: registers and deregisters ranges the pinner also uses.
  int refused = 0;
  for (int i = 0; i < kRounds / 4 && !failed; ++i) {
    Result<void*> h = cache.register_range(buf.p + kPage * (1 + i % 4), 2 * kPage);
    if (!h.ok()) {
      failed = true;
      break;
    }
    std::this_thread::yield();  // let the pinner find it
    Status s;
    while (!(s = cache.deregister(*h)).ok()) {
      if (s.code() != Code::kInvalidUsage) {
        failed = true;
        break;
      }
      ++refused;  // pinned right now: retry
    }
  }
  pinner.join();
  CHECK(!failed);
  INFO("deregistrations refused while pinned: " << refused);
  RegistrationCache::Stats s = cache.stats();
  CHECK(s.pins == 0);
  CHECK(s.handles == 1);
  REQUIRE(cache.deregister(*stable).ok());
}

}  // namespace
}  // namespace chorus
