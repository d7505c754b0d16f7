// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/root_server.cc
// The root server's poll loop: accepting, per-connection IO, timeouts and shutdown. The
// protocol decisions (what a frame means) are in root_protocol.cc.
#include "bootstrap/root_server.h"

#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "common/log.h"

namespace chorus::bootstrap::detail {

namespace {

constexpr int kMaxHandshakes = 256;   // unauthenticated connections held at once
constexpr int kFramesPerWakeup = 16;  // fairness between connections
constexpr int64_t kProgressIntervalMs = 1000;
constexpr int64_t kCloseGraceMs = 1000;  // to flush an ERROR frame before closing
// Once a rank has joined, a missing rank holds every joined one until the timeout: the root,
// which alone knows which ranks are missing, says so at WARN (the ranks say how many).
constexpr int64_t kFirstWaitingNoteMs = 5000;
constexpr int64_t kWaitingNoteIntervalMs = 30000;

int64_t saturating_deadline(int64_t start_ns, int64_t ms) {
  if (ms > (INT64_MAX - start_ns) / 1000000) return INT64_MAX;
  return start_ns + ms * 1000000;
}

}  // namespace

RootServer::RootServer(UniqueFd listen_fd, int wake_fd, const UniqueId& id, int64_t timeout_ms)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(wake_fd),
      id_(id),
      name_("bootstrap root " + id.root.to_string()),
      start_ns_(now_ns()),
      end_ns_(saturating_deadline(start_ns_, timeout_ms)),
      handshake_ms_(std::min<int64_t>(5000, timeout_ms)) {}

RootServer::~RootServer() = default;

void RootServer::run() {
  pthread_setname_np(pthread_self(), "chorus-root");
  CHORUS_INFO(kBootstrap, "{} started (communicator uid {:#x})", name_, id_.comm_uid);
  next_progress_ns_ = now_ns() + kProgressIntervalMs * 1000000;
  next_waiting_note_ns_ = start_ns_ + kFirstWaitingNoteMs * 1000000;
  while (!done_) poll_once();
  listen_fd_.reset();
  peers_.clear();
}

short RootServer::wanted_events(const Peer& p) const {
  if (p.dead || !p.fd.valid()) return 0;
  bool out_pending =
      p.out_off < p.out.size() || (p.wants_table && p.table_off < table_wire_.size());
  switch (p.role) {
    case Role::kHandshake:
      return p.hs_events;
    case Role::kClosing:
      return POLLOUT;
    case Role::kUpstream:
      if (p.link == Peer::Link::kConnecting) return POLLOUT;
      if (p.link == Peer::Link::kHandshake) return p.hs_events;
      return static_cast<short>(POLLIN | (out_pending ? POLLOUT : 0));
    default:
      return static_cast<short>(POLLIN | (out_pending ? POLLOUT : 0));
  }
}

void RootServer::poll_once() {
  std::vector<pollfd> fds;
  std::vector<Peer*> owners;
  fds.push_back({wake_fd_, POLLIN, 0});
  int64_t now = now_ns();
  bool accepting = now >= accept_paused_until_ns_;
  if (accepting) fds.push_back({listen_fd_.get(), POLLIN, 0});
  int64_t wake_ns = std::min(end_ns_, next_progress_ns_);
  if (!accepting) wake_ns = std::min(wake_ns, accept_paused_until_ns_);
  for (auto& p : peers_) {
    if (p->dead) continue;
    if (p->role == Role::kHandshake || p->role == Role::kClosing) {
      wake_ns = std::min(wake_ns, p->expires_ns);
    }
    if (p->role == Role::kUpstream && p->link == Peer::Link::kWaitRetry) {
      wake_ns = std::min(wake_ns, p->retry_at_ns);
      continue;
    }
    fds.push_back({p->fd.get(), wanted_events(*p), 0});
    owners.push_back(p.get());
  }
  int timeout_ms =
      static_cast<int>(std::clamp<int64_t>((wake_ns - now + 999999) / 1000000, 0, 1000));
  int rc = ::poll(fds.data(), fds.size(), timeout_ms);
  if (rc < 0 && errno != EINTR) {
    fail(fmt::format("poll() failed: {}", std::strerror(errno)));
    return;
  }
  if (rc > 0 && fds[0].revents != 0) {
    bool ranks_waiting = std::any_of(peers_.begin(), peers_.end(), [](const auto& p) {
      return !p->dead && (p->role == Role::kRank || p->role == Role::kForwarder);
    });
    std::string reason = "stopped: the process that created the ncclUniqueId is exiting";
    if (ranks_waiting)
      fail(reason);
    else
      finish(reason);
    return;
  }
  size_t first_peer = accepting ? 2 : 1;
  if (rc > 0 && accepting && fds[1].revents != 0) accept_new();
  for (size_t i = 0; rc > 0 && i < owners.size() && !done_; ++i) {
    if (fds[first_peer + i].revents != 0) service(*owners[i], fds[first_peer + i].revents);
  }
  if (!done_) on_timer();
  std::erase_if(peers_, [](const std::unique_ptr<Peer>& p) { return p->dead; });
  if (!done_ && all_delivered()) {
    finish(fmt::format("served {} ranks in {} ms", nranks_, (now_ns() - start_ns_) / 1000000));
  }
}

void RootServer::accept_new() {
  for (int i = 0; i < 64; ++i) {
    net::SockAddr addr;
    addr.len = sizeof(addr.storage);
    UniqueFd fd(
        accept4(listen_fd_.get(), addr.mutable_sa(), &addr.len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: back off instead of spinning on a readable listener.
      CHORUS_WARN_RATELIMITED(kBootstrap, "{}: accept() failed: {}; pausing 100 ms", name_,
                              std::strerror(errno));
      accept_paused_until_ns_ = now_ns() + 100 * 1000000;
      return;
    }
    int handshakes = 0;
    Peer* oldest = nullptr;
    for (auto& p : peers_) {
      if (p->dead || p->role != Role::kHandshake) continue;
      if (handshakes++ == 0) oldest = p.get();
    }
    if (handshakes >= kMaxHandshakes && oldest != nullptr) {
      drop(*oldest, remote_error("evicted: {} connections were authenticating", handshakes));
    }
    net::set_nodelay(fd.get());
    auto peer = std::make_unique<Peer>();
    peer->fd = std::move(fd);
    peer->addr = addr.to_string();
    peer->hs = std::make_unique<Handshake>(Handshake::Role::kResponder, id_.secret,
                                           kBootstrapContext, peer->addr);
    peer->expires_ns = now_ns() + handshake_ms_ * 1000000;
    peers_.push_back(std::move(peer));
  }
}

void RootServer::service(Peer& p, short revents) {
  if (p.dead) return;
  Status status;
  if (p.role == Role::kUpstream) {
    status = advance_upstream(p, revents);
  } else if (p.role == Role::kHandshake) {
    Result<short> events = p.hs->advance(p.fd.get());
    if (!events.ok()) {
      status = events.take_status();
    } else if (*events != 0) {
      p.hs_events = *events;
    } else {
      p.role = Role::kAuthed;
      p.session_key = p.hs->session_key();
      p.hs.reset();
      p.expires_ns = INT64_MAX;
    }
  }
  bool reading = p.role == Role::kAuthed || p.role == Role::kRank || p.role == Role::kForwarder;
  if (status.ok() && reading) status = read_frames(p);
  if (status.ok() && !p.dead && p.role != Role::kHandshake && p.role != Role::kUpstream) {
    status = flush(p);
  }
  if (!status.ok()) drop(p, status);
}

Status RootServer::read_frames(Peer& p) {
  for (int i = 0; i < kFramesPerWakeup && !p.dead && !done_; ++i) {
    CHORUS_ASSIGN_OR_RETURN(bool complete, p.reader.read(p.fd.get()));
    if (!complete) return ok_status();
    Status status = handle_frame(p);
    p.reader.next();
    CHORUS_RETURN_IF_ERROR(status);
    if (p.role == Role::kClosing) return ok_status();
  }
  return ok_status();
}

Status RootServer::flush(Peer& p) {
  while (p.out_off < p.out.size()) {
    CHORUS_ASSIGN_OR_RETURN(
        size_t n, net::send_some(p.fd.get(), p.out.data() + p.out_off, p.out.size() - p.out_off));
    if (n == 0) return ok_status();
    p.out_off += n;
  }
  p.out.clear();
  p.out_off = 0;
  if (p.role == Role::kClosing) {
    p.dead = true;
    p.fd.reset();
    return ok_status();
  }
  if (!p.wants_table) return ok_status();
  while (p.table_off < table_wire_.size()) {
    CHORUS_ASSIGN_OR_RETURN(size_t n, net::send_some(p.fd.get(), table_wire_.data() + p.table_off,
                                                     table_wire_.size() - p.table_off));
    if (n == 0) return ok_status();
    p.table_off += n;
  }
  CHORUS_TRACE(kBootstrap, "{}: table delivered to {}", name_, p.addr);
  p.wants_table = false;
  p.dead = true;
  p.fd.reset();
  return ok_status();
}

void RootServer::on_timer() {
  int64_t now = now_ns();
  if (now >= end_ns_) {
    fail(fmt::format("gave up after {} ms (CHORUS_BOOTSTRAP_TIMEOUT_MS): {}",
                     (now - start_ns_) / 1000000, missing_ranks()));
    return;
  }
  for (size_t i = 0; i < peers_.size() && !done_; ++i) {
    Peer& p = *peers_[i];
    if (p.dead) continue;
    if (p.role == Role::kClosing && now >= p.expires_ns) {
      p.dead = true;
      p.fd.reset();
    } else if (p.role == Role::kHandshake && now >= p.expires_ns) {
      drop(p, remote_error("no authentication within {} ms", handshake_ms_));
    } else if (p.role == Role::kUpstream && p.link == Peer::Link::kWaitRetry &&
               now >= p.retry_at_ns) {
      Status status = advance_upstream(p, 0);
      if (!status.ok()) drop(p, status);
    }
  }
  if (!done_ && now >= next_progress_ns_) {
    broadcast_progress();
    next_progress_ns_ = now + kProgressIntervalMs * 1000000;
  }
  // Not before a first rank joined: until then the id may simply not be in use yet.
  if (!done_ && !table_ready_ && nranks_ > 0 && now >= next_waiting_note_ns_) {
    next_waiting_note_ns_ = now + kWaitingNoteIntervalMs * 1000000;
    std::string limit = "no time limit";
    if (end_ns_ != INT64_MAX) {
      limit = fmt::format("gives up after {} s (CHORUS_BOOTSTRAP_TIMEOUT_MS)",
                          (end_ns_ - start_ns_ + 500000000) / 1000000000);
    }
    CHORUS_WARN(kBootstrap, "{}: still waiting for ranks after {} s: {}; {}", name_,
                (now - start_ns_) / 1000000000, missing_ranks(), limit);
  }
}

// Unauthenticated trouble is rate-limited (anyone can connect); losing a rank, a forwarder or
// root 0 before the table is out ends the whole bootstrap.
void RootServer::drop(Peer& p, const Status& why) {
  if (p.dead) return;
  std::string who = p.addr;
  if (p.role == Role::kRank) who = fmt::format("rank {} ({})", p.rank, p.addr);
  if (p.role == Role::kForwarder) who = fmt::format("the root of group {} ({})", p.group, p.addr);
  Role role = p.role;
  p.dead = true;
  p.fd.reset();
  switch (role) {
    case Role::kHandshake:
    case Role::kClosing:
      CHORUS_WARN_RATELIMITED(kBootstrap, "{}: dropped connection from {}: {}", name_, who,
                              why.message());
      return;
    case Role::kAuthed:
      CHORUS_WARN(kBootstrap, "{}: dropped connection from {}: {}", name_, who, why.message());
      return;
    case Role::kRank:
    case Role::kForwarder:
      if (table_ready_) {
        CHORUS_WARN(kBootstrap, "{}: {} left before it received the table: {}", name_, who,
                    why.message());
        return;
      }
      fail(fmt::format("{} left before every rank had joined: {}", who, why.message()));
      return;
    case Role::kUpstream:
      fail(fmt::format("cannot complete the bootstrap through root 0 ({}): {}", p.addr,
                       why.message()));
      return;
  }
}

void RootServer::reject(Peer& p, const std::string& reason) {
  CHORUS_WARN(kBootstrap, "{}: rejected {}: {}", name_, p.addr, reason);
  std::string text = fmt::format("{} refused {}", name_, reason);
  wire::append_frame(&p.out, wire::FrameType::kError,
                     std::string_view(text).substr(0, wire::kMaxErrorBytes));
  p.role = Role::kClosing;
  p.expires_ns = now_ns() + kCloseGraceMs * 1000000;
}

// Tells every rank (and forwarder) why, best effort, and stops.
void RootServer::fail(const std::string& reason) {
  if (done_) return;
  CHORUS_WARN(kBootstrap, "{}: {}", name_, reason);
  std::string text = fmt::format("{}: {}", name_, reason).substr(0, wire::kMaxErrorBytes);
  for (auto& p : peers_) {
    if (p->dead || (p->role != Role::kRank && p->role != Role::kForwarder)) continue;
    if (p->wants_table && p->table_off > 0) continue;  // mid-table: the rank sees the close
    p->wants_table = false;
    wire::append_frame(&p->out, wire::FrameType::kError, text);
    p->role = Role::kClosing;
    Status ignored = flush(*p);
    (void)ignored;
  }
  done_ = true;
}

void RootServer::finish(std::string reason) {
  CHORUS_INFO(kBootstrap, "{}: {}", name_, reason);
  done_ = true;
}

bool RootServer::all_delivered() const {
  if (!table_ready_) return false;
  for (const auto& p : peers_) {
    if (!p->dead && p->wants_table) return false;
  }
  return true;
}

}  // namespace chorus::bootstrap::detail
