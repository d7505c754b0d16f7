// SPDX-License-Identifier: Apache-2.0
// File: src/core/comm.cc
// Communicator state and its operation queue: start, progress and retire operations.
#include "core/comm.h"

#include <fmt/format.h>

#include <fcntl.h>

#include <algorithm>

#include "algo/algo.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "common/process.h"
#include "core/stream.h"

namespace chorus {

Comm::Comm(CommIdentity id)
    : recorder_(static_cast<size_t>(params::kFlightRecorderOps.get())),
      timeout_ms_(params::kTimeoutMs.get()) {
  set_identity(std::move(id));
}

void Comm::set_identity(CommIdentity id) {
  id_ = std::move(id);
  send_seq_.assign(id_.nranks, 0);
  recv_seq_.assign(id_.nranks, 0);
  cu_device_ = id_.config.cu_device;
  byte_counters_ = std::make_unique<PeerByteCounters[]>(id_.nranks);
}

void Comm::count_bytes(int peer, bool sent, size_t wire, size_t data) {
  PeerByteCounters& c = byte_counters_[peer];
  c.wire[sent].store(c.wire[sent].load(std::memory_order_relaxed) + wire,
                     std::memory_order_relaxed);
  c.data[sent].store(c.data[sent].load(std::memory_order_relaxed) + data,
                     std::memory_order_relaxed);
}

namespace {
// A counter since its last reset: the base is read first (a counter only grows, and a reset
// sets the base to a value the counter had), so the difference is never negative.
uint64_t since_reset(const std::atomic<uint64_t>& base, const std::atomic<uint64_t>& counter) {
  const uint64_t b = base.load(std::memory_order_acquire);
  const uint64_t v = counter.load(std::memory_order_relaxed);
  return v >= b ? v - b : 0;
}
}  // namespace

ByteCounts Comm::byte_counts(int peer) const {
  ByteCounts out;
  for (int p = 0; p < nranks(); ++p) {
    if (peer >= 0 && p != peer) continue;
    const PeerByteCounters& c = byte_counters_[p];
    out.wire_sent += since_reset(c.wire_base[1], c.wire[1]);
    out.wire_received += since_reset(c.wire_base[0], c.wire[0]);
    out.data_sent += since_reset(c.data_base[1], c.data[1]);
    out.data_received += since_reset(c.data_base[0], c.data[0]);
  }
  return out;
}

void Comm::reset_byte_counts() {
  for (int p = 0; p < nranks(); ++p) {
    PeerByteCounters& c = byte_counters_[p];
    for (int i = 0; i < 2; ++i) {
      c.wire_base[i].store(c.wire[i].load(std::memory_order_relaxed), std::memory_order_release);
      c.data_base[i].store(c.data[i].load(std::memory_order_relaxed), std::memory_order_release);
    }
  }
}

Comm::~Comm() { shutdown(); }

std::string Comm::describe() const {
  std::string text = fmt::format("comm {:#x} rank {}/{}", id_.uid & 0xffffffffu, id_.rank, id_.nranks);
  if (!id_.config.name.empty()) text += fmt::format(" ({})", id_.config.name);
  return text;
}

void Comm::set_state(State s) {
  state_.store(s, std::memory_order_release);
  ProcessContext::get().ring_local();
}

Status Comm::async_status() const {
  switch (state()) {
    case State::kInitializing:
      return Status(Code::kInProgress, fmt::format("{} is still initializing", describe()));
    case State::kAborted:
      return invalid_usage("{} was aborted", describe());
    default: break;
  }
  std::lock_guard<std::mutex> lock(status_mutex_);
  if (!failure_.ok()) return failure_;
  if (!id_.config.blocking && has_pending_ops())
    return Status(Code::kInProgress, fmt::format("{} has operations in flight", describe()));
  return Status();
}

void Comm::poison(Status& why) {
  const bool first_log = !why.logged();
  why.mark_logged();
  {
    std::lock_guard<std::mutex> lock(status_mutex_);
    if (!failure_.ok()) return;
    failure_ = why;
    failed_.store(true, std::memory_order_release);
  }
  if (first_log) CHORUS_WARN(kColl, "{}: {}", describe(), why.message());
  // The line above (or the one where the failure was detected) says what went wrong; the
  // recent operations are detail for whoever digs, not a page per rank at the default level.
  CHORUS_INFO(kColl, "{}", recorder_.dump(describe(), /*with_failures=*/false));
  if (state() == State::kReady) state_.store(State::kFailed, std::memory_order_release);
  ProcessContext::get().ring_local();
}

void Comm::request_abort() {
  abort_.store(true, std::memory_order_release);
  ProcessContext::get().ring_local();
}

bool Comm::has_pending_ops() const { return pending_ops_.load(std::memory_order_acquire) != 0; }

Status Comm::enqueue(const std::shared_ptr<Op>& op) {
  CHORUS_RETURN_IF_ERROR(admit(*op));
  std::lock_guard<std::mutex> lock(queue_mutex_);
  queue_.push_back(op);
  pending_ops_.fetch_add(1, std::memory_order_release);
  return Status();
}

Result<bool> Comm::start_direct(Op& op) {
  std::unique_lock<std::mutex> drive(drive_mutex_, std::try_to_lock);
  if (!drive.owns_lock() || current_ != nullptr || pending_ops_.load(std::memory_order_acquire) != 0)
    return false;
  CHORUS_RETURN_IF_ERROR(admit(op));
  pending_ops_.fetch_add(1, std::memory_order_release);
  op.direct = true;
  current_ = &op;  // advance() runs it like a queue head
  return true;
}

Status Comm::check_usable() {
  if (aborting()) return invalid_usage("{} was aborted", describe());
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(status_mutex_);
    Status s = failure_;
    return s.with_context(fmt::format("{} is unusable after an earlier failure", describe()));
  }
  return Status();
}

void Comm::end_express(Status status, Status* result) {
  if (!status.ok()) {
    poison(status);
    close_connections(status);
  }
  // Another thread may have queued an operation meanwhile and gone to sleep on the drive lock.
  if (pending_ops_.load(std::memory_order_acquire) != 0) ProcessContext::get().ring_local();
  *result = std::move(status);
}

Status Comm::admit(Op& op) {
  CHORUS_RETURN_IF_ERROR(check_usable());
  // Internal exchanges may involve a subset of the ranks: they count apart from collectives.
  uint32_t seq = op.p2p_batch() ? 0 : op.is_internal() ? internal_seq_++ : coll_seq_++;
  for (CollCall& c : op.calls()) {
    c.tag.coll = static_cast<uint8_t>(op.p2p_batch() ? CollKind::kSendRecv : c.kind);
    c.tag.dtype = static_cast<uint8_t>(c.dtype);
    c.tag.redop = static_cast<uint8_t>(c.op.kind);
    c.tag.count = c.count;
    c.tag.root = c.root;
    c.tag.seq = seq;
    if (op.p2p_batch()) {
      // Between a pair, the k-th send matches the k-th receive; the tag names the sender.
      bool send = c.kind == CollKind::kSend;
      c.tag.seq = send ? send_seq_[c.root]++ : recv_seq_[c.root]++;
      c.tag.root = send ? rank() : c.root;
      c.tag.redop = 0;
    }
  }
  op.record_id = recorder_.queued([&](OpSummary* what) { op.summarize(what); });
  return Status();
}

bool Comm::advance() {
  bool progressed = false;
  for (;;) {
    if (current_ == nullptr) {
      if (pending_ops_.load(std::memory_order_acquire) == 0) break;
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (queue_.empty()) break;
      current_ = queue_.front().get();  // stays queued (alive) until finish_op pops it
    }
    Op* op = current_;
    if (!op->started) {
      if (!op->deps_done()) break;  // stream order: an earlier op on its stream is pending
      Status status = start_op(*op);
      if (!status.ok()) {
        finish_op(*op, std::move(status));
        progressed = true;
        continue;
      }
    }
    bool moved = progress_connections();
    moved |= op->fibers->step_all();
    if (op->fibers->done()) {
      finish_op(*op, op->fibers->take_status());
      progressed = true;
      continue;
    }
    if (moved) {
      op->last_progress_ns = now_coarse_ns();
      progressed = true;
    } else if (Status status = check_stuck(*op); !status.ok()) {
      finish_op(*op, std::move(status));
      progressed = true;
      continue;
    }
    break;
  }
  return progressed;
}

Status Comm::start_op(Op& op) {
  op.started = true;
  op.last_progress_ns = now_coarse_ns();
  if (aborting()) return remote_error("{} was aborted before {}", describe(), op.describe());
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(status_mutex_);
    Status s = failure_;
    return s.with_context(fmt::format("{} not run: the communicator failed earlier", op.describe()));
  }
  for (const auto& d : op.deps()) {
    if (!d->status().ok()) {
      return Status(d->status().code(), fmt::format("{} not run: an earlier operation on its "
                                                    "stream failed: {}", op.describe(),
                                                    d->status().message()));
    }
  }
  op.deps().clear();  // drop references so completed ops are freed
  CHORUS_RETURN_IF_ERROR(pin_buffers(op));
  recorder_.started(op.record_id);
  op.fibers.emplace(algo::run_op(*this, op));
  return Status();
}

Status Comm::pin_buffers(Op& op) {
  if (op.is_internal() || registrations_.empty()) return Status();
  op.pin_label = op.describe();
  for (const CollCall& call : op.calls()) {
    for (auto [p, bytes] : {std::pair<const void*, size_t>{call.sendbuf, call.send_bytes},
                            std::pair<const void*, size_t>{call.recvbuf, call.recv_bytes}}) {
      if (p == nullptr || bytes == 0) continue;
      CHORUS_ASSIGN_OR_RETURN(RegistrationPin pin, registrations_.pin(p, bytes, op.pin_label.c_str()));
      if (!pin) continue;
      const RegisteredRange& range = pin.range();
      if (range.memfd) {
        auto begin = reinterpret_cast<uintptr_t>(range.base);
        op.shared.push_back(SharedRange{begin, begin + range.bytes, *range.memfd});
      }
      op.pins.push_back(std::move(pin));
    }
  }
  if (key_slots_ > 0) op.pin_keys.assign(op.pins.size() * key_slots_, Op::PinKey{});
  return Status();
}

void Comm::note_key_error(const Status& why) {
  if (key_error_logged_) return;
  key_error_logged_ = true;
  CHORUS_WARN(kNet, "{}; transfers from that memory go without the transport's key (logged once "
              "per communicator)", why.message());
}

void Comm::finish_op(Op& op, Status status) {
  if (!status.ok()) {
    status.with_context(fmt::format("{} on {}", op.describe(), describe()));
  }
  recorder_.finished(op.record_id, status);
  if (!status.ok()) {
    // Transfers of the failed operation may still be posted: drop every connection before the
    // fibers (and the requests in their frames) go away. The comm is unusable from now on.
    poison(status);
    close_connections(status);
  }
  op.fibers.reset();
  op.shared.clear();
  op.pin_keys.clear();
  op.pins.clear();  // after the fibers: no transfer reads the buffers any more
  // A stream keeps its last op (for ordering): release the compressors now, so that a compressor
  // can be reset once its calls are done.
  for (CollCall& call : op.calls()) call.compressor.reset();
  // The queue's reference may be the last one: keep the op alive until we are done with it. A
  // direct op is in no queue: its caller owns it.
  std::shared_ptr<Op> keep;
  if (!op.direct) {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!queue_.empty() && queue_.front().get() == &op) {
      keep = std::move(queue_.front());
      queue_.pop_front();
    }
  }
  pending_ops_.fetch_sub(1, std::memory_order_release);  // queued or direct, it is over
  if (current_ == &op) current_ = nullptr;
  for (Stream* s : op.streams()) s->note_result(status);
  op.complete(std::move(status));
  ProcessContext::get().ring_local();
}

algo::Choice Comm::choose(CollKind coll, size_t bytes) {
  uint64_t generation = params::generation();
  ChoiceSlot& slot =
      choices_[((static_cast<size_t>(coll) * 31 + bytes) * 0x9E3779B97F4A7C15ull) >> 58];
  if (slot.generation != generation || slot.coll != coll || slot.bytes != bytes) {
    slot = ChoiceSlot{generation, coll, bytes, algo::choose(model_, coll, bytes, shape(), channels_)};
  }
  return slot.choice;
}

bool Comm::progress_connections() {
  bool moved = false;
  for (size_t i = 0; i < active_.size();) {
    PeerLink* l = active_[i];
    moved |= l->progress();
    if (l->idle()) {
      active_[i] = active_.back();
      active_.pop_back();
    } else {
      ++i;
    }
  }
  return moved;
}

void Comm::activate(PeerLink* link) {
  if (std::find(active_.begin(), active_.end(), link) == active_.end()) active_.push_back(link);
}

bool Comm::collect_poll_fds(std::vector<pollfd>* fds) const {
  bool doorbell = false;
  for (const PeerLink* l : active_) {
    for (size_t p = 0; p < l->paths(); ++p) {
      short events = 0;
      int fd = l->path(p)->poll_fd(&events);
      if (fd >= 0) {
        fds->push_back(pollfd{fd, events, 0});
      } else {
        doorbell = true;
      }
    }
  }
  return doorbell;
}

Status Comm::check_stuck(Op& op) {
  return check_wait(
      now_coarse_ns(), op.last_progress_ns,
      [&](std::vector<int>* peers) {
        if (!op.fibers) return;
        for (const Request* r : op.fibers->waiting_requests()) peers->push_back(r->peer);
      },
      [&] { return op.describe(); }, [&] { return waiting_summary(op); });
}

std::string Comm::waiting_summary(const Op& op) const {
  return op.fibers ? waiting_summary(*op.fibers) : std::string();
}

std::string Comm::waiting_summary(const FiberSet& fibers) const {
  std::string waiting;
  for (const Request* r : fibers.waiting_requests()) waiting += waiting_for(*r);
  return waiting;
}

std::string Comm::waiting_for(const Request& r) const {
  return fmt::format("; waiting for {} to {} ({} of {} bytes done)", peer(r.peer).describe(),
                     r.is_send ? "take our data" : "send its data",
                     r.bytes_done.load(std::memory_order_relaxed), r.bytes);
}

std::string Comm::dump_flight_recorder() {
  // What the running operation still waits for, if no other thread is driving it right now.
  std::unique_lock<std::mutex> drive(drive_mutex_, std::try_to_lock);
  if (drive.owns_lock() && current_ != nullptr && current_->fibers) {
    std::string waiting = waiting_summary(*current_);
    recorder_.pending(current_->record_id,
                      waiting.empty() ? std::string() : "pending" + waiting.substr(1));
  }
  return recorder_.dump(describe());
}

std::vector<PathReport> Comm::path_reports(int peer) {
  std::vector<PathReport> out;
  {
    std::lock_guard<std::mutex> drive(drive_mutex_);
    collect_path_reports(peer, &out);
  }
  // A driver that found the lock taken went to sleep until woken: wake it, or it would stall
  // for up to a poll slice each time the counters are read.
  ProcessContext::get().ring_local();
  return out;
}

void Comm::collect_path_reports(int peer, std::vector<PathReport>* reports) const {
  std::vector<PathReport>& out = *reports;
  for (int r = 0; r < static_cast<int>(links_.size()); ++r) {
    const PeerLink* l = links_[r].get();
    if ((peer >= 0 && r != peer) || l == nullptr) continue;
    for (size_t p = 0; p < l->paths(); ++p) {
      const Connection* c = l->path(p);
      PathReport& rep = out.emplace_back();
      rep.peer = r;
      rep.path = static_cast<int>(p);
      rep.transport = c->transport_name();
      rep.name = c->path_name();
      rep.failed = !c->error().ok();
      rep.failed_over = !rep.failed && c->failed_over();
      rep.stats = l->path_stats(p);
      rep.network_known = !rep.failed && !rep.failed_over && c->path_state(&rep.network);
    }
  }
}

std::string Comm::describe_paths() {
  std::string text = fmt::format("{}: paths to its peers\n", describe());
  for (const PathReport& r : path_reports(-1)) {
    text += fmt::format(
        "  peer {} path {} {}{}{}: chunks {} ({:.1f} MiB, {:.1f} MiB sent, busy {:.3f} s), whole "
        "messages {} ({:.1f} MiB)",
        r.peer, r.path, r.transport, r.name.empty() ? "" : " ", r.name, r.stats.chunks,
        r.stats.bytes / 1048576.0, r.stats.sent_bytes / 1048576.0, r.stats.busy_ns / 1e9,
        r.stats.messages, r.stats.message_bytes / 1048576.0);
    if (r.stats.rate > 0) text += fmt::format(", route rate {:.1f} MB/s", r.stats.rate * 1e3);
    if (r.network_known) {
      text += fmt::format(", unacked {} KiB, delivery {:.1f} MB/s, rtt {:.0f} us",
                          r.network.unacked_bytes >> 10, r.network.delivery_rate * 1e3,
                          r.network.rtt_ns / 1e3);
    }
    text += r.failed        ? ", FAILED\n"
            : r.failed_over ? ", failed over (carried by another path to the peer)\n"
                            : "\n";
  }
  return text;
}

Result<UniqueFd> Comm::dup_listener() const {
  if (!rendezvous_.valid()) return invalid_usage("{} has no listening socket", describe());
  int fd = ::fcntl(rendezvous_.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return system_error(errno, "dup of the listening socket");
  return UniqueFd(fd);
}

void* Comm::scratch(int slot, size_t bytes) {
  if (scratch_.size() <= static_cast<size_t>(slot)) {
    scratch_.resize(slot + 1);
    scratch_bytes_.resize(slot + 1, 0);
  }
  if (scratch_bytes_[slot] < bytes) {
    scratch_[slot].reset(new char[bytes]);
    scratch_bytes_[slot] = bytes;
  }
  return scratch_[slot].get();
}

void Comm::close_connections(const Status& why) {
  active_.clear();
  for (auto& per_peer : conns_) {
    for (auto& c : per_peer) {
      if (c && !why.ok()) c->farewell(why);
      c.reset();
    }
  }
  // After the connections: they may hold the links' chunk requests until destroyed.
  links_.clear();
}

void Comm::shutdown() {
  std::lock_guard<std::mutex> drive(drive_mutex_);
  close_connections();
  conns_.clear();
  // Keys may use their transport's resources (a context, a protection domain): they go
  // before the instances.
  for (const OpenTransport& t : open_)
    if (t.key_slot >= 0) registrations_.remove_key_factory(t.key_slot);
  open_.clear();
  key_slot_.clear();
  key_slots_ = 0;
  rendezvous_.reset();
  scratch_.clear();
  scratch_bytes_.clear();
}

}  // namespace chorus
