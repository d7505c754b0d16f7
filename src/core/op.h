// SPDX-License-Identifier: Apache-2.0
// File: src/core/op.h
// An operation: one collective call, or the send/receive calls of one group on one comm,
// queued on its comm and run as fibers (src/core/task.h) by whichever thread drives the comm.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <new>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "core/op_summary.h"
#include "core/registration.h"
#include "core/task.h"
#include "kernels/reduce/reduce.h"
#include "transports/transport.h"

namespace chorus {

class Comm;
class Stream;
class OpContext;
namespace compress {
class CompressorHold;
}

struct RedOp {
  RedOpKind kind = RedOpKind::kSum;
  alignas(8) unsigned char scalar[8] = {};  // PreMulSum scalar read at creation (host immediate)
  const void* scalar_ptr = nullptr;         // PreMulSum scalar read when the op starts
};

// One NCCL call, arguments validated.
struct CollCall {
  CollKind kind = CollKind::kAllReduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  RedOp op;
  int root = -1;  // root of rooted collectives; peer of Send/Recv
  MsgTag tag;     // assigned when queued
  // Bytes of sendbuf and recvbuf this rank's part of the call touches (0: not used).
  size_t send_bytes = 0;
  size_t recv_bytes = 0;
  // A compressed call's compressor (chorus*Compressed; src/compress/), else null.
  std::shared_ptr<compress::CompressorHold> compressor;
};

// A buffer of an operation that lies in registered ncclMemAlloc memory: sends from it may be
// read by same-host receivers through their own mapping of the memfd.
struct SharedRange {
  uintptr_t begin = 0, end = 0;
  MemfdLocation memfd;  // of begin
};

class Op {
 public:
  Op(Comm* comm, std::vector<CollCall> calls, bool p2p_batch)
      : comm_(comm), calls_(std::move(calls)), p2p_batch_(p2p_batch) {}
  // A host function queued on a stream (no comm).
  explicit Op(std::function<void()> host_fn) : host_fn_(std::move(host_fn)) {}
  // An operation on a stream run by its owner outside the engine (src/core/stream.h,
  // ExternalOp), or a gate that only waits for its deps (chorusStreamWaitEvent): no comm.
  enum class Outside { kExternal, kGate };
  Op(Outside kind, std::string description)
      : calls_(), internal_(std::move(description)), outside_(kind) {}
  // An internal operation (e.g. the exchange of a split): runs `body`, tagged as internal.
  using Body = std::function<Task(OpContext&)>;
  Op(Comm* comm, std::string description, Body body)
      : comm_(comm), calls_(1), internal_(std::move(description)), body_(std::move(body)) {
    calls_.front().kind = CollKind::kInternal;
  }
  // Releases the chain of deps iteratively: a stream with a million queued operations holds a
  // million-long chain (each its predecessor), which recursive destruction would overflow the
  // stack with.
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  Comm* comm() const { return comm_; }
  std::vector<CollCall>& calls() { return calls_; }
  const std::vector<CollCall>& calls() const { return calls_; }
  bool p2p_batch() const { return p2p_batch_; }
  bool is_host_fn() const { return static_cast<bool>(host_fn_); }
  bool is_internal() const { return static_cast<bool>(body_); }
  bool is_external() const { return outside_ == Outside::kExternal; }
  bool is_gate() const { return outside_ == Outside::kGate; }
  const Body& body() const { return body_; }
  void run_host_fn() { host_fn_(); }
  // "AllReduce #12 (count 1024, float, sum)" or "group of 3 sends/receives".
  std::string describe() const;
  // Fills what the flight recorder keeps (valid once queued: it reads the calls' tags).
  void summarize(OpSummary* out) const;
  // count x datatype size, summed over the calls (what the flight recorder shows).
  size_t bytes() const;

  // Operations that must complete before this one starts (stream order).
  std::vector<std::shared_ptr<Op>>& deps() { return deps_; }
  bool deps_done() const;
  // The first failed dep's status (OK if none failed); valid once deps_done().
  Status deps_status() const;
  // Streams this op was queued on (to report errors to).
  std::vector<Stream*>& streams() { return streams_; }

  bool done() const { return done_.load(std::memory_order_acquire) != 0; }
  WaitCond done_cond() const { return WaitCond{&done_, 1}; }
  // Valid once done().
  const Status& status() const { return status_; }
  // Sets the final status and publishes done (release): once, by the driving thread.
  void complete(Status status);

  // Execution state, touched only by the thread holding the comm's drive lock.
  std::optional<FiberSet> fibers;
  // The registrations the op's buffers lie in, pinned from start to finish, and those of
  // them in shared (memfd) memory.
  std::vector<RegistrationPin> pins;
  std::vector<SharedRange> shared;
  std::string pin_label;  // what the pins name in errors
  // The transports' keys of the pins, [pin * Comm::key_slots() + slot] (empty when no
  // transport makes keys), looked up when a transfer first needs one; null: none.
  struct PinKey {
    const RegistrationKey* key = nullptr;
    bool looked_up = false;
  };
  std::vector<PinKey> pin_keys;
  // A batch of sends and receives (p2p_batch) may report its receives' arrival: called by the
  // thread driving the comm each time one has completed, with how many have (1, 2, ...: they
  // are waited for in the order posted, before the sends). Set before the op is queued
  // (group_watch_receives, core/group.h).
  std::function<void(size_t arrived)> recv_watch;
  int64_t last_progress_ns = 0;  // now_coarse_ns()
  bool started = false;
  bool direct = false;  // run by Comm::start_direct: in no queue
  uint64_t record_id = 0;  // its entry in the comm's flight recorder

 private:
  Comm* comm_ = nullptr;
  std::vector<CollCall> calls_;
  bool p2p_batch_ = false;
  std::function<void()> host_fn_;
  std::string internal_;
  Body body_;
  std::optional<Outside> outside_;
  std::vector<std::shared_ptr<Op>> deps_;
  std::vector<Stream*> streams_;
  std::atomic<uint32_t> done_{0};
  Status status_;
};

// Requests of one step of an algorithm, one per peer: inline for the usual few ranks (the
// coroutine frame holds them), on the heap beyond.
template <typename T, size_t kInline = 8>
class RequestArray {
 public:
  explicit RequestArray(size_t n) : n_(n) {
    if (n > kInline) {
      heap_ = std::make_unique<T[]>(n);
    } else {
      for (size_t i = 0; i < n; ++i) new (&slot(i)) T();  // only the n in use
    }
  }
  ~RequestArray() {
    if (n_ <= kInline)
      for (size_t i = 0; i < n_; ++i) slot(i).~T();
  }
  RequestArray(const RequestArray&) = delete;
  RequestArray& operator=(const RequestArray&) = delete;
  T& operator[](size_t i) { return n_ > kInline ? heap_[i] : slot(i); }

 private:
  T& slot(size_t i) { return *std::launder(reinterpret_cast<T*>(storage_ + i * sizeof(T))); }
  size_t n_;
  alignas(T) unsigned char storage_[kInline * sizeof(T)];
  std::unique_ptr<T[]> heap_;
};

// What an algorithm sees: the comm, its rank, and helpers to post and await transfers.
class OpContext {
 public:
  // `op`: the operation run (null: none), whose registered buffers (Op::pins) give posted
  // requests their memfd (sends) and their transport's key (Request::key).
  OpContext(Comm& comm, const MsgTag& tag, Op* op = nullptr);
  // A view of `parent` restricted to some of the communicator's ranks, for one stage of a
  // hierarchical algorithm (the ranks of a host, or one rank per host): rank(), nranks() and
  // every `peer` argument are indices into `members` (communicator ranks, this rank among
  // them), so any algorithm runs on the group unchanged. Messages are still named by the whole
  // operation (`parent`'s root context), so two stages that talk to one peer never mix up their
  // messages. Lives no longer than `parent`.
  OpContext(OpContext& parent, std::vector<int> members);
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;

  Comm& comm() const { return comm_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // The communicator rank of group rank `peer` (itself outside a group view).
  int comm_rank(int peer) const { return members_.empty() ? peer : members_[peer]; }
  bool is_group() const { return !members_.empty(); }
  int channels() const { return channels_; }
  const MsgTag& tag() const { return tag_; }

  void send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes);
  void recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes);
  // The same for a compressed message: `bytes` on the wire stand for `data_bytes` of data (the
  // communicator's byte counters count both).
  void send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes,
            size_t data_bytes);
  void recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes, size_t data_bytes);
  // dst[i] = fn(src[i], incoming[i]); dst may equal src.
  void recv_reduce(RecvRequest& req, int peer, int channel, void* dst, const void* src,
                   size_t bytes, kernels::ReduceFn fn, size_t elem_size);
  // Same as send/recv with an explicit tag (send/receive batches tag each call).
  void send_tagged(SendRequest& req, int peer, int channel, const void* buf, size_t bytes,
                   const MsgTag& tag);
  void recv_tagged(RecvRequest& req, int peer, int channel, void* dst, size_t bytes,
                   const MsgTag& tag);

  // `CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(req))`: parks until req completes, then
  // yields OK or the error of its connection.
  struct Awaiter {
    const OpContext* ctx;
    const Request* req;
    bool await_ready() const { return req->done(); }
    void await_suspend(std::coroutine_handle<> h) const {
      Fiber::current()->park(h, WaitCond{&req->state, Request::kDone}, req);
    }
    Status await_resume() const { return ctx->check(*req); }
  };
  Awaiter wait(const Request& req) const { return Awaiter{this, &req}; }
  Status check(const Request& req) const;

  void* scratch(int slot, size_t bytes);

 private:
  void post(Request& req, int peer, size_t bytes, const MsgTag& tag);
  // send_tagged / recv_tagged to communicator rank `peer`, without counting the bytes.
  void post_send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes,
                 const MsgTag& tag);
  void post_recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes,
                 const MsgTag& tag);
  // Names the message in req.tag for the chunk layer: its lane (`channel`) and its ordinal,
  // the how-manieth message of this operation to (or from) `peer` on that lane, counted alike
  // on both sides since each algorithm posts in the same order per peer and channel (0 for a
  // send or receive call, which its sequence number names).
  void name_message(Request& req, int peer, int channel, bool send);
  // The key of the transport to `peer` for the pinned registration holding [p, p + bytes), or
  // null (pinned_ set).
  const RegistrationKey* key_for(const void* p, size_t bytes, int peer);
  Comm& comm_;
  OpContext* root_;  // the operation's context (this one unless a group view)
  std::vector<int> members_;  // a group view's communicator ranks, else empty
  // Root context only: [2 * (comm rank * channels + channel) + send], zeroed on first use: in
  // place for up to kInlineOrdinals entries (no allocation for a small operation), else on the
  // heap.
  static constexpr size_t kInlineOrdinals = 64;
  size_t ordinal_count_ = 0;  // 0: not made yet
  std::array<uint8_t, kInlineOrdinals> ordinals_inline_;
  std::vector<uint8_t> ordinals_heap_;
  Op* pinned_;  // the op when it pins registrations, else null
  int rank_;
  int nranks_;
  int channels_;
  MsgTag tag_;
};

}  // namespace chorus
