// SPDX-License-Identifier: Apache-2.0
// File: src/core/comm.h
// A communicator: one rank's view of a group of ranks, its connections to each peer, and the
// queue of operations it runs in issue order.
//
// Threading. API calls on a comm come from one thread at a time (NCCL's rule), except abort
// and async-error queries. Operations are executed by whichever thread holds the comm's drive
// lock: the caller of a blocking call, or the process's progress thread for stream work. Lock
// order: Engine::mutex_ -> Comm::drive_mutex_ -> Comm::queue_mutex_ (never the reverse).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "algo/tuner.h"
#include "net/auth.h"
#include "net/socket.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/params.h"
#include "common/status.h"
#include "core/flight_recorder.h"
#include "core/liveness.h"
#include "core/op.h"
#include "core/registration.h"
#include "transports/registry.h"
#include "transports/chunk.h"
#include "transports/transport.h"

namespace chorus {

// What every rank publishes about itself when a communicator is created: its identity, the
// address of its rendezvous listener, and one connect blob per transport it opened.
struct PeerInfo {
  int rank = -1;
  int nranks = 0;
  uint64_t host_hash = 0;
  std::string hostname;
  int pid = 0;
  uint64_t process_token = 0;
  int channels = 1;
  // Core's own listening socket: the lowest surviving rank of a shrink serves the new
  // communicator's rendezvous on it.
  net::SockAddr rendezvous;
  struct Blob {
    std::string transport;  // TransportDesc::name
    std::string bytes;      // at most kMaxTransportBlob
  };
  std::vector<Blob> blobs;  // at most kMaxTransports, distinct names

  std::string serialize() const;
  static Result<PeerInfo> parse(std::string_view bytes);
  // "rank 3 (host node7, pid 1234)".
  std::string describe() const;
  // This rank as `transport` sees it (open = false when it did not open that transport).
  EndpointInfo endpoint(const char* transport) const;
};

struct CommConfig {
  bool blocking = true;
  std::string name;  // commName, for logs
  int cu_device = -1;
  int split_share = 0;
};

// Everything needed to create a comm's identity; the connections come from setup().
struct CommIdentity {
  int rank = 0;
  int nranks = 1;
  uint64_t uid = 0;          // same on every rank of the communicator
  net::Secret secret;  // authenticates this communicator's connections
  CommConfig config;
};

// Bytes a communicator's operations posted to or from peers: on the wire, and the data they
// stand for (more than the wire for compressed messages).
struct ByteCounts {
  uint64_t wire_sent = 0, wire_received = 0, data_sent = 0, data_received = 0;
};

// One path to a peer (chorusPathStats_t): the chunk layer's counters, and what the network
// says of it now (Connection::path_state) where the transport can tell.
// Where an express call's bounded wait stands (express.cc, express_p2p.cc; Comm::express_stalled).
struct ExpressWait {
  // A wait this long shows the call as running in the flight recorder.
  static constexpr int64_t kRecordFromNs = 1000000;
  int64_t since_ns = 0;   // when progress stopped; 0 while it goes on (no clock read then)
  bool recorded = false;  // `record` is the call's running entry (recorder_.running())
  uint64_t record = 0;
};

struct PathReport {
  int peer = 0;
  int path = 0;
  std::string transport;
  std::string name;  // Connection::path_name()
  bool failed = false;
  bool failed_over = false;  // Connection::failed_over()
  PeerLink::PathStats stats;
  bool network_known = false;
  Connection::PathState network;
};

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  enum class State : int { kInitializing, kReady, kFinalized, kFailed, kAborted, kRevoked };

  explicit Comm(CommIdentity id);
  // Sets rank, size and keys before setup() (a split learns them after the comm exists).
  void set_identity(CommIdentity id);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Exchanges PeerInfo through `exchange` (bootstrap root, or a parent comm), then connects.
  using ExchangeFn = std::function<Result<std::vector<std::string>>(const std::string& mine)>;
  Status setup(const ExchangeFn& exchange);

  int rank() const { return id_.rank; }
  int nranks() const { return id_.nranks; }
  uint64_t uid() const { return id_.uid; }
  const net::Secret& secret() const { return id_.secret; }
  const CommConfig& config() const { return id_.config; }
  int cu_device() const { return cu_device_; }
  int channels() const { return channels_; }
  const PeerInfo& peer(int rank) const { return peers_[rank]; }
  // The transport that carries traffic to `peer` (null for ourselves).
  const TransportDesc* transport_to(int peer) const { return transport_[peer]; }
  Connection* conn(int peer, int channel) const { return conns_[peer][channel].get(); }
  // Every path to `peer` (its channels), seen through the chunk layer (transports/chunk.h).
  PeerLink* link(int peer) const { return links_[peer].get(); }
  // The ring the ring algorithms follow: ring()[p] is the rank at position p, ring_pos(r) the
  // position of rank r. Each host's ranks are adjacent (CHORUS_RING=HOST, the default), or the
  // ring is rank order (RANK). The same on every rank.
  const std::vector<int>& ring() const { return ring_; }
  int ring_pos(int rank) const { return ring_pos_[rank]; }
  // The hosts (peers with one host_hash): hosts()[h] lists host h's ranks in rank order, hosts
  // in the order of their lowest rank; rank r is the local_index(r)-th rank of host_of(r).
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  int host_of(int rank) const { return host_of_[rank]; }
  int local_index(int rank) const { return local_index_[rank]; }
  // Ranks per host when every host has as many, else 0.
  int ranks_per_host() const { return ranks_per_host_; }
  // The shape the tuner plans for: ranks, hosts, ranks per host.
  algo::Shape shape() const {
    algo::Shape s{nranks(), static_cast<int>(hosts_.size()), ranks_per_host_, model_.rails};
    s.box_bytes = model_.box_bytes;
    return s;
  }
  // Every peer is on our host and has a small-message box (transports/small_box.h): what this
  // rank brings to the agreement on the box algorithms (CostModel::box_bytes).
  bool has_boxes() const { return boxes_; }
  // The cost model the tuner chooses algorithms with (agreed by every rank at setup).
  const algo::CostModel& cost_model() const { return model_; }
  // The tuner's choice for a call, memoised (drive lock held: called from operations).
  algo::Choice choose(CollKind coll, size_t bytes);
  // "comm 0x1234abcd rank 2/4" plus the name if any, for messages.
  std::string describe() const;

  // ---- State (safe from any thread) ----
  State state() const { return state_.load(std::memory_order_acquire); }
  void set_state(State s);
  // ncclSuccess / ncclInProgress / the error that broke the comm, as a Status.
  Status async_status() const;
  // Marks the comm broken by `why` (a remote failure, a timeout, a mismatch): queued and future
  // operations fail with it. Keeps the first reason.
  // Logs `why` unless it was logged where it was detected, and marks it logged.
  void poison(Status& why);
  bool aborting() const { return abort_.load(std::memory_order_acquire); }
  // How long an operation may make no progress before it fails (ncclRemoteError naming what it
  // waits for): CHORUS_TIMEOUT_MS when the comm is made, a split or shrink child inherits its
  // parent's, chorusCommSetTimeout changes it (any thread; the next check uses it).
  int64_t timeout_ms() const { return timeout_ms_.load(std::memory_order_relaxed); }
  void set_timeout_ms(int64_t ms) { timeout_ms_.store(ms, std::memory_order_relaxed); }
  // A deadline `ms` from now that also expires when the comm is aborted (setup waits).
  Deadline cancellable_deadline(int64_t ms) const { return Deadline::after_ms(ms, &abort_); }
  // Asks every operation in flight to stop; they fail. Returns at once.
  void request_abort();

  // ---- Operations ----
  // Queues a fully built operation (its stream dependencies set), assigning its sequence
  // numbers. Fails on a broken comm.
  Status enqueue(const std::shared_ptr<Op>& op);
  // The direct path of a blocking call on an idle comm: when no operation is queued or running
  // and no other thread drives the comm, `op` becomes the running operation without a trip
  // through the queue (its mutex, a shared owner). The caller owns `op` and drives the comm
  // until op.done(). False when the comm is busy (then enqueue it); fails as enqueue() does.
  Result<bool> start_direct(Op& op);
  // The express path of a blocking call (express.cc): when the tuner sends `call` through the
  // small-message boxes and the comm is idle, runs it from the caller's frame, without an
  // operation, and sets *result to how it ended. False when it cannot (then queue it or
  // start_direct() it).
  // Calls that the tuner sends elsewhere run there the same way, from the caller's frame, when
  // their choice_bytes are at most kExpressBytes: their algorithm's fibers stepped in a loop, as
  // an operation's are, without the operation.
  static constexpr size_t kExpressBytes = 8192;
  bool run_express(const CollCall& call, Status* result);
  // The express path of small blocking sends and receives (express_p2p.cc): a lone send or
  // receive, or a group of up to kExpressP2pCalls of them, none to this rank and none over
  // kExpressP2pBytes, on an idle comm: posts them from the caller's frame, waits for all of them,
  // and sets *result to how it ended. False when it cannot (then launch them as an operation).
  static constexpr size_t kExpressP2pCalls = 8;
  static constexpr size_t kExpressP2pBytes = 8192;
  bool run_p2p_express(std::span<const CollCall* const> calls, Status* result);
  // Runs the queue: starts, progresses and retires operations. The caller holds drive_mutex().
  // True if anything progressed.
  bool advance();
  std::mutex& drive_mutex() { return drive_mutex_; }
  bool has_pending_ops() const;
  // Adds the file descriptors to poll while waiting for this comm's active connections (drive
  // lock held). Returns true if some active connection is woken by the doorbell instead.
  bool collect_poll_fds(std::vector<pollfd>* fds) const;

  // Marks a link as having pending requests (it is progressed until idle again).
  void activate(PeerLink* link);
  // A per-comm scratch buffer of at least `bytes` (slot 0..3), valid until the next call with
  // the same slot. Operations run one at a time per comm, so they may use it freely.
  void* scratch(int slot, size_t bytes);

  // ---- Byte counters (read and reset by any thread) ----
  // Counts a posted transfer to (`sent`) or from `peer`; the driving thread only.
  void count_bytes(int peer, bool sent, size_t wire, size_t data);
  // Towards `peer`, or summed over all peers when it is -1.
  ByteCounts byte_counts(int peer) const;
  void reset_byte_counts();

  // ---- Reduction operators made by ncclRedOpCreatePreMulSum ----
  Result<int> create_premul(DataType dtype, const void* scalar, bool immediate);
  Status destroy_redop(int id);
  Result<RedOp> resolve_redop(int id, DataType dtype) const;

  // Ordinal of the next split/shrink made from this comm (equal on all ranks).
  uint32_t next_child_ordinal() { return child_ordinal_++; }

  // ---- Buffer registrations (core/registration.h) ----
  // ncclCommRegister: a new handle for [buf, buf + bytes).
  Result<void*> register_buffer(void* buf, size_t bytes);
  // ncclCommDeregister: kInvalidArgument for a foreign handle, kInvalidUsage while an
  // operation pins the registration (which then stays valid).
  Status deregister_buffer(void* handle);
  // Pins the registration covering [p, p + bytes) for the operation `what` (a string that
  // outlives the pin, named in errors) until the pin is released, which must happen before the
  // comm is destroyed. Empty when the range is not registered, unless `miss` is kRegister (an
  // implicit registration, cached under CHORUS_REG_CACHE_BYTES).
  Result<RegistrationPin> pin(
      const void* p, size_t bytes, const char* what,
      RegistrationCache::OnMiss miss = RegistrationCache::OnMiss::kEmptyPin) {
    return registrations_.pin(p, bytes, what, miss);
  }
  RegistrationCache& registrations() { return registrations_; }
  // The slot of the key factory of the transport that carries traffic to `peer` in
  // registrations() (RegistrationPin::key), or -1 when that transport makes no keys. Slots are
  // 0 .. key_slots() - 1.
  int key_slot(int peer) const { return key_slot_[peer]; }
  int key_slots() const { return key_slots_; }
  // A transport could not make its key for registered memory (drive lock): logged once per
  // communicator; the transfer goes without it.
  void note_key_error(const Status& why);

  // Closes every connection and frees transport resources (drive lock is taken). Idempotent.
  void shutdown();

  // ---- Diagnosis ----
  // The flight recorder as text (any thread but one holding the drive lock).
  std::string dump_flight_recorder();
  // The paths to `peer` (-1: every peer), in peer and path order, and the same as a table
  // (any thread but one holding the drive lock: they take it).
  std::vector<PathReport> path_reports(int peer);
  std::string describe_paths();
  // This rank's rendezvous listener (duplicated), on which the lowest surviving rank serves
  // the rendezvous of a shrunk communicator; its address is peer(r).rendezvous.
  Result<UniqueFd> dup_listener() const;

 private:
  // What enqueue() and start_direct() share: refuses a broken comm, assigns the op's sequence
  // numbers and tags, records it in the flight recorder.
  Status admit(Op& op);
  // The error a call on an aborted or failed comm gets (admit's first check, and the express
  // paths'); OK when the comm is usable.
  Status check_usable();
  // The end of an express call (express.cc, express_p2p.cc), as finish_op() ends an operation:
  // a failure gets the call's name (`what()`) as context; its flight-recorder entry is written
  // (the running entry of `wait`, when the call waited long enough to show as running; else
  // one completed entry, described by `summarize`); a failure poisons the comm and closes
  // its connections (requests in the caller's frame may still be posted), and a thread that
  // queued an operation meanwhile is woken. Sets *result.
  template <typename What, typename Fill>
  void end_express(Status status, What&& what, const ExpressWait& wait, const Fill& summarize,
                   Status* result);
  void end_express(Status status, Status* result);
  // run_express for a call the boxes do not take: its algorithm's fibers, stepped here.
  bool run_express_fibers(const CollCall& in, const MsgTag& tag, Status* result);
  Status start_op(Op& op);
  // Pins the registrations the op's buffers lie in (Op::pins, Op::shared).
  Status pin_buffers(Op& op);
  void finish_op(Op& op, Status status);
  bool progress_connections();
  // With an error: each peer is told why first (Connection::farewell).
  void close_connections(const Status& why = Status());
  // Abort, timeout and dead peers, checked on passes without progress: the error to fail op
  // with (check_wait for an operation).
  Status check_stuck(Op& op);
  // The bounded wait of every blocking path (an operation, the express paths), checked on a
  // pass without progress at `now`: abort; every CHORUS_LIVENESS_MS, the peers that
  // `collect(std::vector<int>*)` names (a same-host peer whose process exited; a remote path
  // that stopped answering fails its link, and so what waits on it); and timeout_ms() without
  // progress since `last_progress_ns`. The error names the call (`what()`, as describe_tag)
  // and what it still waits for (`waiting()`, as waiting_summary); OK while none applies.
  // Drive lock.
  template <typename Collect, typename What, typename Waiting>
  Status check_wait(int64_t now, int64_t last_progress_ns, Collect&& collect, What&& what,
                    Waiting&& waiting);
  // A pass of an express call without progress: check_wait since `wait->since_ns` (set to now
  // on the first such pass), and once the wait has lasted ExpressWait::kRecordFromNs, the call
  // shows as running in the flight recorder (described by `summarize`).
  template <typename Collect, typename What, typename Waiting, typename Fill>
  Status express_stalled(ExpressWait* wait, Collect&& collect, What&& what, Waiting&& waiting,
                         const Fill& summarize);
  void collect_path_reports(int peer, std::vector<PathReport>* out) const;  // drive lock
  // "; waiting for rank 2 (host h, pid 7) to send its data (0 of 64 bytes done)", for each
  // request the op's fibers (or `fibers`) wait on, or for `r` alone (drive lock).
  std::string waiting_summary(const Op& op) const;
  std::string waiting_summary(const FiberSet& fibers) const;
  std::string waiting_for(const Request& r) const;
  // Opens every registered transport (those that fail to open are left out of PeerInfo).
  void open_transports(PeerInfo* me);
  Status connect_transports(const std::vector<PeerInfo>& infos);
  void set_host_layout();  // hosts and ring order, from peers_

  CommIdentity id_;
  algo::CostModel model_;
  int channels_ = 1;
  int cu_device_ = -1;
  std::vector<PeerInfo> peers_;
  std::vector<int> ring_, ring_pos_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> host_of_, local_index_;
  int ranks_per_host_ = 1;
  bool boxes_ = false;  // has_boxes()
  std::vector<const TransportDesc*> transport_;                  // [peer]
  std::vector<std::vector<std::unique_ptr<Connection>>> conns_;  // [peer][channel]
  std::vector<std::unique_ptr<PeerLink>> links_;                 // [peer], over conns_[peer]
  // The transports this rank opened, and their per-communicator resources. Destroyed after
  // the connections.
  struct OpenTransport {
    const TransportDesc* desc = nullptr;
    std::unique_ptr<TransportInstance> instance;
    int key_slot = -1;  // of its key factory in registrations_, if it has one
  };
  std::vector<OpenTransport> open_;
  std::vector<int> key_slot_;  // [peer]: key_slot of transport_[peer], or -1
  int key_slots_ = 0;
  UniqueFd rendezvous_;

  std::atomic<State> state_{State::kInitializing};
  std::atomic<bool> abort_{false};
  std::atomic<bool> failed_{false};  // failure_ is set (checked without the lock)
  mutable std::mutex status_mutex_;
  Status failure_;  // why the comm broke (guarded by status_mutex_)

  std::mutex drive_mutex_;
  mutable std::mutex queue_mutex_;
  std::deque<std::shared_ptr<Op>> queue_;  // guarded by queue_mutex_; head runs first
  // Operations queued or running directly (start_direct), not yet finished: an idle comm is
  // seen as such without taking queue_mutex_ (advance() after each operation,
  // has_pending_ops()).
  std::atomic<size_t> pending_ops_{0};
  uint32_t coll_seq_ = 0;                   // enqueue side (API thread)
  uint32_t internal_seq_ = 0;
  std::vector<uint32_t> send_seq_, recv_seq_;
  uint32_t child_ordinal_ = 0;

  FlightRecorder recorder_;
  PeerWatch peer_watch_;             // drive lock: same-host peer processes (set at setup)
  std::vector<int> waited_for_;      // drive lock: scratch of check_stuck()
  std::atomic<int64_t> timeout_ms_;
  int64_t next_alive_check_ns_ = 0;  // drive lock: check_stuck() asks peers every LIVENESS_MS
  std::vector<PeerLink*> active_;    // drive lock
  Op* current_ = nullptr;            // drive lock: the queue's head, once seen
  struct ChoiceSlot {
    uint64_t generation = 0;  // params::generation() it was computed under; 0: empty
    CollKind coll = CollKind::kAllReduce;
    size_t bytes = 0;
    algo::Choice choice;
  };
  ChoiceSlot choices_[64];           // drive lock
  bool key_error_logged_ = false;    // drive lock
  // Written by the driving thread only (under drive_mutex_), read by any: plain loads and
  // stores, no locked add per message (whose wait for the slot store before it to leave the
  // store buffer is most of a small call's time). A reset moves the base (what counts as zero)
  // instead of writing the counters.
  struct PeerByteCounters {
    std::atomic<uint64_t> wire[2] = {}, data[2] = {};  // [0] received, [1] sent
    std::atomic<uint64_t> wire_base[2] = {}, data_base[2] = {};
  };
  std::unique_ptr<PeerByteCounters[]> byte_counters_;  // [peer]
  std::vector<std::unique_ptr<char[]>> scratch_;
  std::vector<size_t> scratch_bytes_;

  struct PremulOp {
    bool in_use = false;
    DataType dtype = DataType::kFloat32;
    RedOp op;
  };
  mutable std::mutex redop_mutex_;
  std::vector<PremulOp> premul_;
  // The open transports' key factories are added at setup and removed by shutdown().
  RegistrationCache registrations_{[this] { return describe(); }};
};

template <typename Collect, typename What, typename Waiting>
Status Comm::check_wait(int64_t now, int64_t last_progress_ns, Collect&& collect, What&& what,
                        Waiting&& waiting) {
  if (aborting()) return remote_error("{} was aborted during {}{}", describe(), what(), waiting());
  if (now >= next_alive_check_ns_) {
    next_alive_check_ns_ = now + params::kLivenessMs.get() * 1000000;
    waited_for_.clear();
    collect(&waited_for_);
    if (Status dead = peer_watch_.check_now(waited_for_); !dead.ok())
      return remote_error("rank {}: {}{}", rank(), dead.message(), waiting());
    for (int peer : waited_for_) {
      if (PeerLink* l = peer >= 0 && peer < nranks() ? link(peer) : nullptr; l != nullptr)
        l->check_alive();  // a link that failed already stays failed: it asks nothing
    }
  }
  const int64_t limit_ms = timeout_ms();
  if (now - last_progress_ns < limit_ms * 1000000) return Status();
  return remote_error("rank {}: no progress for {:.1f} s (timeout {} ms){}", rank(),
                      static_cast<double>(now - last_progress_ns) / 1e9, limit_ms, waiting());
}

template <typename Collect, typename What, typename Waiting, typename Fill>
Status Comm::express_stalled(ExpressWait* wait, Collect&& collect, What&& what,
                             Waiting&& waiting, const Fill& summarize) {
  const int64_t now = now_coarse_ns();
  if (wait->since_ns == 0) wait->since_ns = now;
  Status status = check_wait(now, wait->since_ns, collect, what, waiting);
  if (status.ok() && !wait->recorded && now - wait->since_ns >= ExpressWait::kRecordFromNs) {
    wait->record = recorder_.running(summarize);
    wait->recorded = true;
  }
  return status;
}

template <typename What, typename Fill>
void Comm::end_express(Status status, What&& what, const ExpressWait& wait, const Fill& summarize,
                       Status* result) {
  if (!status.ok()) status.with_context(fmt::format("{} on {}", what(), describe()));
  if (wait.recorded) {
    recorder_.finished(wait.record, status);
  } else {
    recorder_.completed(summarize, status);
  }
  end_express(std::move(status), result);
}

}  // namespace chorus
