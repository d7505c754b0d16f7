// SPDX-License-Identifier: Apache-2.0
// File: transports/chunk.cc
// The chunk layer (chunk.h): messages cut into chunks over the paths to a peer, and chunks
// matched to posted receives by the message they name.
#include "transports/chunk.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/clock.h"
#include "common/dtype.h"
#include "transports/protocol.h"

namespace chorus {

struct PeerLink::SendChunk {
  SendRequest req;
  SplitSend* split = nullptr;
  size_t path = 0;
  bool counted = false;
};

struct PeerLink::SplitSend {
  SendRequest* parent = nullptr;
  std::vector<SendChunk*> chunks;
  size_t remaining = 0;
  size_t posted = 0;  // chunks[0, posted) are on paths (ADAPTIVE posts them as paths free up)
  bool failed = false;
};

struct PeerLink::RecvChunk {
  RecvRequest req;
  PendingRecv* pending = nullptr;
};

struct PeerLink::PendingRecv {
  RecvRequest* req = nullptr;
  bool whole = false;        // posted as a whole on a path
  bool started = false;      // a chunk of it was matched
  uint64_t got = 0;          // bytes of completed chunks
  uint32_t chunks_done = 0;
  uint32_t chunks_total = 0;  // known once the last chunk arrived
  uint64_t total = 0;         // the message's size, known with the last chunk
};

namespace {

// The sequence space a tag's number counts in: send/receive pairs, Chorus's internal exchanges
// and collectives number their messages apart (Comm::enqueue), so one number in two spaces
// names two messages (a Broadcast #5 arriving while SendRecv #5 is still being received).
int seq_space(const MsgTag& t) {
  switch (static_cast<CollKind>(t.coll)) {
    case CollKind::kSendRecv:
    case CollKind::kSend:
    case CollKind::kRecv: return 1;
    case CollKind::kInternal: return 2;
    default: return 0;
  }
}

// The message a tag names, whatever the chunk.
bool same_message(const MsgTag& a, const MsgTag& b) {
  return a.seq == b.seq && seq_space(a) == seq_space(b) && a.lane() == b.lane() &&
         a.ordinal() == b.ordinal();
}

// The call `req` was posted for sent this chunk (a receive sized by the sender takes any
// count).
bool same_call(const RecvRequest& req, const MsgTag& tag) {
  if (!req.size_from_sender) return req.tag == tag;
  MsgTag t = tag;
  t.count = req.tag.count;
  return req.tag == t;
}

}  // namespace

PeerLink::PeerLink(int my_rank, int peer, std::vector<Connection*> paths, size_t chunk_bytes,
                   bool adaptive)
    : my_rank_(my_rank),
      peer_(peer),
      paths_(std::move(paths)),
      chunk_bytes_(chunk_bytes),
      adaptive_(adaptive),
      stats_(paths_.size()),
      load_(paths_.size()),
      active_chunk_(paths_.size(), nullptr),
      active_whole_(paths_.size(), nullptr) {}

PeerLink::~PeerLink() = default;

void PeerLink::post_send(SendRequest* req) {
  if (!error_.ok()) {
    req->fail();
    return;
  }
  const size_t n_paths = paths_.size();
  const size_t first = req->tag.lane() % n_paths;
  const uint64_t n_chunks = req->bytes == 0 ? 1 : (req->bytes + chunk_bytes_ - 1) / chunk_bytes_;
  if (n_paths == 1 || n_chunks < 2 || n_chunks > MsgTag::kMaxChunks) {
    req->tag.set_chunk(0, true);
    stats_[first].messages += 1;
    stats_[first].message_bytes += req->bytes;
    paths_[first]->post_send(req);
    return;
  }
  SplitSend* split = split_pool_.take();
  split->parent = req;
  split->remaining = n_chunks;
  split->posted = 0;
  split->failed = false;
  split->chunks.clear();
  req->posted_ns = now_ns();
  const auto* base = static_cast<const std::byte*>(req->buf);
  for (uint64_t i = 0; i < n_chunks; ++i) {
    SendChunk* c = send_chunk_pool_.take();
    const uint64_t off = i * chunk_bytes_;
    c->req.reset();
    c->req.peer = req->peer;
    c->req.bytes = std::min<uint64_t>(chunk_bytes_, req->bytes - off);
    c->req.buf = base + off;
    c->req.memfd = req->memfd;
    if (c->req.memfd.fd >= 0) c->req.memfd.offset += off;
    c->req.key = req->key;
    c->req.tag = req->tag;
    c->req.tag.set_chunk(static_cast<uint32_t>(i), i + 1 == n_chunks);
    c->req.posted_ns = req->posted_ns;
    c->split = split;
    c->path = (first + i) % n_paths;
    c->counted = false;
    split->chunks.push_back(c);
  }
  // Posted after the split is complete: a path may complete a chunk at once (direct memory).
  splits_.push_back(split);
  if (adaptive_) {
    dispatch();
    return;
  }
  split->posted = split->chunks.size();
  for (SendChunk* c : split->chunks) paths_[c->path]->post_send(&c->req);
}

int PeerLink::choose_path(uint64_t bytes, int64_t now) {
  // Each path's backlog and rate: the chunks posted on it, plus what its transport has handed
  // to the network and not seen acknowledged, at the rate the network delivers (TCP: SIOCOUTQ
  // and TCP_INFO); else the chunks alone at the rate they complete.
  double best_rate = 0;
  for (size_t p = 0; p < paths_.size(); ++p) {
    Connection::PathState ps;
    PathLoad& l = load_[p];
    l.network_bytes = 0;
    l.network_rate = false;
    if (paths_[p]->path_state(&ps)) {
      l.network_bytes = ps.unacked_bytes;
      l.network_rate = ps.delivery_rate > 0;
      if (l.network_rate) stats_[p].rate = ps.delivery_rate;
    }
    best_rate = std::max(best_rate, stats_[p].rate);
  }
  int best = -1;
  double best_finish = 0;
  for (size_t p = 0; p < paths_.size(); ++p) {
    PathStats& st = stats_[p];
    const PathLoad& l = load_[p];
    // Unmeasured, or idle for a while: assume it as fast as the best (probe it).
    const bool idle = l.chunks == 0 && l.network_bytes == 0;
    if (st.rate <= 0 || (idle && now - l.last_post_ns > kProbeNs && st.rate < best_rate))
      st.rate = best_rate > 0 ? best_rate : 1.0;
    const double finish = static_cast<double>(l.bytes + l.network_bytes + bytes) / st.rate;
    if (best < 0 || finish < best_finish) {
      best = static_cast<int>(p);
      best_finish = finish;
    }
  }
  // The path that would finish it first is busy: the chunk waits for it.
  return load_[best].chunks < kWindow ? best : -1;
}

bool PeerLink::dispatch() {
  if (splits_.empty()) return false;  // no clock read on a pass with nothing to place
  bool moved = false;
  const int64_t now = now_ns();
  for (SplitSend* s : splits_) {
    while (s->posted < s->chunks.size()) {
      SendChunk* c = s->chunks[s->posted];
      const int p = choose_path(c->req.bytes, now);
      if (p < 0) return moved;
      c->path = static_cast<size_t>(p);
      c->req.posted_ns = now;
      load_[p].chunks += 1;
      load_[p].bytes += c->req.bytes;
      load_[p].last_post_ns = now;
      ++s->posted;
      moved = true;
      paths_[p]->post_send(&c->req);
    }
  }
  return moved;
}

void PeerLink::post_recv(RecvRequest* req) {
  if (!error_.ok()) {
    req->fail();
    return;
  }
  PendingRecv* p = pending_pool_.take();
  *p = PendingRecv{};
  p->req = req;
  pending_.push_back(p);
}

bool PeerLink::progress() {
  bool moved = false;
  for (Connection* c : paths_) moved |= c->progress();
  moved |= reap_recvs();
  moved |= reap_sends();
  if (adaptive_ && error_.ok()) moved |= dispatch();
  for (size_t p = 0; p < paths_.size() && error_.ok(); ++p) {
    // One receive posted per path at a time: the next message is looked at once it is done.
    while (active_chunk_[p] == nullptr && active_whole_[p] == nullptr && !pending_.empty() &&
           match(p)) {
      moved = true;
      // A transport may take what has landed when the receive is posted (verbs does); only a
      // receive still open needs a pass of its path.
      const Request* posted = active_chunk_[p] != nullptr ? &active_chunk_[p]->req
                              : active_whole_[p] != nullptr ? active_whole_[p]->req
                                                            : nullptr;
      if (posted != nullptr && !posted->done()) paths_[p]->progress();
      reap_recvs();
      if (!error_.ok()) break;
    }
  }
  if (error_.ok()) {
    for (Connection* c : paths_) {
      if (!c->error().ok()) {
        fail(c->error());
        moved = true;
        break;
      }
    }
  }
  if (error_.ok() && !pending_.empty()) {
    // A path the peer closed in order brings nothing more, but the others may still bring what
    // was sent before (Connection::peer_closed): a receive fails once every path is closed.
    const Status* closed = nullptr;
    for (Connection* c : paths_) {
      if (c->peer_closed().ok()) {
        closed = nullptr;
        break;
      }
      if (closed == nullptr) closed = &c->peer_closed();
    }
    if (closed != nullptr) {
      fail(*closed);
      moved = true;
    }
  }
  return moved;
}

bool PeerLink::check_alive() {
  for (Connection* c : paths_) {
    if (!error_.ok()) break;
    if (!c->check_alive()) fail(c->error());
  }
  return error_.ok();
}

bool PeerLink::idle() const {
  if (!pending_.empty() || !splits_.empty()) return false;
  for (Connection* c : paths_)
    if (!c->idle()) return false;
  return true;
}

bool PeerLink::match(size_t p) {
  MsgTag tag;
  uint64_t bytes = 0;
  if (!paths_[p]->peek(&tag, &bytes)) return false;
  // The receive of this message: its call exactly if several share the key.
  PendingRecv* found = nullptr;
  for (PendingRecv* pr : pending_) {
    if (pr->whole || !same_message(pr->req->tag, tag)) continue;
    if (same_call(*pr->req, tag)) {
      found = pr;
      break;
    }
    if (found == nullptr) found = pr;
  }
  if (found == nullptr) return false;  // not posted yet: it waits on its path
  RecvRequest* req = found->req;
  if (!same_call(*req, tag) || (tag.chunk() == 0 && tag.last_chunk() && !found->started)) {
    // A whole message, or another call than the one posted: the transport takes it as it
    // always did (and names both calls in a mismatch).
    found->whole = true;
    active_whole_[p] = found;
    stats_[p].messages += 1;
    stats_[p].message_bytes += bytes;
    req->posted_ns = now_ns();
    paths_[p]->post_recv(req);
    return true;
  }
  return post_chunk(p, found, tag, bytes);
}

bool PeerLink::post_chunk(size_t p, PendingRecv* pending, const MsgTag& tag, uint64_t bytes) {
  RecvRequest* req = pending->req;
  const uint64_t off = static_cast<uint64_t>(tag.chunk()) * chunk_bytes_;
  if ((!tag.last_chunk() && bytes != chunk_bytes_) || bytes > chunk_bytes_) {
    fail(remote_error("rank {} sent a {}-byte chunk of {} but rank {} cuts messages into "
                      "{}-byte chunks (is CHORUS_PATH_CHUNK_BYTES set differently?)",
                      peer_, bytes, describe_tag(tag), my_rank_, chunk_bytes_));
    return true;
  }
  const uint64_t end = off + bytes;
  if (end > req->bytes || (tag.last_chunk() && !req->size_from_sender && end != req->bytes)) {
    const uint64_t sent = tag.last_chunk() ? end : off + bytes;
    fail(invalid_usage("rank {} sent {} but rank {} {} {} from it", peer_,
                       describe_message(tag, sent, !tag.last_chunk()), my_rank_,
                       req->size_from_sender ? "has room for" : "expects",
                       describe_message(req->tag, req->bytes)));
    return true;
  }
  if (req->reduce != nullptr) {
    if (Status st = check_reducing_receive(*req, peer_); !st.ok()) {
      fail(std::move(st));
      return true;
    }
  }
  if (!pending->started) {
    pending->started = true;
    req->posted_ns = now_ns();
    if (req->size_from_sender) req->tag.count = tag.count;
  }
  if (tag.last_chunk()) {
    pending->chunks_total = tag.chunk() + 1;
    pending->total = end;
  }
  RecvChunk* c = recv_chunk_pool_.take();
  c->pending = pending;
  c->req.reset();
  c->req.peer = req->peer;
  c->req.bytes = bytes;
  c->req.tag = tag;
  c->req.size_from_sender = false;
  c->req.dst = static_cast<std::byte*>(req->dst) + off;
  c->req.reduce = req->reduce;
  c->req.elem_size = req->elem_size;
  c->req.key = req->key;
  c->req.src = req->reduce == nullptr ? nullptr
               : static_cast<const std::byte*>(req->src != nullptr ? req->src : req->dst) + off;
  c->req.posted_ns = now_ns();
  active_chunk_[p] = c;
  paths_[p]->post_recv(&c->req);
  return true;
}

bool PeerLink::reap_recvs() {
  bool moved = false;
  auto retire = [&](PendingRecv* pr) {
    pending_.erase(std::find(pending_.begin(), pending_.end(), pr));
    pending_pool_.give(pr);
  };
  for (size_t p = 0; p < paths_.size(); ++p) {
    if (PendingRecv* whole = active_whole_[p]; whole != nullptr && whole->req->done()) {
      // Its transport completed (or failed) it; the caller may free it from now on.
      active_whole_[p] = nullptr;
      retire(whole);
      moved = true;
    }
    RecvChunk* c = active_chunk_[p];
    if (c == nullptr || !c->req.done()) continue;
    active_chunk_[p] = nullptr;
    moved = true;
    PendingRecv* pr = c->pending;
    const bool failed = c->req.failed();
    const int64_t now = now_ns();
    if (pr == nullptr) {  // its message failed with the link
      recv_chunk_pool_.give(c);
      continue;
    }
    if (!failed) {
      stats_[p].chunks += 1;
      stats_[p].bytes += c->req.bytes;
      stats_[p].busy_ns += now - c->req.posted_ns;
      pr->got += c->req.bytes;
      pr->chunks_done += 1;
    }
    recv_chunk_pool_.give(c);
    if (failed) {
      fail(!paths_[p]->error().ok() ? paths_[p]->error()
                                    : remote_error("a chunk from rank {} failed", peer_));
      continue;
    }
    RecvRequest* req = pr->req;
    req->bytes_done.store(pr->got, std::memory_order_relaxed);
    if (pr->chunks_total != 0 && pr->chunks_done == pr->chunks_total) {
      if (req->size_from_sender) req->bytes = pr->total;
      req->done_ns = now;
      retire(pr);
      req->complete();
    }
  }
  return moved;
}

bool PeerLink::reap_sends() {
  bool moved = false;
  for (size_t i = 0; i < splits_.size();) {
    SplitSend* s = splits_[i];
    const int64_t now = now_ns();
    for (SendChunk* c : s->chunks) {
      if (c->counted || !c->req.done()) continue;
      c->counted = true;
      moved = true;
      --s->remaining;
      if (c->req.failed()) {
        s->failed = true;
        if (adaptive_) {
          load_[c->path].chunks -= 1;
          load_[c->path].bytes -= c->req.bytes;
        }
        continue;
      }
      PathStats& st = stats_[c->path];
      st.chunks += 1;
      st.bytes += c->req.bytes;
      st.busy_ns += now - c->req.posted_ns;
      st.sent_chunks += 1;
      st.sent_bytes += c->req.bytes;
      if (adaptive_) {
        // The chunk's service time: from when it reached the head of the path's queue (its
        // posting, or the previous completion on the path, whichever is later).
        PathLoad& l = load_[c->path];
        const int64_t start = std::max(c->req.posted_ns, l.last_done_ns);
        const double sample =
            static_cast<double>(c->req.bytes) / static_cast<double>(std::max<int64_t>(now - start, 1000));
        if (!l.network_rate) st.rate = st.rate > 0 ? 0.75 * st.rate + 0.25 * sample : sample;
        l.last_done_ns = now;
        l.chunks -= 1;
        l.bytes -= c->req.bytes;
      }
      if (s->parent != nullptr) s->parent->bytes_done.fetch_add(c->req.bytes, std::memory_order_relaxed);
    }
    if (s->remaining > 0) {
      ++i;
      continue;
    }
    SendRequest* parent = s->parent;
    const bool failed = s->failed;
    for (SendChunk* c : s->chunks) send_chunk_pool_.give(c);
    s->chunks.clear();
    splits_.erase(splits_.begin() + static_cast<ptrdiff_t>(i));
    split_pool_.give(s);
    if (parent == nullptr) continue;  // failed with the link already
    parent->done_ns = now;
    if (failed) {
      parent->fail();
    } else {
      parent->complete();
    }
  }
  return moved;
}

void PeerLink::fail(Status status) {
  if (!error_.ok()) return;
  error_ = std::move(status);
  // Tell the peer where we can, so its side fails with our reason instead of waiting.
  for (Connection* c : paths_) c->farewell(error_);
  // Every request of the caller fails now, except a whole message in a transport's hands
  // (the transport completes or fails it). Chunks still posted stay ours until their path
  // lets go of them.
  for (size_t i = 0; i < pending_.size();) {
    PendingRecv* pr = pending_[i];
    if (std::find(active_whole_.begin(), active_whole_.end(), pr) != active_whole_.end()) {
      ++i;
      continue;
    }
    for (RecvChunk* c : active_chunk_)
      if (c != nullptr && c->pending == pr) c->pending = nullptr;
    pr->req->fail();
    pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
    pending_pool_.give(pr);
  }
  for (SplitSend* split : splits_) {
    // Chunks never posted are done with: the split retires once the posted ones are let go.
    for (size_t i = split->posted; i < split->chunks.size(); ++i) {
      split->chunks[i]->counted = true;
      --split->remaining;
    }
    split->posted = split->chunks.size();
    if (split->parent == nullptr) continue;
    split->parent->fail();
    split->parent = nullptr;
  }
}

}  // namespace chorus
