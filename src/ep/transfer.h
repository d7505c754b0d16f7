// SPDX-License-Identifier: Apache-2.0
// File: src/ep/transfer.h
// Where EP tokens move between ranks.
//
// Same host: one copy. Every EP buffer's staging area lives in a memfd that the buffer's
// same-host peers map (/proc/<pid>/fd/<fd>, as the shm transport maps its FIFOs), so a sender
// writes its tokens straight from the caller's arrays into the receiver's staging area, at the
// place the receiver reads them from, and raises its arrival word there; no pack, no FIFO, no
// second copy on the way. Other hosts (or pairs that could not map each other, or
// CHORUS_EP_MAP=0, or a CHORUS_TRANSPORT that forces a transport without shared memory): the
// messages go as one group of ncclSend/ncclRecv on the buffer's communicator (post_remote()).
// The staging area is registered with the communicator (as by ncclCommRegister) when a
// transport to a peer uses registered memory: over verbs, a message between two staging areas
// of at least CHORUS_IB_RDV_BYTES is then RDMA-written by the sender's HCA straight into the
// receiver's area (zero copy), and smaller ones are read by the HCA where they are. (Combine
// copies its rows for other hosts into its own area first, so they leave from there.)
//
// Order: each step (a dispatch or a combine) begins with a collective on the communicator (the
// count exchange, the agreement) that every rank enters only after it has finished reading its
// staging area in the step before, so a writer never overwrites what a reader still reads.
// Low-latency calls (low_latency.h) are steps too; with two in flight, each writes only into the
// slot its agreement found every rank holding, which a rank takes only once its last call there
// has been read. An arrival word holds the writer's latest step, and a writer's steps come in
// order, so a word at or past a call's step means that call's writes are in.
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "core/liveness.h"
#include "core/op.h"

namespace chorus {
class Comm;
}

namespace chorus::ep {

struct SendMsg {
  int peer;
  const void* data;
  size_t bytes;
};
struct RecvMsg {
  int peer;
  void* data;
  size_t bytes;
};

// A message post_remote posts (and Arrivals counts): between this rank and another, of at
// least one byte.
template <typename Msg>
bool travels(const Msg& m, int rank) {
  return m.peer != rank && m.bytes > 0;
}
// True when any message of `sends` or `recvs` travels.
bool any_travels(const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs, int rank);

// A failed call of the public API, with the calling thread's last error text.
Status from_nccl(ncclResult_t r, const char* what);

// Messages between ranks: `sends` to their peers, `recvs` from theirs; messages between the same
// pair of ranks match in the order given. Zero-byte messages are skipped (both sides agree on
// them: the sizes come from the count exchange). Every rank posts its messages in the same
// collective step. copy_to_self: the messages to itself, copied now. post_remote: the messages
// to other ranks, posted as one group on `stream` (NULL: waited for).
Status copy_to_self(int rank, const std::vector<SendMsg>& sends, const std::vector<RecvMsg>& recvs);
Status post_remote(ncclComm_t comm, int rank, const std::vector<SendMsg>& sends,
                   const std::vector<RecvMsg>& recvs, cudaStream_t stream);

// The remote receives of a batch posted by post_watched, as they arrive. They count in the
// order of `recvs`, only those from another rank of at least one byte (what post_remote
// posts): the i-th of them is in once arrived() > i.
class Arrivals {
 public:
  size_t total() const { return total_; }
  size_t arrived() const;
  // Waits until `count` (<= total()) have arrived, or returns the batch's failure. Bounded:
  // the communicator fails a batch whose peer stops (its timeout, a dead peer).
  Status wait(size_t count) const;
  // Waits for the whole batch, its sends included; its status.
  Status wait_done() const;

 private:
  friend Result<std::shared_ptr<const Arrivals>> post_watched(
      ncclComm_t comm, int rank, const std::vector<SendMsg>& sends,
      const std::vector<RecvMsg>& recvs, cudaStream_t stream);
  struct Count {
    mutable std::mutex mutex;
    mutable std::condition_variable cv;
    size_t arrived = 0;
  };
  size_t total_ = 0;
  std::shared_ptr<Count> count_ = std::make_shared<Count>();
  std::shared_ptr<Op> op_;  // the batch (null: nothing to receive or send remotely)
};

// post_remote on a host stream (not NULL) whose receives report their arrival: the caller can
// use what came in while the rest travels.
Result<std::shared_ptr<const Arrivals>> post_watched(ncclComm_t comm, int rank,
                                                     const std::vector<SendMsg>& sends,
                                                     const std::vector<RecvMsg>& recvs,
                                                     cudaStream_t stream);

// This rank's staging area, and the staging areas of the same-host ranks it writes into.
class PeerAreas {
 public:
  // A memfd-backed area of `bytes` (plus one arrival word per rank of the communicator),
  // registered with the communicator where a transport uses registered memory (a failed
  // registration is logged, and the area's messages go the ordinary way).
  static Result<std::unique_ptr<PeerAreas>> create(ncclComm_t comm, int rank, int nranks,
                                                   size_t bytes);
  // Deregisters the area and unmaps it.
  ~PeerAreas();
  PeerAreas(const PeerAreas&) = delete;
  PeerAreas& operator=(const PeerAreas&) = delete;

  char* local() const { return local_; }
  size_t bytes() const { return bytes_; }
  // True when the area is registered with the communicator (its transports' keys made).
  bool registered() const { return registration_ != nullptr; }

  // Collective, once, before the first step: every rank publishes where its area is and maps
  // its same-host peers' areas; then the ranks publish which peers they mapped, so both ends
  // of a pair agree on how it moves data.
  Status connect();
  bool connected() const { return connected_; }

  // True when this rank writes straight into `peer`'s area (itself included).
  bool writes_into(int peer) const { return maps_[idx(rank_) * n_ + idx(peer)] != 0; }
  // True when `peer` writes straight into this rank's area.
  bool written_by(int peer) const { return maps_[idx(peer) * n_ + idx(rank_)] != 0; }
  // `peer`'s area (writes_into(peer)), of area_bytes(peer) bytes.
  char* area(int peer) const { return peers_[idx(peer)].base; }
  size_t area_bytes(int peer) const { return peers_[idx(peer)].bytes; }

  // Hosts (after connect()): the ranks of each host, hosts in the order of their lowest rank.
  int num_hosts() const { return static_cast<int>(hosts_.size()); }
  int host_of(int rank) const { return host_of_[idx(rank)]; }
  const std::vector<int>& host_ranks(int host) const { return hosts_[idx(host)]; }
  // The rank of `host` that receives `sender`'s tokens for every rank there once and writes
  // them into their buffers (DeepEP's internode forwarding), or -1: the sender sends to each
  // rank there itself (its own host; a host of one rank; a host whose ranks cannot all write
  // into each other). Senders spread over the host's ranks by their own index on their host.
  int forwarder(int sender, int host) const;

  // Starts a step: returns its number, the same on every rank.
  uint64_t begin_step() { return ++step_; }
  // After this rank's writes of the step into `peer`'s area: publishes them (release).
  void mark_written(int peer, uint64_t step);
  // Waits until every rank that writes into this area has marked the step written (acquire).
  // Bounded by the communicator's timeout; a same-host peer whose process has exited fails the
  // wait at once. `call` names the operation in errors.
  Status wait_written(uint64_t step, const char* call);

 private:
  struct Peer {
    char* base = nullptr;  // the peer's staging area, mapped here
    size_t bytes = 0;
    void* map = nullptr;  // the whole mapping (header included), to unmap
    size_t map_bytes = 0;
    int pid = 0;
  };
  PeerAreas(ncclComm_t comm, int rank, int nranks) : comm_(comm), rank_(rank), nranks_(nranks) {}
  static size_t idx(int r) { return static_cast<size_t>(r); }
  size_t header_bytes() const;
  Result<Peer> map_peer(int pid, int fd, size_t bytes) const;
  // Registers [local_, local_ + bytes_) with the communicator and makes the key of every
  // transport that carries traffic to a peer; on failure logs why and leaves it unregistered.
  void register_area();

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  size_t n_ = 0;
  size_t bytes_ = 0;
  UniqueFd fd_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  char* local_ = nullptr;
  std::weak_ptr<Comm> registered_with_;  // the communicator, while it lives
  void* registration_ = nullptr;         // its handle for the area (Comm::register_buffer)
  bool connected_ = false;
  uint64_t step_ = 0;
  std::vector<Peer> peers_;    // [nranks]; self is the local area
  std::vector<uint8_t> maps_;  // [nranks * nranks]: row s, column r = rank s writes into r
  PeerWatch watch_;            // the processes of the peers that write into this area
  std::vector<int> host_of_;               // [nranks]
  std::vector<int> index_on_host_;         // [nranks]: position among its host's ranks
  std::vector<std::vector<int>> hosts_;    // ranks of each host, ascending
  std::vector<uint8_t> forwarding_host_;   // [hosts]: its ranks all write into each other
};

}  // namespace chorus::ep
