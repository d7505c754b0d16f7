// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/small_box_test.cc
// Small-message boxes (transports/small_box.h): two sides over plain memory, as two ranks see
// them in shared memory; and the boxes of the shared-memory transport's connections.
#include "transports/small_box.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/task.h"

namespace chorus {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Rank 0 and rank 1, each with the box it consumes (in "its" memory).
struct Pair {
  std::unique_ptr<void, FreeDeleter> mem[2];
  DoorbellWord bell[2] = {};
  std::unique_ptr<SmallBox> side[2];
  Pair() {
    for (auto& m : mem) {
      m.reset(std::aligned_alloc(64, SmallBox::region_bytes()));
      std::memset(m.get(), 0, SmallBox::region_bytes());
      SmallBox::init(m.get());
    }
    // Rank r produces into the peer's memory and consumes from its own.
    side[0] = std::make_unique<SmallBox>(mem[1].get(), mem[0].get(), &bell[1], 0, 1);
    side[1] = std::make_unique<SmallBox>(mem[0].get(), mem[1].get(), &bell[0], 1, 0);
  }
};

MsgTag tag_of(uint32_t seq, uint64_t count = 2) {
  MsgTag t;
  t.seq = seq;
  t.coll = static_cast<uint8_t>(CollKind::kAllReduce);
  t.count = count;
  return t;
}

bool ready(const BoxWait& w) { return WaitCond{w.word, w.target}.ready(); }

TEST_CASE("box: messages of every size arrive in order, inline and not", "[unit][box]") {
  Pair p;
  std::mt19937 rng(7);
  for (uint32_t i = 0; i < 100; ++i) {
    const size_t bytes = i % 3 == 0 ? i % SmallBox::kInlineBytes
                                    : 1 + rng() % SmallBox::kMaxBytes;
    std::vector<unsigned char> data(bytes);
    for (auto& b : data) b = static_cast<unsigned char>(rng());
    BoxWait w;
    REQUIRE(p.side[0]->can_send(&w, bytes));
    REQUIRE(p.side[0]->send(tag_of(i, bytes), data.data(), bytes).ok());
    REQUIRE(p.side[1]->can_receive(&w));
    Result<const void*> got = p.side[1]->receive(tag_of(i, bytes), bytes);
    REQUIRE(got.ok());
    if (bytes > 0) CHECK(std::memcmp(*got, data.data(), bytes) == 0);  // data() may be null
    p.side[1]->release();
    CHECK_FALSE(p.side[1]->can_receive(&w));  // nothing more
  }
}

TEST_CASE("box: a full ring makes the producer wait until a slot is freed", "[unit][box]") {
  Pair p;
  BoxWait w;
  for (uint32_t i = 0; i < SmallBox::kSlots; ++i) {
    REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
    REQUIRE(p.side[0]->send(tag_of(i), &i, sizeof(i)).ok());
  }
  REQUIRE_FALSE(p.side[0]->can_send(&w, sizeof(uint32_t)));
  CHECK_FALSE(ready(w));
  // The consumer takes the first message: the wait is over, and the producer was asked for.
  REQUIRE(p.side[1]->can_receive(&w));
  uint32_t first = 99;
  Result<const void*> got = p.side[1]->receive(tag_of(0), sizeof(first));
  REQUIRE(got.ok());
  std::memcpy(&first, *got, sizeof(first));
  CHECK(first == 0);
  BoxWait send_wait;
  REQUIRE_FALSE(p.side[0]->can_send(&send_wait, sizeof(uint32_t)));
  p.side[1]->release();
  CHECK(ready(send_wait));
  CHECK(p.side[0]->can_send(&w, sizeof(uint32_t)));
  // Messages 1..kSlots-1 are still there, in order.
  for (uint32_t i = 1; i < SmallBox::kSlots; ++i) {
    REQUIRE(p.side[1]->can_receive(&w));
    got = p.side[1]->receive(tag_of(i), sizeof(i));
    REQUIRE(got.ok());
    uint32_t v = 0;
    std::memcpy(&v, *got, sizeof(v));
    CHECK(v == i);
    p.side[1]->release();
  }
}

TEST_CASE("box: messages with a payload area wait for one of their own, inline ones do not",
          "[unit][box]") {
  Pair p;
  BoxWait w;
  std::vector<unsigned char> big(SmallBox::kInlineBytes + 1);
  for (uint32_t i = 0; i < SmallBox::kPayloadSlots; ++i) {
    big[0] = static_cast<unsigned char>(i);
    REQUIRE(p.side[0]->can_send(&w, big.size()));
    REQUIRE(p.side[0]->send(tag_of(i), big.data(), big.size()).ok());
  }
  REQUIRE_FALSE(p.side[0]->can_send(&w, big.size()));
  CHECK_FALSE(ready(w));
  // An inline message still has a slot.
  const uint32_t small = 7;
  REQUIRE(p.side[0]->can_send(&w, sizeof(small)));
  REQUIRE(p.side[0]->send(tag_of(SmallBox::kPayloadSlots), &small, sizeof(small)).ok());
  BoxWait big_wait;
  REQUIRE_FALSE(p.side[0]->can_send(&big_wait, big.size()));
  // Areas go by ordinal: the next message (ordinal kPayloadSlots + 1) takes message 1's area,
  // free once messages 0 and 1 are read.
  for (uint32_t i = 0; i < 2; ++i) {
    CHECK_FALSE(ready(big_wait));
    REQUIRE(p.side[1]->can_receive(&w));
    Result<const void*> got = p.side[1]->receive(tag_of(i), big.size());
    REQUIRE(got.ok());
    CHECK(static_cast<const unsigned char*>(*got)[0] == i);
    p.side[1]->release();
  }
  CHECK(ready(big_wait));
  REQUIRE(p.side[0]->can_send(&w, big.size()));
  big[0] = 99;
  REQUIRE(p.side[0]->send(tag_of(SmallBox::kPayloadSlots + 1), big.data(), big.size()).ok());
  // The rest arrive intact and in order, the last one in message 1's area.
  for (uint32_t i = 2; i < SmallBox::kPayloadSlots + 2; ++i) {
    const bool inline_one = i == SmallBox::kPayloadSlots;
    const size_t bytes = inline_one ? sizeof(small) : big.size();
    REQUIRE(p.side[1]->can_receive(&w));
    Result<const void*> got = p.side[1]->receive(tag_of(i), bytes);
    REQUIRE(got.ok());
    const unsigned char want = inline_one ? 7 : i == SmallBox::kPayloadSlots + 1 ? 99 : i;
    CHECK(static_cast<const unsigned char*>(*got)[0] == want);
    p.side[1]->release();
  }
}

TEST_CASE("box: the consumer waits on the slot's word until the message is there",
          "[unit][box]") {
  Pair p;
  BoxWait w;
  REQUIRE_FALSE(p.side[1]->can_receive(&w));
  CHECK_FALSE(ready(w));
  const double x = 2.5;
  REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
  REQUIRE(p.side[0]->send(tag_of(0, 1), &x, sizeof(x)).ok());
  BoxWait recv_wait;
  REQUIRE(p.side[1]->can_receive(&recv_wait));
  // A waiter on another thread wakes when the word changes.
  REQUIRE(p.side[1]->receive(tag_of(0, 1), sizeof(x)).ok());
  p.side[1]->release();
  REQUIRE_FALSE(p.side[1]->can_receive(&recv_wait));
  std::thread producer([&] {
    BoxWait pw;
    while (!p.side[0]->can_send(&pw, sizeof(uint32_t))) std::this_thread::yield();
    REQUIRE(p.side[0]->send(tag_of(1, 1), &x, sizeof(x)).ok());
  });
  while (!ready(recv_wait)) std::this_thread::yield();
  producer.join();
  REQUIRE(p.side[1]->can_receive(&w));
  Result<const void*> got = p.side[1]->receive(tag_of(1, 1), sizeof(x));
  REQUIRE(got.ok());
  double y = 0;
  std::memcpy(&y, *got, sizeof(y));
  CHECK(y == 2.5);
}

TEST_CASE("box: a message of another collective or size is a usage error naming both",
          "[unit][box]") {
  Pair p;
  BoxWait w;
  const float v[2] = {1, 2};
  REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
  REQUIRE(p.side[0]->send(tag_of(5), v, sizeof(v)).ok());
  REQUIRE(p.side[1]->can_receive(&w));
  Result<const void*> got = p.side[1]->receive(tag_of(6), sizeof(v));
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == Code::kInvalidUsage);
  // The slot carries a digest of the tag; the message names both calls in full.
  CHECK_THAT(got.status().message(), Catch::Contains("rank 0 sent AllReduce #5 (count 2") &&
                                         Catch::Contains("rank 1 expects AllReduce #6 (count 2"));
  got = p.side[1]->receive(tag_of(5), 4);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == Code::kInvalidUsage);
  CHECK_THAT(got.status().message(), Catch::Contains("8 bytes") && Catch::Contains("4 bytes"));
}

TEST_CASE("box: a tag that differs in any field the byte stream compares is told apart",
          "[unit][box]") {
  const MsgTag sent = tag_of(9, 3);
  std::vector<MsgTag> others(6, sent);
  others[0].seq += 1;
  others[1].coll = static_cast<uint8_t>(CollKind::kAllGather);
  others[2].dtype += 1;
  others[3].redop += 1;
  others[4].root = 1;
  others[5].count += 1ull << 40;
  for (const MsgTag& expected : others) {
    REQUIRE(expected != sent);
    Pair p;
    BoxWait w;
    const float v[3] = {1, 2, 3};
    REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
    REQUIRE(p.side[0]->send(sent, v, sizeof(v)).ok());
    REQUIRE(p.side[1]->can_receive(&w));
    Result<const void*> got = p.side[1]->receive(expected, sizeof(v));
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == Code::kInvalidUsage);
    // The tag compared equal except for its chunk fields: still the same message.
    MsgTag same = sent;
    same.chunk_id = 77;
    same.flags = 0;
    got = p.side[1]->receive(same, sizeof(v));
    REQUIRE(got.ok());
    CHECK(std::memcmp(*got, v, sizeof(v)) == 0);
  }
}

TEST_CASE("box: a side that closes wakes its peer, whose wait fails naming it", "[unit][box]") {
  SECTION("a consumer waiting for the next message") {
    Pair p;
    BoxWait w;
    REQUIRE_FALSE(p.side[1]->can_receive(&w));
    p.side[0]->close();
    CHECK(ready(w));
    REQUIRE(p.side[1]->can_receive(&w));
    Result<const void*> got = p.side[1]->receive(tag_of(0), 8);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == Code::kRemoteError);
    CHECK_THAT(got.status().message(), Catch::Contains("rank 0 closed"));
  }
  SECTION("a consumer behind a full ring reads what was sent, then fails") {
    Pair p;
    BoxWait w;
    for (uint32_t i = 0; i < SmallBox::kSlots; ++i) {
      REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
      REQUIRE(p.side[0]->send(tag_of(i), &i, sizeof(i)).ok());
    }
    p.side[0]->close();
    for (uint32_t i = 0; i < SmallBox::kSlots; ++i) {
      REQUIRE(p.side[1]->can_receive(&w));
      REQUIRE(p.side[1]->receive(tag_of(i), sizeof(i)).ok());
      p.side[1]->release();
    }
    REQUIRE(p.side[1]->can_receive(&w));
    CHECK(p.side[1]->receive(tag_of(SmallBox::kSlots), 4).status().code() == Code::kRemoteError);
  }
  SECTION("a producer waiting for a free slot") {
    Pair p;
    BoxWait w;
    for (uint32_t i = 0; i < SmallBox::kSlots; ++i) {
      REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
      REQUIRE(p.side[0]->send(tag_of(i), &i, sizeof(i)).ok());
    }
    REQUIRE_FALSE(p.side[0]->can_send(&w, sizeof(uint32_t)));
    p.side[1]->close();
    CHECK(ready(w));
    REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
    Status s = p.side[0]->send(tag_of(9), &w, 4);
    CHECK(s.code() == Code::kRemoteError);
    CHECK_THAT(s.message(), Catch::Contains("rank 1 closed"));
  }
  SECTION("our own side, closed, sends nothing") {
    Pair p;
    BoxWait w;
    p.side[0]->close();
    p.side[0]->close();  // idempotent
    REQUIRE(p.side[0]->can_send(&w, sizeof(uint32_t)));
    CHECK_FALSE(p.side[0]->send(tag_of(0), &w, 4).ok());
  }
}

TEST_CASE("box: wait conditions compare counters that wrap", "[unit][box]") {
  std::atomic<uint32_t> word{0xfffffffeu};
  CHECK(WaitCond{&word, 0xfffffffeu}.ready());
  CHECK_FALSE(WaitCond{&word, 0xffffffffu}.ready());
  CHECK_FALSE(WaitCond{&word, 1}.ready());  // 1 comes 3 increments later
  word.store(2);                            // wrapped
  CHECK(WaitCond{&word, 0xffffffffu}.ready());
  CHECK(WaitCond{&word, 1}.ready());
  CHECK_FALSE(WaitCond{&word, 3}.ready());
}

}  // namespace
}  // namespace chorus
