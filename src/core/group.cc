// SPDX-License-Identifier: Apache-2.0
#include "core/group.h"

#include <algorithm>
#include <array>
#include <span>
#include <thread>

#include "common/log.h"
#include "core/engine.h"

namespace chorus {

namespace {

struct PendingCall {
  std::shared_ptr<Comm> comm;
  CollCall call;
  Stream* stream;
};

struct InitJob {
  std::function<Status()> run;
  const void* order_key;  // see submit_init
};

struct ThreadGroup {
  int depth = 0;
  std::vector<PendingCall> calls;
  std::vector<InitJob> inits;
  Status first_error;  // a call of the group failed: the group is not launched
  // group_watch_receives: per comm, the watch of its batch of sends and receives.
  std::vector<std::pair<Comm*, std::function<void(size_t)>>> recv_watches;
};

thread_local ThreadGroup t_group;

bool is_p2p(CollKind kind) { return kind == CollKind::kSend || kind == CollKind::kRecv; }

// Initialisations run concurrently (one thread may initialise several ranks of one comm, which
// wait for each other), except that jobs with the same order key (splits of one parent) run
// one after another in call order: run together, their exchanges on the parent would be
// queued in a different order on different ranks and pair up the wrong splits.
Status run_inits(std::vector<InitJob> jobs) {
  std::vector<std::vector<std::function<Status()>>> chains;
  std::vector<const void*> keys;
  for (auto& job : jobs) {
    size_t i = job.order_key == nullptr
                   ? keys.size()
                   : static_cast<size_t>(std::find(keys.begin(), keys.end(), job.order_key) -
                                         keys.begin());
    if (i == keys.size()) {
      keys.push_back(job.order_key);
      chains.emplace_back();
    }
    chains[i].push_back(std::move(job.run));
  }
  auto run_chain = [](std::vector<std::function<Status()>>& chain) {
    Status first;
    for (auto& job : chain) {
      Status s = job();
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    return first;
  };
  if (chains.size() == 1) return run_chain(chains.front());
  std::vector<Status> results(chains.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < chains.size(); ++i)
    threads.emplace_back([&, i] { results[i] = run_chain(chains[i]); });
  for (auto& t : threads) t.join();
  for (auto& s : results)
    if (!s.ok()) return s;
  return Status();
}

struct Launch {
  std::shared_ptr<Op> op;
  std::shared_ptr<Comm> comm;
  bool sync;  // the caller waits for it (a NULL stream on a blocking comm)
};

// Builds the operations of a group, in the order their comms first appear.
std::vector<Launch> build_ops(std::vector<PendingCall>& calls,
                              std::vector<std::pair<Comm*, std::function<void(size_t)>>>& watches) {
  std::vector<std::shared_ptr<Comm>> comms;
  for (const auto& c : calls)
    if (std::find(comms.begin(), comms.end(), c.comm) == comms.end()) comms.push_back(c.comm);
  std::vector<Launch> out;
  for (const auto& comm : comms) {
    std::vector<CollCall> p2p;
    std::vector<Stream*> p2p_streams;
    bool p2p_null_stream = false;
    for (auto& c : calls) {
      if (c.comm != comm) continue;
      if (is_p2p(c.call.kind)) {
        if (c.call.count == 0) continue;  // NCCL skips empty sends and receives
        p2p.push_back(c.call);
        if (c.stream == nullptr) p2p_null_stream = true;
        else if (std::find(p2p_streams.begin(), p2p_streams.end(), c.stream) == p2p_streams.end())
          p2p_streams.push_back(c.stream);
        continue;
      }
      auto op = std::make_shared<Op>(comm.get(), std::vector<CollCall>{c.call}, false);
      if (c.stream) c.stream->append(op);
      out.push_back(Launch{op, comm, c.stream == nullptr && comm->config().blocking});
    }
    if (!p2p.empty()) {
      auto op = std::make_shared<Op>(comm.get(), std::move(p2p), true);
      for (auto& [watched, watch] : watches)
        if (watched == comm.get()) op->recv_watch = std::move(watch);
      for (Stream* s : p2p_streams) s->append(op);
      bool sync = (p2p_null_stream || p2p_streams.empty()) && comm->config().blocking;
      out.push_back(Launch{op, comm, sync});
    }
  }
  return out;
}

// A group of sends and receives of one blocking communicator on the NULL stream, launched
// while the communicator is idle (the common case of small point-to-point exchanges): its
// operation runs from this frame, as launch_one's do, without being allocated, queued or
// gathered into launches. False when the group is not such a group or the communicator is
// busy; *result is then untouched and the caller launches it the usual way.
bool launch_p2p_direct(const std::vector<PendingCall>& calls, bool watched, Status* result) {
  if (watched || calls.empty()) return false;
  Comm* c = calls.front().comm.get();
  if (!c->config().blocking) return false;
  size_t nonempty = 0;
  for (const auto& pc : calls) {
    if (pc.comm.get() != c || pc.stream != nullptr || !is_p2p(pc.call.kind)) return false;
    nonempty += pc.call.count != 0;
  }
  if (calls.size() <= Comm::kExpressP2pCalls) {  // small ones: without an operation at all
    std::array<const CollCall*, Comm::kExpressP2pCalls> express{};
    for (size_t i = 0; i < calls.size(); ++i) express[i] = &calls[i].call;
    if (c->run_p2p_express(std::span(express.data(), calls.size()), result)) return true;
  }
  std::vector<CollCall> p2p;
  p2p.reserve(nonempty);
  for (const auto& pc : calls)
    if (pc.call.count != 0) p2p.push_back(pc.call);  // NCCL skips empty sends and receives
  if (p2p.empty()) {
    *result = Status();
    return true;
  }
  Op direct(c, std::move(p2p), true);
  Result<bool> started = c->start_direct(direct);
  if (!started.ok()) {
    *result = started.take_status();
    return true;
  }
  if (!started.value()) return false;
  drive_until([&] { return direct.done(); }, {c});
  *result = direct.status();
  return true;
}

Status launch(std::vector<PendingCall> calls,
              std::vector<std::pair<Comm*, std::function<void(size_t)>>> watches = {}) {
  if (Status direct; launch_p2p_direct(calls, !watches.empty(), &direct)) return direct;
  std::vector<Launch> launches = build_ops(calls, watches);
  Status first;
  std::vector<Comm*> sync_comms;
  std::vector<std::shared_ptr<Op>> sync_ops, async_ops;
  for (auto& l : launches) {
    Status s = l.comm->enqueue(l.op);
    if (!s.ok()) {
      l.op->complete(s);
      for (Stream* st : l.op->streams()) st->note_result(s);
      if (first.ok()) first = std::move(s);
      continue;
    }
    if (l.sync) {
      sync_ops.push_back(l.op);
      if (std::find(sync_comms.begin(), sync_comms.end(), l.comm.get()) == sync_comms.end())
        sync_comms.push_back(l.comm.get());
    } else {
      async_ops.push_back(l.op);
      Engine::get().watch(l.comm);
    }
  }
  if (!sync_ops.empty()) {
    drive_until([&] {
      return std::all_of(sync_ops.begin(), sync_ops.end(), [](const auto& o) { return o->done(); });
    }, sync_comms);
  }
  for (const auto& op : sync_ops)
    if (!op->status().ok() && first.ok()) first = op->status();
  if (first.ok()) {
    // NULL-stream work of non-blocking comms: report it as in progress until it is done.
    for (const auto& l : launches) {
      if (!l.sync && l.op->streams().empty() && !l.op->done())
        return Status(Code::kInProgress, "operations of a non-blocking communicator in flight");
    }
  }
  return first;
}

}  // namespace

bool in_group() { return t_group.depth > 0; }

Status group_start() {
  ++t_group.depth;
  return Status();
}

Status group_end() {
  if (t_group.depth == 0) return invalid_usage("ncclGroupEnd without a matching ncclGroupStart");
  if (--t_group.depth > 0) return Status();
  ThreadGroup group = std::move(t_group);
  t_group = ThreadGroup{};
  if (!group.first_error.ok()) {
    return Status(group.first_error.code(),
                  "group not launched: a call inside it failed: " + group.first_error.message());
  }
  if (!group.inits.empty()) CHORUS_RETURN_IF_ERROR(run_inits(std::move(group.inits)));
  if (group.calls.empty()) return Status();
  return launch(std::move(group.calls), std::move(group.recv_watches));
}

Status group_watch_receives(Comm* comm, std::function<void(size_t arrived)> watch) {
  if (t_group.depth == 0) return internal_error("group_watch_receives outside a group");
  t_group.recv_watches.emplace_back(comm, std::move(watch));
  return Status();
}

Status group_simulate_end(float* estimated_us) {
  if (t_group.depth == 0) return invalid_usage("ncclGroupSimulateEnd without ncclGroupStart");
  if (--t_group.depth > 0) return Status();
  ThreadGroup group = std::move(t_group);
  t_group = ThreadGroup{};
  // A simple alpha-beta estimate per call: 5 us + bytes at 5 GB/s.
  double us = 0;
  for (const auto& c : group.calls)
    us += 5.0 + static_cast<double>(c.call.count * datatype_size(c.call.dtype)) / 5e3;
  *estimated_us = static_cast<float>(us);
  return Status();
}

// A collective outside a group: one operation, without the bookkeeping of a group. A blocking
// call on an idle comm (the common case of small, latency-bound calls) runs its operation
// from this frame, without queueing it.
Status launch_one(const std::shared_ptr<Comm>& comm, const CollCall& call, Stream* stream) {
  Comm* c = comm.get();
  if (stream == nullptr && comm->config().blocking) {
    if (Status express; c->run_express(call, &express)) return express;
    Op direct(c, std::vector<CollCall>{call}, false);
    CHORUS_ASSIGN_OR_RETURN(bool started, c->start_direct(direct));
    if (started) {
      drive_until([&] { return direct.done(); }, {c});
      return direct.status();
    }
  }
  auto op = std::make_shared<Op>(c, std::vector<CollCall>{call}, false);
  if (stream != nullptr) stream->append(op);
  Status s = comm->enqueue(op);
  if (!s.ok()) {
    op->complete(s);
    if (stream != nullptr) stream->note_result(s);
    return s;
  }
  if (stream != nullptr || !comm->config().blocking) {
    Engine::get().watch(comm);
    if (stream == nullptr && !op->done())
      return Status(Code::kInProgress, "operation of a non-blocking communicator in flight");
    return Status();
  }
  drive_until([&] { return op->done(); }, {c});
  return op->status();
}

Status submit_call(const std::shared_ptr<Comm>& comm, const CollCall& call, Stream* stream) {
  if (t_group.depth > 0) {
    t_group.calls.push_back(PendingCall{comm, call, stream});
    return Status();
  }
  if (!is_p2p(call.kind)) return launch_one(comm, call, stream);
  if (stream == nullptr && comm->config().blocking) {
    const CollCall* one = &call;
    if (Status express; comm->run_p2p_express(std::span(&one, 1), &express)) return express;
  }
  return launch({PendingCall{comm, call, stream}});
}

void group_fail(const Status& status) {
  if (t_group.depth > 0 && t_group.first_error.ok()) t_group.first_error = status;
}

Status submit_init(std::function<Status()> job, const void* order_key) {
  if (t_group.depth > 0) {
    t_group.inits.push_back(InitJob{std::move(job), order_key});
    return Status();
  }
  return job();
}

Status run_and_wait(const std::vector<std::shared_ptr<Op>>& ops, const std::vector<Comm*>& comms) {
  for (const auto& op : ops) CHORUS_RETURN_IF_ERROR(op->comm()->enqueue(op));
  drive_until([&] {
    return std::all_of(ops.begin(), ops.end(), [](const auto& o) { return o->done(); });
  }, comms);
  for (const auto& op : ops) CHORUS_RETURN_IF_ERROR(op->status());
  return Status();
}

}  // namespace chorus
