// SPDX-License-Identifier: Apache-2.0
// File: transports/chunk.h
// The chunk layer: what moves between this rank and one peer, over every path to it.
//
// A message is one or more chunks. Each chunk travels as one transport message whose MsgTag
// names the operation (seq, collective, ...), which message of the operation it belongs to
// (lane: the channel the algorithm posted it on; ordinal: the how-manieth message of the
// operation between the pair on that lane) and which piece of it (chunk index; the last chunk
// is flagged). A message of more than one chunk is cut into chunk_bytes pieces spread over all
// the paths (connections) to the peer, so its chunks travel side by side and land in any order;
// a message of one chunk goes on the path of its lane, as a whole.
//
// Receives are matched by that key, not by posting order: the layer looks at the next message
// waiting on each path (Connection::peek), finds the posted receive it belongs to and posts the
// receive of that chunk at its offset. So chunks of one message may come over several paths in
// any order, a receive may learn its size from the sender (RecvRequest::size_from_sender, over
// any number of chunks), and the messages of several operations may be in flight at once and
// arrive interleaved. A message whose receive is not posted yet waits on its path (the stream
// behind it waits too), as it would in the transport.
//
// A chunk's tag that names a posted receive's message but not its call (another collective,
// count or datatype at the same sequence number) fails the receive with the transport's
// ncclInvalidUsage text naming both calls, as a message out of posting order did before.
//
// Chunks of a split message complete with timestamps: the parent request's posted_ns and
// done_ns, and per path the bytes, chunks and busy time (path_stats).
//
// Routing (CHORUS_ROUTE). STATIC: a split message's chunks are striped evenly over the paths,
// all posted at once. ADAPTIVE (the default): chunks wait in the link and each goes, in order,
// to the path expected to finish it first, (bytes in flight on the path + the chunk) / the
// path's rate, with at most kWindow chunks in flight per path, so that a path that slows down
// (a shaped or congested rail) gets fewer chunks within a few chunk times. A path's backlog
// counts the bytes its transport has handed to the network and not seen acknowledged, and its
// rate is the network's delivery rate, when the transport tells (Connection::path_state: TCP's
// SIOCOUTQ and TCP_INFO); otherwise an EWMA of its completed chunks' service rates (bytes over
// the time from when the chunk reached the head of the path's queue to its completion). A path
// left idle for kProbeNs gets its rate estimate raised to the best path's, so it is tried
// again when it recovers.
//
// Not thread-safe: one thread at a time (the comm's driver) posts and progresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/status.h"
#include "transports/transport.h"

namespace chorus {

class PeerLink {
 public:
  struct PathStats {
    uint64_t chunks = 0;   // chunks of split messages that completed on this path
    uint64_t bytes = 0;    // their bytes
    int64_t busy_ns = 0;   // sum over them of completion minus posting time
    uint64_t sent_chunks = 0, sent_bytes = 0;  // of them, those this side sent
    double rate = 0;       // ADAPTIVE: the estimated send rate, bytes per ns (0: not measured)
    uint64_t messages = 0, message_bytes = 0;  // whole messages posted on it, both directions
  };
  static constexpr int kWindow = 2;
  static constexpr int64_t kProbeNs = 200'000'000;

  // `paths`: the connections to `peer`, one per channel (not owned; they outlive the link).
  // Messages longer than `chunk_bytes` are split when there are several paths.
  PeerLink(int my_rank, int peer, std::vector<Connection*> paths, size_t chunk_bytes,
           bool adaptive = true);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  int peer() const { return peer_; }
  size_t paths() const { return paths_.size(); }
  Connection* path(size_t i) const { return paths_[i]; }
  size_t chunk_bytes() const { return chunk_bytes_; }

  // The caller set req->tag (operation, and MsgTag::set_message(lane, ordinal)) and the rest of
  // the request; it owns it until it completes.
  void post_send(SendRequest* req);
  void post_recv(RecvRequest* req);
  // Moves data on every path, matches arrived chunks, completes split messages. True if
  // anything changed.
  bool progress();
  // Nothing posted is pending.
  bool idle() const;
  // Why the link failed (a path's error, or a chunk that fits no receive); OK while healthy.
  const Status& error() const { return error_; }
  // Asks every path whether its peer still answers (Connection::check_alive). A path that does
  // not fails the link: false, error() says why. (A transport may fail over below this layer:
  // TCP paths over several rails carry a failed path's traffic on a sibling, and answer yes.)
  bool check_alive();
  const PathStats& path_stats(size_t i) const { return stats_[i]; }

 private:
  struct SendChunk;
  struct RecvChunk;
  struct PendingRecv;
  struct SplitSend;

  // Tries to place the message waiting on path `p`; true if it did (or failed the link).
  bool match(size_t p);
  // Chunk receive of the message `pending` waits for, at chunk `tag.chunk()`, of `bytes`.
  bool post_chunk(size_t p, PendingRecv* pending, const MsgTag& tag, uint64_t bytes);
  bool reap_sends();
  bool reap_recvs();
  // ADAPTIVE: posts waiting chunks on the paths that will finish them first. True if any.
  bool dispatch();
  int choose_path(uint64_t bytes, int64_t now);
  void fail(Status status);
  // Objects reused from message to message: stable addresses, no allocation after warm-up.
  // take() hands out a used one as it was left; the caller sets every field it reads.
  template <typename T>
  class FreeList {
   public:
    T* take() {
      if (free_.empty()) return &all_.emplace_back();
      T* t = free_.back();
      free_.pop_back();
      return t;
    }
    void give(T* t) { free_.push_back(t); }

   private:
    std::deque<T> all_;
    std::vector<T*> free_;
  };

  const int my_rank_;
  const int peer_;
  const std::vector<Connection*> paths_;
  const size_t chunk_bytes_;
  const bool adaptive_;
  Status error_;
  std::vector<PathStats> stats_;
  // ADAPTIVE, per path: chunks and bytes posted and not yet complete, when the last one
  // completed, when one was last posted.
  struct PathLoad {
    int chunks = 0;
    uint64_t bytes = 0;
    int64_t last_done_ns = 0;
    int64_t last_post_ns = 0;
    uint64_t network_bytes = 0;  // handed to the network, not acknowledged (path_state)
    bool network_rate = false;   // path_state gave the rate at the last choice (no EWMA then)
  };
  std::vector<PathLoad> load_;

  // Receives posted and not yet complete: whole messages posted on a path (`direct`), or
  // messages whose chunks are being matched.
  std::vector<PendingRecv*> pending_;
  // Per path, what is posted on it now (the layer posts one receive per path at a time).
  std::vector<RecvChunk*> active_chunk_;
  std::vector<PendingRecv*> active_whole_;
  // Split sends in flight (their chunks are in their `chunks`).
  std::vector<SplitSend*> splits_;
  FreeList<PendingRecv> pending_pool_;
  FreeList<SplitSend> split_pool_;
  FreeList<SendChunk> send_chunk_pool_;
  FreeList<RecvChunk> recv_chunk_pool_;
};

}  // namespace chorus
