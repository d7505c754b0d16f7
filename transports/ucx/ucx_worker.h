// SPDX-License-Identifier: Apache-2.0
// File: transports/ucx/ucx_worker.h
// UCP resources: the process's contexts (one per set of UCX settings), one worker per
// communicator rank, and one endpoint per peer with its failure state.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "transports/registration_key.h"

namespace chorus::ucx {

using ConfigOverrides = std::vector<std::pair<std::string, std::string>>;
class Reaper;

// A UCP context with features TAG and WAKEUP, shared by every worker of this process that uses
// the same settings (it is created thread-safe: mt_workers_shared). The environment's UCX_*
// variables are read when it is created (ucp_config_read), then `overrides` applied.
class Context {
 public:
  // The context for `overrides`, created on first use. The default one (no overrides) is kept
  // for the life of the process, like any UCX application's; others go with their last user.
  // A child process after fork() never reuses its parent's, and creates its own without UCP's
  // registration cache (unless UCX_RCACHE_ENABLE is set): see ucx_worker.cc.
  static Result<std::shared_ptr<Context>> get(const ConfigOverrides& overrides);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return ctx_; }
  // The UCX_TLS value in effect ("all" by default), for messages: "sm,self (used as
  // posix,sysv,self)" when the single-copy transports were left out (ucx_worker.cc).
  const std::string& tls() const { return tls_; }

 private:
  Context(ucp_context_h ctx, std::string tls) : ctx_(ctx), tls_(std::move(tls)) {}
  ucp_context_h ctx_;
  std::string tls_;
};

// The endpoint to one peer, shared by the connections of all its channels. The error callback
// runs inside ucp_worker_progress() of the owning worker and only records the failure.
struct Peer {
  int rank = -1;
  std::string label;              // "rank 3 (host node7, pid 1234)"
  ucp_ep_h ep = nullptr;          // null once closed
  ucs_status_t failure = UCS_OK;  // reported by UCX (UCS_ERR_ENDPOINT_TIMEOUT, ...)
  std::string local_reason;       // why this side closed the endpoint early, if it did
  // False for an endpoint without peer-failure handling (UCP_ERR_HANDLING_MODE_NONE): UCX
  // will not report this peer's death; the communicator's liveness watch does (same host).
  bool watched = true;

  bool failed() const { return failure != UCS_OK || !local_reason.empty(); }
  // "went away (UCX: Endpoint timeout)" or "was cut off by rank 0: <reason>".
  std::string why() const;
};

// One UCP worker (UCS_THREAD_MODE_SERIALIZED: the ranks' driving threads take turns under the
// communicator's drive mutex) and its endpoints. Not thread-safe.
class Worker {
 public:
  // `label` names the owner in messages ("comm 0x12 rank 1/4"). When the last shared_ptr
  // goes, the worker is retired (see retire()): that never blocks on a peer.
  static Result<std::shared_ptr<Worker>> create(std::shared_ptr<Context> context,
                                                std::string label);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h handle() const { return worker_; }
  const Context& context() const { return *context_; }
  const std::string& label() const { return label_; }
  // This worker's UCP address, what peers connect to.
  const std::string& address() const { return address_; }

  // An endpoint to the worker at `address`, with peer-failure handling (error mode PEER). UCX
  // 1.13's shared-memory transports cannot handle peer failure: when UCX can reach a peer on
  // `same_host` only through them (UCX_TLS=sm,self, say), the endpoint is made without it
  // (mode NONE; Peer::watched false), since a same-host peer's death is detected by the
  // communicator's liveness watch instead. kRemoteError when UCX cannot reach it at all.
  Result<std::shared_ptr<Peer>> add_peer(int rank, std::string label, std::string_view address,
                                         bool same_host);
  const std::vector<std::shared_ptr<Peer>>& peers() const { return peers_; }

  // ucp_worker_progress() until it reports nothing (bounded); true if anything happened.
  bool progress();
  // For Connection::poll_fd(): arms the worker and returns its event fd (POLLIN); when arming
  // reports pending events (UCS_ERR_BUSY) returns a descriptor that is always readable so that
  // the caller does not sleep; -1 if arming fails otherwise.
  int poll_fd(short* events);
  // Progresses, then sleeps on the event fd until UCX has an event or `timeout_ms` passes.
  void wait(int timeout_ms);
  // Closes `peer`'s endpoint at once (UCP_EP_CLOSE_FLAG_FORCE): operations still in flight on
  // it complete with an error, and its connections fail with `reason`. An unwatched endpoint
  // (which UCX does not let us force) is closed with a flush instead.
  void force_close(Peer* peer, std::string reason);
  // Keeps `buf` alive until the worker is destroyed: UCX may still write into it.
  void bury(std::vector<uint8_t> buf);
  // A connection gave up waiting for UCX operations and left them in flight (teardown after an
  // error): memory handles they may use are kept until the worker is destroyed (unmap()).
  void abandon_requests() { abandoned_.store(true, std::memory_order_release); }

  // Registered memory (MemoryKey). map() makes a UCP memory handle for the caller's memory
  // [p, p + bytes) (ucp_mem_map, nothing allocated); unmap() releases it at once, or, if
  // operations were abandoned in flight, when the worker is destroyed. Both may be called from
  // any thread (UCP's context is thread-safe, mt_workers_shared).
  Result<ucp_mem_h> map(const void* p, size_t bytes);
  void unmap(ucp_mem_h memh);

 private:
  Worker(std::shared_ptr<Context> context, std::string label)
      : context_(std::move(context)), label_(std::move(label)) {}
  ~Worker();
  friend class Reaper;
  // The deleter of create()'s shared_ptr: closes the endpoints (FORCE to failed peers, flush to
  // the others) and destroys the worker once they are closed, on this thread if that is quick,
  // else on the process's reaper thread, which progresses closing workers for at most 5 s.
  static void retire(Worker* w);
  void begin_close();
  // Progresses; true once every endpoint close (and discard) completed.
  bool close_step();
  // Receives and drops unexpected messages that nobody will ask for (`everything`: also
  // payloads from live peers, just before the worker is destroyed).
  void discard_unexpected(bool everything);

  std::shared_ptr<Context> context_;
  std::string label_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
  std::vector<std::shared_ptr<Peer>> peers_;
  std::vector<void*> closing_;   // endpoint close requests
  std::vector<void*> discards_;  // receives of unexpected messages being dropped
  std::vector<std::vector<uint8_t>> graveyard_;
  std::atomic<bool> abandoned_{false};
  std::mutex memh_mutex_;
  std::vector<ucp_mem_h> buried_memh_;  // guarded by memh_mutex_; unmapped with the worker
};

// The UCX transport's key for a registered range (transports/registration_key.h): a UCP memory
// handle of the range, passed with the transfers of buffers inside it (UCP_OP_ATTR_FIELD_MEMH)
// so that UCX need not look the range up or register it itself. Holds its worker (and so the
// UCP context) until it is released.
class MemoryKey final : public RegistrationKey {
 public:
  MemoryKey(std::shared_ptr<Worker> worker, ucp_mem_h memh)
      : worker_(std::move(worker)), memh_(memh) {}
  ~MemoryKey() override { worker_->unmap(memh_); }
  MemoryKey(const MemoryKey&) = delete;
  MemoryKey& operator=(const MemoryKey&) = delete;
  ucp_mem_h memh() const { return memh_; }

 private:
  std::shared_ptr<Worker> worker_;
  ucp_mem_h memh_;
};

// Process-wide counts of memory handles and of the UCP messages that carried one, so that
// tests can tell that registered memory really goes with its handle.
struct MemhStats {
  uint64_t mapped = 0;
  uint64_t unmapped = 0;
  uint64_t sends = 0;  // payload messages sent with a memory handle
  uint64_t recvs = 0;  // payload messages received with one
};
MemhStats memh_stats();
void count_memh_message(bool send);

// A readable eventfd that nobody drains (the answer to UCS_ERR_BUSY), or -1.
int always_ready_fd();

// Progresses `worker` (sleeping on its event fd in between) until `done()` or `timeout_ms`
// pass; returns done().
template <typename Pred>
bool progress_until(Worker& worker, Pred done, int timeout_ms) {
  const int64_t end = now_ns() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    worker.progress();
    if (done()) return true;
    int64_t left_ms = (end - now_ns()) / 1000000;
    if (left_ms <= 0) return done();
    worker.wait(static_cast<int>(left_ms < 5 ? left_ms : 5));
  }
}

}  // namespace chorus::ucx
