// SPDX-License-Identifier: Apache-2.0
// File: tests/unit/shm_transport_test.cc
// Shared-memory transport: ranks as threads of this process (and a forked process) exchange
// messages of many sizes through small FIFOs, reduce on receive, and report mismatches.
#include "transports/shm/shm_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "common/process.h"
#include "kernels/fp8/convert.h"
#include "kernels/reduce/reduce.h"
#include "core/task.h"
#include "transports/small_box.h"

namespace chorus::shm {
namespace {

constexpr size_t kSmallFifo = 64 << 10;  // smaller than most messages: wrap-around, streaming
constexpr int64_t kTimeoutMs = 30000;

// Ranks 0..n-1 of this process, connected to each other over shared memory.
struct Group {
  std::vector<std::unique_ptr<ShmSegment>> segments;
  std::vector<ShmSetup> setups;
  std::vector<ShmConnections> conns;  // [rank][peer index][channel]

  Connection* get(int from, int to, int channel = 0) {
    const auto& peers = setups[from].peers;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].rank == to) return conns[from][i][channel].get();
    }
    return nullptr;
  }
};

std::vector<ShmSetup> make_setups(const std::vector<std::unique_ptr<ShmSegment>>& segments,
                                  int channels, size_t fifo_bytes) {
  int n = static_cast<int>(segments.size());
  std::vector<ShmSetup> setups(n);
  for (int r = 0; r < n; ++r) {
    ShmSetup& s = setups[r];
    s.rank = r;
    s.channels = channels;
    s.fifo_bytes = fifo_bytes;
    s.segment = segments[r].get();
    s.deadline = Deadline::after_ms(kTimeoutMs);
    for (int q = 0; q < n; ++q) s.local_ranks.push_back(q);
    for (int q = n - 1; q >= 0; --q) {  // peers may come in any order
      if (q != r) {
        s.peers.push_back({q, getpid(), segments[q]->fd(), ProcessContext::get().doorbell_fd()});
      }
    }
  }
  return setups;
}

// Runs connect_all for every setup concurrently, as the ranks of a comm would.
std::vector<Result<ShmConnections>> connect_concurrently(const std::vector<ShmSetup>& setups) {
  std::vector<std::optional<Result<ShmConnections>>> results(setups.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < setups.size(); ++r) {
    threads.emplace_back([&, r] { results[r].emplace(connect_all(setups[r])); });
  }
  for (auto& t : threads) t.join();
  std::vector<Result<ShmConnections>> out;
  for (auto& r : results) out.push_back(std::move(*r));
  return out;
}

Group connect_group(int n, int channels = 1, size_t fifo_bytes = kSmallFifo) {
  Group g;
  for (int r = 0; r < n; ++r) {
    auto segment = ShmSegment::create();
    REQUIRE(segment.ok());
    g.segments.push_back(std::move(segment.value()));
  }
  g.setups = make_setups(g.segments, channels, fifo_bytes);
  for (auto& result : connect_concurrently(g.setups)) {
    INFO(result.status().to_string());
    REQUIRE(result.ok());
    g.conns.push_back(std::move(result.value()));
  }
  return g;
}

// Bytes that differ at every offset and per seed, so a misplaced or stale piece shows.
std::vector<uint8_t> pattern(size_t bytes, int seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    uint64_t h = (i + static_cast<uint64_t>(seed) * 0x100000001b3ull) * 0x9e3779b97f4a7c15ull;
    v[i] = static_cast<uint8_t>(h >> 56);
  }
  return v;
}

MsgTag tag_for(uint32_t seq, size_t bytes, int sender) {
  MsgTag tag;
  tag.seq = seq;
  tag.coll = static_cast<uint8_t>(CollKind::kSend);
  tag.dtype = static_cast<uint8_t>(DataType::kUint8);
  tag.root = sender;
  tag.count = bytes;
  return tag;
}

// Progresses `conns` until every request is done; "" or what went wrong. Thread-safe as long as
// no two threads drive one connection.
std::string drive(const std::vector<Connection*>& conns, const std::vector<const Request*>& reqs,
                  Deadline deadline = Deadline::after_ms(kTimeoutMs)) {
  for (;;) {
    bool changed = false;
    for (Connection* c : conns) changed = c->progress() || changed;
    if (std::all_of(reqs.begin(), reqs.end(), [](const Request* r) { return r->done(); })) break;
    if (deadline.expired()) {
      std::string text = "timed out; bytes done:";
      for (const Request* r : reqs) text += fmt::format(" {}/{}", r->bytes_done.load(), r->bytes);
      return text;
    }
    if (!changed) std::this_thread::yield();
  }
  for (Connection* c : conns) {
    if (!c->error().ok()) return c->error().to_string();
  }
  for (const Request* r : reqs) {
    if (r->failed()) return "a request failed without a connection error";
  }
  return "";
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) names.insert(e.path());
  return names;
}

// Mappings and fds of our segments held by this process.
int count_segment_handles() {
  int n = 0;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    n += line.find("memfd:chorus-shm") != std::string::npos;
  }
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    n += !ec && target.string().find("memfd:chorus-shm") != std::string::npos;
  }
  return n;
}

// Every rank sends sizes[k] bytes to every other rank and receives as much from each, all
// queued at once; each rank progresses its own connections in its own thread.
void exchange_all(int n, size_t fifo_bytes, const std::vector<size_t>& sizes) {
  Group g = connect_group(n, 1, fifo_bytes);
  // [to][from][k], filled by the receivers.
  std::vector<std::vector<std::vector<std::vector<uint8_t>>>> got(
      n, std::vector<std::vector<std::vector<uint8_t>>>(
             n, std::vector<std::vector<uint8_t>>(sizes.size())));
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::deque<SendRequest> sends;
      std::deque<RecvRequest> recvs;
      std::deque<std::vector<uint8_t>> sent;
      std::vector<Connection*> conns;
      std::vector<const Request*> reqs;
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        conns.push_back(g.get(r, q));
        for (size_t k = 0; k < sizes.size(); ++k) {
          sent.push_back(pattern(sizes[k], r * 100 + q * 10 + static_cast<int>(k)));
          SendRequest& s = sends.emplace_back();
          s.buf = sent.back().data();
          s.bytes = sizes[k];
          s.tag = tag_for(static_cast<uint32_t>(k), sizes[k], r);
          g.get(r, q)->post_send(&s);
          reqs.push_back(&s);
          got[r][q][k].resize(sizes[k]);
          RecvRequest& v = recvs.emplace_back();
          v.dst = got[r][q][k].data();
          v.bytes = sizes[k];
          v.tag = tag_for(static_cast<uint32_t>(k), sizes[k], q);
          g.get(r, q)->post_recv(&v);
          reqs.push_back(&v);
        }
      }
      errors[r] = drive(conns, reqs);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r] == "");
    for (int q = 0; q < n; ++q) {
      for (size_t k = 0; q != r && k < sizes.size(); ++k) {
        INFO("from " << q << ", " << sizes[k] << " bytes");
        REQUIRE(got[r][q][k] == pattern(sizes[k], q * 100 + r * 10 + static_cast<int>(k)));
      }
    }
  }
  for (int r = 0; r < n; ++r) REQUIRE(g.get(r, (r + 1) % n)->idle());
}

TEST_CASE("shm: messages of many sizes between 2 and 3 ranks", "[unit][shm]") {
  auto dev_shm_before = dev_shm_entries();
  int handles_before = count_segment_handles();
  int n = GENERATE(2, 3);
  INFO(n << " ranks");
  exchange_all(n, kSmallFifo, {0, 1, 7, 64, 4096, (3u << 20) + 5});
  // Every mapping and fd went with the connections and segments; nothing is left behind.
  REQUIRE(count_segment_handles() == handles_before);
  std::vector<std::string> added;
  for (const auto& name : dev_shm_entries()) {
    if (!dev_shm_before.count(name)) added.push_back(name);
  }
  REQUIRE(added.empty());
}

TEST_CASE("shm: random sizes through a minimal FIFO of odd size", "[unit][shm]") {
  // 4 KiB + 64: not a power of two, so wrap-around falls on a different offset every lap.
  const size_t fifo_bytes = (4 << 10) + 64;
  std::vector<size_t> sizes;
  uint32_t x = 12345;
  for (int k = 0; k < 200; ++k) {
    x = x * 1664525u + 1013904223u;
    sizes.push_back(k % 10 == 0 ? (x >> 10) % (fifo_bytes * 5) : (x >> 10) % 300);
  }
  exchange_all(3, fifo_bytes, sizes);
}

TEST_CASE("shm: queued sends are matched with later receives in order", "[unit][shm]") {
  Group g = connect_group(2, 2);
  const std::vector<size_t> sizes = {100, 0, 70000, 5, 200000, 64};
  const int channel = 1;
  Connection* a = g.get(0, 1, channel);
  Connection* b = g.get(1, 0, channel);
  std::deque<SendRequest> sends;
  std::deque<RecvRequest> recvs;
  std::vector<std::vector<uint8_t>> sent(sizes.size());
  std::vector<std::vector<uint8_t>> got(sizes.size());
  std::vector<const Request*> reqs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    SendRequest& s = sends.emplace_back();
    sent[k] = pattern(sizes[k], static_cast<int>(k));
    s.buf = sent[k].data();
    s.bytes = sizes[k];
    s.tag = tag_for(static_cast<uint32_t>(k), sizes[k], 0);
    a->post_send(&s);
    reqs.push_back(&s);
  }
  // The FIFO fills up: the sender cannot finish alone.
  for (int i = 0; i < 100; ++i) a->progress();
  REQUIRE_FALSE(sends.back().done());
  REQUIRE(sends.front().done());
  for (size_t k = 0; k < sizes.size(); ++k) {
    got[k].resize(sizes[k]);
    RecvRequest& v = recvs.emplace_back();
    v.dst = got[k].data();
    v.bytes = sizes[k];
    v.tag = tag_for(static_cast<uint32_t>(k), sizes[k], 0);
    b->post_recv(&v);
    reqs.push_back(&v);
  }
  REQUIRE(drive({a, b}, reqs) == "");
  for (size_t k = 0; k < sizes.size(); ++k) {
    REQUIRE(got[k] == pattern(sizes[k], static_cast<int>(k)));
    REQUIRE(recvs[k].bytes_done.load() == sizes[k]);
  }
  REQUIRE(a->idle());
  REQUIRE(b->idle());
}

struct ReduceCase {
  const char* name;
  DataType type;
  kernels::ReduceOp op;
};

std::vector<uint8_t> random_elements(DataType type, size_t count, uint32_t seed) {
  std::vector<uint8_t> out(count * datatype_size(type));
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    float f = static_cast<float>(x >> 20) / 64.0f - 32.0f;
    if (type == DataType::kFloat32) std::memcpy(&out[i * 4], &f, 4);
    if (type == DataType::kInt32) std::memcpy(&out[i * 4], &x, 4);
    if (type == DataType::kFloat16) {
      uint16_t h = kernels::float_to_half(f);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

TEST_CASE("shm: receives reduce straight from the FIFO", "[unit][shm]") {
  auto c =
      GENERATE(values<ReduceCase>({{"float sum", DataType::kFloat32, kernels::ReduceOp::kSum},
                                   {"int32 max", DataType::kInt32, kernels::ReduceOp::kMax},
                                   {"half sum", DataType::kFloat16, kernels::ReduceOp::kSum}}));
  bool in_place = GENERATE(false, true);
  INFO(c.name << (in_place ? ", in place" : ", out of place"));
  const size_t count = 70001;  // several FIFOs' worth, odd
  const size_t elem = datatype_size(c.type);
  kernels::ReduceFn fn = kernels::reduce_fn(c.type, c.op);
  std::vector<uint8_t> incoming = random_elements(c.type, count, 1);
  std::vector<uint8_t> mine = random_elements(c.type, count, 2);
  std::vector<uint8_t> expected(count * elem);
  fn(expected.data(), mine.data(), incoming.data(), count);
  std::vector<uint8_t> out(count * elem);

  Group g = connect_group(2);
  MsgTag tag = tag_for(9, count, 0);
  tag.coll = static_cast<uint8_t>(CollKind::kAllReduce);
  tag.dtype = static_cast<uint8_t>(c.type);
  tag.redop = static_cast<uint8_t>(c.op);
  SendRequest s;
  s.buf = incoming.data();
  s.bytes = incoming.size();
  s.tag = tag;
  RecvRequest v;
  v.dst = in_place ? mine.data() : out.data();
  v.src = mine.data();
  v.reduce = fn;
  v.elem_size = elem;
  v.bytes = incoming.size();
  v.tag = tag;
  g.get(0, 1)->post_send(&s);
  g.get(1, 0)->post_recv(&v);
  REQUIRE(drive({g.get(0, 1), g.get(1, 0)}, {&s, &v}) == "");
  REQUIRE((in_place ? mine : out) == expected);
}

TEST_CASE("shm: a mismatched tag or size fails with both descriptions", "[unit][shm]") {
  bool size_differs = GENERATE(false, true);
  Group g = connect_group(2);
  Connection* a = g.get(0, 1);
  Connection* b = g.get(1, 0);
  MsgTag sent_tag;
  sent_tag.seq = 5;
  sent_tag.coll = static_cast<uint8_t>(CollKind::kAllGather);
  sent_tag.dtype = static_cast<uint8_t>(DataType::kFloat32);
  sent_tag.count = 8;
  MsgTag want_tag = sent_tag;
  if (!size_differs) want_tag.coll = static_cast<uint8_t>(CollKind::kAllReduce);
  std::vector<float> data(8, 1.0f);
  std::vector<float> out(8);
  SendRequest s;
  s.buf = data.data();
  s.bytes = 32;
  s.tag = sent_tag;
  RecvRequest v;
  v.dst = out.data();
  v.bytes = size_differs ? 16 : 32;
  v.tag = want_tag;
  a->post_send(&s);
  b->post_recv(&v);
  REQUIRE(drive({a, b}, {&s, &v}) != "");
  REQUIRE(v.failed());
  REQUIRE(b->error().code() == Code::kInvalidUsage);
  // The size is the message's, said apart from the call's count (a ring step's message is a
  // part of the call: "(count 8, float) (32 bytes)" read as the call's size).
  REQUIRE(b->error().message() == fmt::format("rank 0 sent {} in a message of 32 bytes but rank 1 "
                                              "expects {} in a message of {} bytes from it",
                                              describe_tag(sent_tag), describe_tag(want_tag),
                                              v.bytes));
  if (!size_differs) {
    CHECK_THAT(b->error().message(), Catch::Contains("AllGather #5 (count 8, float)") &&
                                         Catch::Contains("AllReduce #5 (count 8, float, sum)"));
  }
  // The receiver gave up on the connection: the sender's next message fails instead of hanging.
  SendRequest s2;
  s2.buf = data.data();
  s2.bytes = 32;
  s2.tag = sent_tag;
  a->post_send(&s2);
  REQUIRE(drive({a}, {&s2}) != "");
  REQUIRE(s2.failed());
  REQUIRE(a->error().code() == Code::kRemoteError);
  REQUIRE_THAT(a->error().message(), Catch::Contains("rank 1 (pid") && Catch::Contains("closed"));
}

TEST_CASE("shm: a closing peer delivers what it sent, then pending receives fail", "[unit][shm]") {
  Group g = connect_group(2);
  std::vector<uint8_t> data = pattern(60000, 3);  // fits in the FIFO
  SendRequest s;
  s.buf = data.data();
  s.bytes = data.size();
  s.tag = tag_for(1, data.size(), 0);
  g.get(0, 1)->post_send(&s);
  std::vector<uint8_t> got(data.size());
  RecvRequest v1;
  v1.dst = got.data();
  v1.bytes = got.size();
  v1.tag = s.tag;
  RecvRequest v2;
  v2.bytes = 0;
  v2.tag = tag_for(2, 0, 0);
  REQUIRE(drive({g.get(0, 1), g.get(1, 0)}, {&s}) == "");
  RecvRequest orphan;
  orphan.tag = tag_for(1, 0, 1);
  g.get(0, 1)->post_recv(&orphan);
  g.conns[0].clear();  // rank 0 leaves after its send completed, before rank 1 received it all
  REQUIRE(orphan.failed());
  g.get(1, 0)->post_recv(&v1);
  g.get(1, 0)->post_recv(&v2);
  REQUIRE(drive({g.get(1, 0)}, {&v1, &v2}) != "");
  REQUIRE(v1.state.load() == Request::kDone);
  REQUIRE(got == data);
  REQUIRE(v2.failed());
  REQUIRE(g.get(1, 0)->error().code() == Code::kRemoteError);
  REQUIRE_THAT(g.get(1, 0)->error().message(),
               Catch::Contains(fmt::format("rank 0 (pid {}) closed", getpid())) &&
                   Catch::Contains("Send #2"));
}

TEST_CASE("shm: channel 0 has a small-message box to each peer, closed with its connection",
          "[unit][shm][box]") {
  Group g = connect_group(3, /*channels=*/2);
  for (int r = 0; r < 3; ++r) {
    for (int q = 0; q < 3; ++q) {
      if (q == r) continue;
      REQUIRE(g.get(r, q, 0)->small_box() != nullptr);
      CHECK(g.get(r, q, 1)->small_box() == nullptr);
    }
  }
  // Rank 2 writes into its box to rank 1 (in rank 1's segment); rank 1 reads it there.
  const std::vector<uint8_t> data = pattern(3000, 5);
  SmallBox* out = g.get(2, 1)->small_box();
  SmallBox* in = g.get(1, 2)->small_box();
  BoxWait w;
  REQUIRE(out->can_send(&w, data.size()));
  REQUIRE(out->send(tag_for(1, data.size(), 2), data.data(), data.size()).ok());
  REQUIRE(in->can_receive(&w));
  Result<const void*> got = in->receive(tag_for(1, data.size(), 2), data.size());
  REQUIRE(got.ok());
  CHECK(std::memcmp(*got, data.data(), data.size()) == 0);
  in->release();
  // Rank 1 waits for the next one; rank 2 leaves: the wait ends, and the receive names rank 2.
  REQUIRE_FALSE(in->can_receive(&w));
  g.conns[2].clear();
  CHECK(WaitCond{w.word, w.target}.ready());
  REQUIRE(in->can_receive(&w));
  got = in->receive(tag_for(2, 8, 2), 8);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == Code::kRemoteError);
  CHECK_THAT(got.status().message(), Catch::Contains("rank 2 closed"));
}

// A message by reference is read straight from the sender's memory. A sender whose operation
// failed stops waiting for the reader and may free the buffer (seen in the SIGKILL fault test: a
// survivor freed its buffer while another survivor still read it): the reader fails with a
// remote error naming the sender, not a system error.
TEST_CASE("shm: a sender's buffer that disappears mid-read is the sender's failure",
          "[unit][shm]") {
  // Reads by reference are off by default: on for the connections made here only, and off again
  // even if connecting fails.
  struct ReadByReference {
    ReadByReference() {
      setenv("CHORUS_SHM_CMA_BYTES", "65536", 1);
      params::reload_for_testing();
    }
    ~ReadByReference() {
      unsetenv("CHORUS_SHM_CMA_BYTES");
      params::reload_for_testing();
    }
  };
  std::optional<ReadByReference> by_reference(std::in_place);
  Group g = connect_group(2);
  by_reference.reset();
  const size_t bytes = 4 << 20;  // by reference, several pieces
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  std::memset(mem, 7, bytes);
  std::vector<uint8_t> got(bytes);
  RecvRequest v;
  v.dst = got.data();
  v.bytes = bytes;
  v.tag = tag_for(1, bytes, 0);
  g.get(1, 0)->post_recv(&v);
  g.get(1, 0)->progress();  // the reader checks that it can read its peer's memory
  SendRequest s;
  s.buf = mem;
  s.bytes = bytes;
  s.tag = v.tag;
  g.get(0, 1)->post_send(&s);
  for (int i = 0; i < 100 && v.bytes_done.load() == 0; ++i) {
    g.get(0, 1)->progress();
    g.get(1, 0)->progress();  // reads the first piece (256 KiB) per call
  }
  REQUIRE(v.bytes_done.load() > 0);
  REQUIRE(v.bytes_done.load() < bytes);
  REQUIRE(munmap(mem, bytes) == 0);  // the sender gave up and freed it
  REQUIRE(drive({g.get(1, 0)}, {&v}) != "");
  REQUIRE(v.failed());
  INFO(g.get(1, 0)->error().to_string());
  CHECK(g.get(1, 0)->error().code() == Code::kRemoteError);
  CHECK_THAT(g.get(1, 0)->error().message(),
             Catch::Contains(fmt::format("rank 0 (pid {})", getpid())) &&
                 Catch::Contains("its buffer is gone") && Catch::Contains("Send #1"));
  g.conns[0].clear();  // the sender's pending send fails with its connection
  CHECK(s.failed());
}

TEST_CASE("shm: setup errors name the peer", "[unit][shm]") {
  std::vector<std::unique_ptr<ShmSegment>> segments;
  for (int r = 0; r < 2; ++r) segments.push_back(std::move(ShmSegment::create().value()));
  std::vector<ShmSetup> setups = make_setups(segments, 1, kSmallFifo);
  ShmSetup& s = setups[0];
  s.deadline = Deadline::after_ms(300);
  const std::string who = fmt::format("rank 1 (pid {})", getpid());

  SECTION("an fd that does not exist") {
    s.peers[0].shm_fd = 1 << 20;
    auto result = connect_all(s);
    REQUIRE(result.status().code() == Code::kSystemError);
    REQUIRE_THAT(result.status().message(),
                 Catch::StartsWith("cannot map the shared-memory segment of " + who +
                                   fmt::format(": open /proc/{}/fd/{}", getpid(), 1 << 20)));
  }
  SECTION("an fd that is not a segment") {
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    s.peers[0].shm_fd = fds[0];
    auto result = connect_all(s);
    close(fds[0]);
    close(fds[1]);
    REQUIRE(result.status().code() == Code::kInvalidArgument);
    REQUIRE_THAT(result.status().message(),
                 Catch::Contains(who) && Catch::Contains("not a shared-memory file"));
  }
  SECTION("a peer that never sizes its segment") {
    auto result = connect_all(s);
    REQUIRE(result.status().code() == Code::kRemoteError);
    REQUIRE_THAT(result.status().message(), Catch::Contains(who) && Catch::Contains("deadline"));
  }
  SECTION("ranks that disagree on the layout") {
    setups[1].channels = 2;
    setups[1].deadline = s.deadline;
    for (auto& result : connect_concurrently(setups)) {
      REQUIRE(result.status().code() == Code::kInvalidUsage);
      REQUIRE_THAT(result.status().message(), Catch::Contains("CHORUS_NCHANNELS"));
    }
  }
  SECTION("a malformed setup") {
    std::swap(s.local_ranks[0], s.local_ranks[1]);
    REQUIRE(connect_all(s).status().code() == Code::kInvalidArgument);
  }
  SECTION("a segment connected twice") {
    s.local_ranks = {0};
    s.peers.clear();
    REQUIRE(connect_all(s).ok());
    REQUIRE(connect_all(s).status().code() == Code::kInvalidUsage);
  }
}

// ---- Two processes --------------------------------------------------------------------------

struct WireInfo {
  int pid;
  int shm_fd;
  int doorbell_fd;
};
constexpr size_t kProcessBytes = 1 << 20;

bool write_full(int fd, const void* p, size_t n) {
  return write(fd, p, n) == static_cast<ssize_t>(n);  // n < PIPE_BUF: atomic
}

bool read_full(int fd, void* p, size_t n, Deadline deadline) {
  auto* out = static_cast<char*>(p);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, deadline.remaining_ms(100)) < 0 && errno != EINTR) return false;
    ssize_t got = read(fd, out, n);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return false;
    if (got > 0) {
      out += got;
      n -= static_cast<size_t>(got);
    } else if (deadline.expired()) {
      return false;
    }
  }
  return true;
}

// Rank `rank` of two: swaps WireInfo over the pipes, connects, sends pattern(rank) and
// receives the other's. "" or what failed.
std::string run_process_rank(int rank, int in_fd, int out_fd, std::vector<uint8_t>* got) {
  Deadline deadline = Deadline::after_ms(kTimeoutMs);
  auto segment = ShmSegment::create();
  if (!segment.ok()) return segment.status().to_string();
  WireInfo mine{getpid(), segment.value()->fd(), ProcessContext::get().doorbell_fd()};
  WireInfo theirs{};
  if (!write_full(out_fd, &mine, sizeof(mine)) ||
      !read_full(in_fd, &theirs, sizeof(theirs), deadline)) {
    return "pipe exchange failed";
  }
  ShmSetup setup;
  setup.rank = rank;
  setup.fifo_bytes = kSmallFifo;
  setup.segment = segment.value().get();
  setup.local_ranks = {0, 1};
  setup.peers = {{1 - rank, theirs.pid, theirs.shm_fd, theirs.doorbell_fd}};
  setup.deadline = deadline;
  auto conns = connect_all(setup);
  if (!conns.ok()) return conns.status().to_string();
  Connection* c = conns.value()[0][0].get();
  std::vector<uint8_t> data = pattern(kProcessBytes, rank);
  got->assign(kProcessBytes, 0);
  SendRequest s;
  s.buf = data.data();
  s.bytes = kProcessBytes;
  s.tag = tag_for(0, kProcessBytes, rank);
  RecvRequest v;
  v.dst = got->data();
  v.bytes = kProcessBytes;
  v.tag = tag_for(0, kProcessBytes, 1 - rank);
  c->post_send(&s);
  c->post_recv(&v);
  return drive({c}, {&s, &v}, deadline);
}

// Kills and reaps the child unless it was reaped already.
struct ChildGuard {
  pid_t pid;
  ~ChildGuard() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

TEST_CASE("shm: two processes exchange 1 MiB both ways", "[unit][shm]") {
  int to_child[2];
  int to_parent[2];
  REQUIRE(pipe2(to_child, O_CLOEXEC) == 0);
  REQUIRE(pipe2(to_parent, O_CLOEXEC) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: no Catch2 here, the result is the exit code.
    std::vector<uint8_t> got;
    std::string error = run_process_rank(1, to_child[0], to_parent[1], &got);
    if (!error.empty()) std::fprintf(stderr, "shm child: %s\n", error.c_str());
    _exit(!error.empty() ? 1 : got == pattern(kProcessBytes, 0) ? 0 : 2);
  }
  ChildGuard guard{pid};
  std::vector<uint8_t> got;
  std::string error = run_process_rank(0, to_parent[0], to_child[1], &got);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
  REQUIRE(error == "");
  REQUIRE(got == pattern(kProcessBytes, 1));
  int status = 0;
  pid_t reaped = 0;
  Deadline deadline = Deadline::after_ms(kTimeoutMs);
  while ((reaped = waitpid(pid, &status, WNOHANG)) == 0 && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(reaped == pid);
  guard.pid = -1;
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace chorus::shm
