// SPDX-License-Identifier: Apache-2.0
// File: transports/ucx/ucx_worker.cc
// UCP contexts, workers and endpoints; the arm/progress protocol for sleeping.
#include "transports/ucx/ucx_worker.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/log.h"
#include "transports/registry.h"

namespace chorus::ucx {

namespace {

constexpr size_t kMaxSmallBytes = 8192;  // discard_unexpected(): a header message at most

// The value of UCX setting `name` (without "UCX_") in `config`, read from its printout.
std::string config_value(const ucp_config_t* config, std::string_view name) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "?";
  ucp_config_print(config, stream, nullptr, UCS_CONFIG_PRINT_CONFIG);
  std::fclose(stream);
  std::string value = "?";
  std::string key = fmt::format("UCX_{}=", name);
  std::string_view all(text, size);
  for (size_t pos = 0; pos < all.size();) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(pos, end - pos);
    if (line.substr(0, key.size()) == key) {
      value = std::string(line.substr(key.size()));
      break;
    }
    pos = end + 1;
  }
  std::free(text);
  return value;
}

void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  auto* peer = static_cast<Peer*>(arg);
  if (peer->failure == UCS_OK) peer->failure = status == UCS_OK ? UCS_ERR_IO_ERROR : status;
  CHORUS_INFO(kNet, "ucx: endpoint to {} failed: {}", peer->label, ucs_status_string(status));
}

std::mutex g_contexts_mutex;

struct MemhCounters {
  std::atomic<uint64_t> mapped{0}, unmapped{0}, sends{0}, recvs{0};
};
MemhCounters g_memh;

// The process that loaded the library (and with it UCX): a different getpid() later means a
// child forked from it.
const pid_t g_loaded_pid = getpid();

// UCX's memory hooks (UCM) are live from the moment UCX is loaded, and every hooked mmap/brk
// holds UCM's event lock for reading. A child forked while another thread of its parent was in
// one inherits the lock held by nobody, and the first ucp_init() that takes it exclusively (to
// set up the registration cache) hangs for ever (seen with Chorus's forked ranks: the parent's
// bootstrap thread allocates while it forks). A forked child therefore runs without UCP's
// registration cache unless UCX_RCACHE_ENABLE says otherwise. (UCX_MEM_EVENTS=no in the
// parent's environment avoids the hooks altogether.)
bool in_forked_child() { return getpid() != g_loaded_pid; }

// UCX 1.13's single-copy shared-memory transports (cma, knem, xpmem) read the peer's memory
// directly, and when the peer has died cma aborts the whole process (process_vm_readv fails
// inside uct_cma_ep_tx: ucs_fatal). Endpoints with peer-failure handling never use them (UCX
// leaves out every transport that cannot detect a peer's failure), but the same-host endpoints
// that go without it (Worker::add_peer) would, and a survivor would die with its peer. So the
// UCX_TLS list is rewritten without them: "sm" and "shm" become "posix,sysv" (large messages
// are then copied through UCX's shared-memory FIFOs) and a negated list ("^tcp") gets them
// added. "all" (the default) stays: it has tcp, so every endpoint gets failure handling.
std::string without_single_copy(const std::string& tls) {
  static const std::set<std::string> kSingleCopy = {"cma", "knem", "xpmem"};
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= tls.size()) {
    size_t comma = tls.find(',', start);
    if (comma == std::string::npos) comma = tls.size();
    if (comma > start) items.push_back(tls.substr(start, comma - start));
    start = comma + 1;
  }
  if (items.empty()) return tls;
  std::vector<std::string> out;
  auto add = [&](const std::string& t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  if (items[0].starts_with("^")) {
    for (const auto& t : items) add(t);
    for (const auto& t : kSingleCopy) add(t);
  } else {
    for (const auto& t : items) {
      if (t == "all") return tls;
      if (t == "sm" || t == "shm" || t == "mm") {
        add("posix");
        add("sysv");
      } else if (kSingleCopy.count(t) == 0) {
        add(t);
      }
    }
    if (out.empty()) return tls;
  }
  std::string joined;
  for (const auto& t : out) joined += (joined.empty() ? "" : ",") + t;
  return joined;
}

}  // namespace

// ---- Context --------------------------------------------------------------------------------

Result<std::shared_ptr<Context>> Context::get(const ConfigOverrides& overrides) {
  static std::map<std::string, std::weak_ptr<Context>> cache;
  // The default contexts, kept for the process and never destroyed: a child after fork() must
  // not clean up the one it inherited (it belongs to the parent's UCX state).
  static auto* kept = new std::vector<std::shared_ptr<Context>>();

  std::string key = fmt::format("pid {}", getpid());
  for (const auto& [name, value] : overrides) key += fmt::format("\n{}={}", name, value);

  std::lock_guard<std::mutex> lock(g_contexts_mutex);
  if (auto it = cache.find(key); it != cache.end()) {
    if (std::shared_ptr<Context> existing = it->second.lock()) return existing;
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    return make_status(Code::kSystemError, "ucx: reading the UCX configuration failed: {}",
                       ucs_status_string(st));
  }
  for (const auto& [name, value] : overrides) {
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return invalid_argument("ucx: cannot set UCX_{}={}: {}", name, value, ucs_status_string(st));
    }
  }
  bool rcache_given = std::getenv("UCX_RCACHE_ENABLE") != nullptr;
  for (const auto& [name, value] : overrides) rcache_given |= name == "RCACHE_ENABLE";
  if (in_forked_child() && !rcache_given) {
    st = ucp_config_modify(config, "RCACHE_ENABLE", "n");
    if (st == UCS_OK) CHORUS_INFO(kNet, "ucx: forked child: UCP registration cache disabled");
  }
  std::string tls = config_value(config, "TLS");
  if (std::string safe = without_single_copy(tls); safe != tls) {
    st = ucp_config_modify(config, "TLS", safe.c_str());
    if (st == UCS_OK) {
      CHORUS_INFO(kNet, "ucx: UCX_TLS={} is used as {}: UCX's single-copy transports abort the "
                  "process when a same-host peer dies", tls, safe);
      tls = fmt::format("{} (used as {})", tls, safe);
    }
  }

  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // ranks may be threads of this process, each with a worker
  params.name = "chorus";
  ucp_context_h handle = nullptr;
  st = ucp_init(&params, config, &handle);
  ucp_config_release(config);
  if (st != UCS_OK) {
    return make_status(Code::kSystemError, "ucx: ucp_init failed (UCX_TLS={}): {}", tls,
                       ucs_status_string(st));
  }
  std::shared_ptr<Context> ctx(new Context(handle, tls));
  cache[key] = ctx;
  if (overrides.empty()) kept->push_back(ctx);
  std::erase_if(cache, [](const auto& entry) { return entry.second.expired(); });
  CHORUS_INFO(kNet, "ucx: UCP context created (UCX_TLS={}{})", tls,
              overrides.empty() ? "" : ", settings given by the caller");
  return ctx;
}

Context::~Context() {
  if (ctx_ != nullptr) ucp_cleanup(ctx_);
}

// ---- Peer -----------------------------------------------------------------------------------

std::string Peer::why() const {
  if (!local_reason.empty()) return local_reason;
  if (failure != UCS_OK) return fmt::format("went away (UCX: {})", ucs_status_string(failure));
  return "is fine";
}

// ---- Worker ---------------------------------------------------------------------------------

Result<std::shared_ptr<Worker>> Worker::create(std::shared_ptr<Context> context,
                                               std::string label) {
  std::shared_ptr<Worker> w(new Worker(std::move(context), std::move(label)), &Worker::retire);
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t st = ucp_worker_create(w->context_->handle(), &params, &w->worker_);
  if (st != UCS_OK) {
    w->worker_ = nullptr;
    return make_status(Code::kSystemError, "ucx: {}: ucp_worker_create failed: {}", w->label_,
                       ucs_status_string(st));
  }
  st = ucp_worker_get_efd(w->worker_, &w->efd_);
  if (st != UCS_OK) {
    return make_status(Code::kSystemError, "ucx: {}: ucp_worker_get_efd failed: {}", w->label_,
                       ucs_status_string(st));
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(w->worker_, &addr, &len);
  if (st != UCS_OK) {
    return make_status(Code::kSystemError, "ucx: {}: ucp_worker_get_address failed: {}",
                       w->label_, ucs_status_string(st));
  }
  w->address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w->worker_, addr);
  if (w->address_.size() > kMaxTransportBlob) {
    // Many devices: publish the network devices only.
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    attr.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    st = ucp_worker_query(w->worker_, &attr);
    if (st == UCS_OK) {
      w->address_.assign(reinterpret_cast<const char*>(attr.address), attr.address_length);
      ucp_worker_release_address(w->worker_, attr.address);
    }
    if (st != UCS_OK || w->address_.size() > kMaxTransportBlob) {
      return make_status(Code::kSystemError,
                         "ucx: {}: the worker address takes {} bytes, more than the {} a "
                         "transport may publish (limit UCX_TLS / UCX_NET_DEVICES)",
                         w->label_, w->address_.size(), kMaxTransportBlob);
    }
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  if (ucp_worker_query(w->worker_, &attr) == UCS_OK &&
      attr.thread_mode != UCS_THREAD_MODE_SERIALIZED) {
    CHORUS_INFO(kNet, "ucx: {}: worker thread mode {} instead of serialized", w->label_,
                static_cast<int>(attr.thread_mode));
  }
  return w;
}

// ---- Closing --------------------------------------------------------------------------------
//
// A worker goes when its last user (instance or connection) does. Endpoints to failed peers are
// dropped at once (FORCE); the others are closed with a flush, which UCX over TCP completes only
// once the peer acknowledged everything we sent, i.e. once the peer's worker progresses. Ranks
// that destroy a communicator together progress each other; but one thread that destroys the
// ranks of a process one after the other (or a peer that destroys later) would wait. So the
// closing worker is handed to a reaper thread that progresses every closing worker of the
// process until its flushes complete or kRetireMs pass, then destroys it: destroying never
// blocks on a peer, and closing workers of one process acknowledge each other.

namespace {

constexpr int kQuickCloseMs = 10;   // try to finish on the caller's thread first
constexpr int kRetireMs = 5000;     // how long a closing worker waits for its peers
constexpr int kExitGraceMs = 1000;  // at exit, what closing workers still get

}  // namespace

class Reaper {
 public:
  // The reaper of this process (none is inherited across fork()).
  static Reaper& get() {
    static std::mutex mutex;
    static Reaper* reaper = nullptr;
    std::lock_guard<std::mutex> lock(mutex);
    if (reaper == nullptr || reaper->pid_ != getpid()) {
      reaper = new Reaper();  // never deleted: a parent's is abandoned in a child
      static bool registered = false;
      if (!registered) {
        registered = true;
        std::atexit([] { get().stop(); });
      }
    }
    return *reaper;
  }

  // Takes `w` (closing) and destroys it once closed or given up on.
  void adopt(Worker* w) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopping_) {
        list_.push_back(Entry{w, now_ns() + int64_t{kRetireMs} * 1000000});
        if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
        cv_.notify_one();
        return;
      }
    }
    // At exit: the caller waits, briefly.
    progress_until(*w, [&] { return w->close_step(); }, kExitGraceMs);
    delete w;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      stop_at_ns_ = now_ns() + int64_t{kExitGraceMs} * 1000000;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Entry {
    Worker* worker;
    int64_t give_up_ns;
  };

  Reaper() : pid_(getpid()) {}

  void run() {
    pthread_setname_np(pthread_self(), "chorus-ucx-reap");
    std::vector<Entry> active;
    std::vector<pollfd> fds;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (active.empty()) cv_.wait(lock, [&] { return !list_.empty() || stopping_; });
        active.insert(active.end(), list_.begin(), list_.end());
        list_.clear();
        if (stopping_) {
          for (Entry& e : active) e.give_up_ns = std::min(e.give_up_ns, stop_at_ns_);
          if (active.empty()) return;
        }
      }
      const int64_t now = now_ns();
      std::erase_if(active, [&](const Entry& e) {
        bool closed = e.worker->close_step();
        if (!closed && now < e.give_up_ns) return false;
        if (!closed) {
          CHORUS_INFO(kNet, "ucx: {}: peers did not acknowledge the endpoints' flush within "
                      "{} ms; destroying the worker anyway", e.worker->label(), kRetireMs);
        }
        delete e.worker;
        return true;
      });
      if (active.empty()) continue;
      fds.clear();
      bool busy = false;
      for (const Entry& e : active) {
        short events = 0;
        int fd = e.worker->poll_fd(&events);
        if (fd < 0 || fd == always_ready_fd()) {
          busy = true;
        } else {
          fds.push_back(pollfd{fd, events, 0});
        }
      }
      if (!busy) ::poll(fds.data(), fds.size(), 20);
    }
  }

  const pid_t pid_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Entry> list_;  // handed over, not yet picked up by the thread
  std::thread thread_;
  bool stopping_ = false;
  int64_t stop_at_ns_ = 0;
};

void Worker::retire(Worker* w) {
  w->begin_close();
  if (progress_until(*w, [&] { return w->close_step(); }, kQuickCloseMs)) {
    delete w;
    return;
  }
  Reaper::get().adopt(w);
}

void Worker::begin_close() {
  if (worker_ == nullptr) return;
  auto close = [&](Peer& p, bool force) {
    if (p.ep == nullptr) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t req = ucp_ep_close_nbx(p.ep, &param);
    p.ep = nullptr;
    if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
  };
  for (auto& p : peers_)
    if (p->failed() && p->watched) close(*p, true);
  discard_unexpected(false);
  for (auto& p : peers_) close(*p, false);
}

bool Worker::close_step() {
  if (worker_ == nullptr) return true;
  progress();
  for (void* r : closing_)
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
  for (void* r : discards_)
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
  return true;
}

Worker::~Worker() {
  if (worker_ == nullptr) return;
  discard_unexpected(true);  // what came since begin_close(): peers' goodbyes, mostly
  // Incomplete ones are released by UCX when the worker destroys their endpoints.
  for (void* r : closing_) ucp_request_free(r);
  for (void* r : discards_) ucp_request_free(r);
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  graveyard_.clear();  // nothing can write into these any more
  for (ucp_mem_h memh : buried_memh_) {
    ucp_mem_unmap(context_->handle(), memh);
    g_memh.unmapped.fetch_add(1, std::memory_order_relaxed);
  }
}

// Messages nobody will receive. UCX would otherwise warn about each one when the worker goes.
// While closing: small ones (headers, farewells, hellos) and anything from a failed peer;
// payloads from live peers stay, since receiving them pulls their data (rendezvous). Last, just
// before the worker is destroyed (`everything`): all of them, the large ones into one scratch
// buffer (their data may never come; nobody reads it).
void Worker::discard_unexpected(bool everything) {
  progress();
  size_t scratch_bytes = 0;
  uint8_t* scratch = nullptr;
  for (int n = 0; n < (1 << 16); ++n) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = nullptr;
    for (const auto& p : peers_) {
      if (!p->failed()) continue;
      msg = ucp_tag_probe_nb(worker_, static_cast<ucp_tag_t>(p->rank), 0xfffffffu, 1, &info);
      if (msg != nullptr) break;
    }
    if (msg == nullptr) {
      msg = ucp_tag_probe_nb(worker_, 0, 0, 0, &info);
      if (msg == nullptr || (!everything && info.length > kMaxSmallBytes)) break;
      msg = ucp_tag_probe_nb(worker_, info.sender_tag, ~ucp_tag_t{0}, 1, &info);
      if (msg == nullptr) break;
    }
    uint8_t* into = nullptr;
    if (info.length <= kMaxSmallBytes) {
      // Its own buffer: small messages are eager and complete at once.
      std::vector<uint8_t> buf(std::max<size_t>(info.length, 1));
      into = buf.data();
      bury(std::move(buf));
    } else {
      if (scratch_bytes < info.length) {
        std::vector<uint8_t> buf(info.length);
        scratch = buf.data();
        scratch_bytes = buf.size();
        bury(std::move(buf));
      }
      into = scratch;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker_, into, info.length, msg, &param);
    if (UCS_PTR_IS_PTR(r)) discards_.push_back(r);
  }
}

Result<std::shared_ptr<Peer>> Worker::add_peer(int rank, std::string label,
                                               std::string_view address, bool same_host) {
  auto peer = std::make_shared<Peer>();
  peer->rank = rank;
  peer->label = std::move(label);
  // UCX unpacks the address in place: give it an aligned private copy.
  std::vector<uint64_t> copy((address.size() + 7) / 8);
  std::memcpy(copy.data(), address.data(), address.size());
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(copy.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_ep_error;
  params.err_handler.arg = peer.get();
  ucs_status_t st = ucp_ep_create(worker_, &params, &peer->ep);
  if (st == UCS_ERR_UNREACHABLE && same_host) {
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_, &params, &peer->ep);
    if (st == UCS_OK) {
      peer->watched = false;
      CHORUS_INFO(kNet, "ucx: {} -> {}: no transport with peer-failure handling in UCX_TLS={}; "
                  "the endpoint goes without it (the peer is on this host and watched there)",
                  label_, peer->label, context_->tls());
    }
  }
  if (st != UCS_OK) {
    peer->ep = nullptr;
    return remote_error("ucx: {} cannot create an endpoint to {}: {} (UCX_TLS={}{})", label_,
                        peer->label, ucs_status_string(st), context_->tls(),
                        same_host ? "" : "; a peer on another host needs a transport with "
                                         "peer-failure handling, such as tcp or rc");
  }
  peers_.push_back(peer);
  return peer;
}

bool Worker::progress() {
  unsigned total = 0;
  for (int i = 0; i < 64; ++i) {
    unsigned n = ucp_worker_progress(worker_);
    if (n == 0) break;
    total += n;
  }
  return total > 0;
}

int Worker::poll_fd(short* events) {
  ucs_status_t st = ucp_worker_arm(worker_);
  *events = POLLIN;
  if (st == UCS_OK) return efd_;
  // Events are pending that will not signal the event fd again: the caller must progress
  // instead of sleeping. (ucp_worker_signal() would not do: arm() consumes its signal and
  // returns BUSY again, forever.)
  if (st == UCS_ERR_BUSY) return always_ready_fd();
  return -1;
}

void Worker::wait(int timeout_ms) {
  if (progress()) return;
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return;
  pollfd pfd{efd_, POLLIN, 0};
  if (st != UCS_OK) {
    pfd.fd = -1;  // poll() then just sleeps
    timeout_ms = timeout_ms < 1 ? timeout_ms : 1;
  }
  ::poll(&pfd, 1, timeout_ms);
}

void Worker::force_close(Peer* peer, std::string reason) {
  if (!peer->failed()) peer->local_reason = std::move(reason);
  if (peer->ep == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // UCX documents forcing an endpoint without error handling as undefined behaviour.
  param.flags = peer->watched ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &param);
  peer->ep = nullptr;
  if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
}

void Worker::bury(std::vector<uint8_t> buf) {
  if (!buf.empty()) graveyard_.push_back(std::move(buf));
}

Result<ucp_mem_h> Worker::map(const void* p, size_t bytes) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = const_cast<void*>(p);
  params.length = bytes;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_->handle(), &params, &memh);
  if (st != UCS_OK) {
    return make_status(Code::kSystemError, "ucx: {}: ucp_mem_map of {} bytes at {} failed: {}",
                       label_, bytes, p, ucs_status_string(st));
  }
  g_memh.mapped.fetch_add(1, std::memory_order_relaxed);
  return memh;
}

void Worker::unmap(ucp_mem_h memh) {
  if (abandoned_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(memh_mutex_);
    buried_memh_.push_back(memh);
    return;
  }
  ucs_status_t st = ucp_mem_unmap(context_->handle(), memh);
  if (st != UCS_OK)
    CHORUS_WARN(kNet, "ucx: {}: ucp_mem_unmap failed: {}", label_, ucs_status_string(st));
  g_memh.unmapped.fetch_add(1, std::memory_order_relaxed);
}

MemhStats memh_stats() {
  return MemhStats{g_memh.mapped.load(std::memory_order_relaxed),
                   g_memh.unmapped.load(std::memory_order_relaxed),
                   g_memh.sends.load(std::memory_order_relaxed),
                   g_memh.recvs.load(std::memory_order_relaxed)};
}

void count_memh_message(bool send) {
  (send ? g_memh.sends : g_memh.recvs).fetch_add(1, std::memory_order_relaxed);
}

int always_ready_fd() {
  static const int fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);
  return fd;
}

}  // namespace chorus::ucx
