// SPDX-License-Identifier: Apache-2.0
// The flight recorder's window: the last N operations, oldest first, described from their
// summaries only when read; updates to operations that left the window are ignored.
#include <catch2/catch.hpp>

#include <string>

#include "core/flight_recorder.h"

namespace chorus {
namespace {

OpSummary allreduce(uint32_t seq, uint64_t count) {
  OpSummary s;
  s.kind = OpSummary::Kind::kCollective;
  s.ncalls = 1;
  s.calls[0].tag.coll = static_cast<uint8_t>(CollKind::kAllReduce);
  s.calls[0].tag.dtype = static_cast<uint8_t>(DataType::kFloat32);
  s.calls[0].tag.redop = static_cast<uint8_t>(RedOpKind::kSum);
  s.calls[0].tag.seq = seq;
  s.calls[0].tag.count = count;
  s.bytes = count * 4;
  return s;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("flight recorder keeps the last operations, oldest first", "[flight]") {
  FlightRecorder recorder(3);
  uint64_t ids[5];
  for (uint32_t i = 0; i < 5; ++i) {
    ids[i] = recorder.queued([&](OpSummary* s) { *s = allreduce(i, 100 + i); });
    recorder.started(ids[i]);
    if (i != 3) recorder.finished(ids[i], Status());
  }
  recorder.finished(ids[0], Status(Code::kInternalError, "late"));  // left the window: ignored
  recorder.finished(ids[3], Status(Code::kRemoteError, "rank 1 died"));
  const std::string dump = recorder.dump("comm X");
  INFO(dump);
  CHECK(dump.find("flight recorder of comm X: 3 operation(s)") != std::string::npos);
  CHECK(dump.find("AllReduce #0 ") == std::string::npos);
  CHECK(dump.find("AllReduce #1 ") == std::string::npos);
  CHECK(dump.find("late") == std::string::npos);
  const size_t at2 = dump.find("AllReduce #2 (count 102, float, sum), 408 bytes: took");
  const size_t at3 = dump.find("FAILED AllReduce #3 (count 103, float, sum), 412 bytes");
  const size_t at4 = dump.find("done AllReduce #4 (count 104, float, sum)");
  REQUIRE(at2 != std::string::npos);
  REQUIRE(at3 != std::string::npos);
  REQUIRE(at4 != std::string::npos);
  CHECK(at2 < at3);
  CHECK(at3 < at4);
  CHECK(dump.find("rank 1 died") != std::string::npos);
  CHECK(occurrences(dump, "\n  [") == 3);
}

TEST_CASE("flight recorder describes send/receive groups with their peers", "[flight]") {
  FlightRecorder recorder(4);
  OpSummary group;
  group.kind = OpSummary::Kind::kP2p;
  group.ncalls = 10;
  group.nsends = 5;
  for (size_t i = 0; i < group.calls.size(); ++i) {
    group.calls[i].send = i % 2 == 0;
    group.calls[i].peer = static_cast<int>(i);
    group.calls[i].tag.seq = 7;
    group.calls[i].tag.count = 16;
    group.calls[i].tag.dtype = static_cast<uint8_t>(DataType::kInt32);
  }
  uint64_t id = recorder.queued([&](OpSummary* s) { *s = group; });
  const std::string dump = recorder.dump("comm Y");
  INFO(dump);
  CHECK(dump.find("queued group of 5 sends and 5 receives: send to 0 #7 (16 x int32) receive "
                  "from 1 #7 (16 x int32)") != std::string::npos);
  CHECK(dump.find("... (2 more)") != std::string::npos);
  recorder.pending(id, "pending for rank 3");
  CHECK(recorder.dump("comm Y").find("; pending for rank 3") != std::string::npos);
}

TEST_CASE("flight recorder takes a call that ran and ended in one entry", "[flight]") {
  FlightRecorder recorder(2);
  recorder.completed([](OpSummary* s) { *s = allreduce(5, 2); }, Status());
  recorder.completed([](OpSummary* s) { *s = allreduce(6, 2); },
                     Status(Code::kRemoteError, "rank 1 went away"));
  const std::string dump = recorder.dump("comm W");
  INFO(dump);
  CHECK(dump.find("done AllReduce #5 (count 2, float, sum), 8 bytes: took 0 ms") !=
        std::string::npos);
  CHECK(dump.find("FAILED AllReduce #6 (count 2, float, sum), 8 bytes: took 0 ms") !=
        std::string::npos);
  CHECK(dump.find("rank 1 went away") != std::string::npos);
  // Reusing the slot of a failed entry leaves no stale failure behind.
  recorder.completed([](OpSummary* s) { *s = allreduce(7, 2); }, Status());
  recorder.completed([](OpSummary* s) { *s = allreduce(8, 2); }, Status());
  CHECK(recorder.dump("comm W").find("went away") == std::string::npos);
}

TEST_CASE("flight recorder with no capacity records nothing", "[flight]") {
  FlightRecorder recorder(0);
  CHECK(recorder.queued([](OpSummary* s) { *s = allreduce(0, 1); }) == 0);
  recorder.started(0);
  recorder.finished(0, Status());
  recorder.completed([](OpSummary* s) { *s = allreduce(1, 1); }, Status());
  CHECK(recorder.dump("comm Z").find("0 operation(s)") != std::string::npos);
}

}  // namespace
}  // namespace chorus
