// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/root_server.h
// The bootstrap root server (internal): one thread per ncclUniqueId that collects one blob per
// rank and sends every rank the whole table. For ncclCommInitRankScalable the root of a group
// k > 0 forwards its group's blobs to root 0 and relays the table back.
//
// The server is a single non-blocking poll() loop over per-connection state machines, so a
// slow, silent or hostile connection never stalls the others:
//   accept -> handshake (mutual HMAC auth, bounded by a short per-connection timeout)
//          -> HELLO (a rank) or FORWARD (a group root)  -> wait -> TABLE -> close.
// Any protocol violation drops that connection only (logged); what would make the
// communicator unusable (a joined rank leaving, root 0 failing, the timeout) ends the server
// with an ERROR frame to every connected rank.
#pragma once

#include <poll.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/auth.h"
#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace chorus::bootstrap {

// The handshake context of connections to a root (ranks and group roots alike).
inline constexpr std::string_view kBootstrapContext = "chorus-bootstrap";

// Starts a root server thread ("chorus-root") for `id` on `listen_fd` (already listening,
// non-blocking). It runs until it has served one communicator, `timeout_ms` has passed, or the
// process exits (an atexit handler stops and joins every root; a forked child forgets the
// parent's roots). Thread-safe.
Status start_root_server(UniqueFd listen_fd, const UniqueId& id, int64_t timeout_ms);

namespace detail {

class RootServer {
 public:
  // Takes the listening socket (closed as soon as the server is done, so late clients are
  // refused instead of waiting); `wake_fd` stays owned by the caller.
  RootServer(UniqueFd listen_fd, int wake_fd, const UniqueId& id, int64_t timeout_ms);
  ~RootServer();
  RootServer(const RootServer&) = delete;
  RootServer& operator=(const RootServer&) = delete;

  // The thread body: returns when the server is done.
  void run();

 private:
  enum class Role : uint8_t {
    kHandshake,  // accepted, not authenticated yet
    kAuthed,     // authenticated, no HELLO/FORWARD yet
    kRank,       // a rank that sent its HELLO
    kForwarder,  // a group root forwarding its group (we are root 0)
    kUpstream,   // our own link to root 0 (we are a group root)
    kClosing,    // flushing an ERROR frame, then closed
  };
  struct Peer;

  // Loop (root_server.cc).
  void poll_once();
  void accept_new();
  void service(Peer& p, short revents);
  Status read_frames(Peer& p);
  Status flush(Peer& p);
  short wanted_events(const Peer& p) const;
  void on_timer();
  void drop(Peer& p, const Status& why);
  void fail(const std::string& reason);
  void reject(Peer& p, const std::string& reason);
  void finish(std::string reason);
  bool all_delivered() const;

  // Protocol (root_protocol.cc).
  Status handle_frame(Peer& p);
  Status on_hello(Peer& p, std::string_view payload);
  Status on_forward(Peer& p, std::string_view payload);
  Status on_forward_entry(Peer& p, std::string_view payload);
  Status on_upstream_frame(Peer& p);
  // Learns (or checks) nranks/nroots/group; a mismatch is a message for the sender.
  Status configure(int64_t nranks, int64_t nroots, uint32_t group, const char* what);
  void add_blob(int rank, std::string_view blob);
  void on_collected();
  void build_table();
  void start_upstream();
  Status advance_upstream(Peer& p, short revents);
  void broadcast_progress();
  std::string missing_ranks() const;

  UniqueFd listen_fd_;
  const int wake_fd_;
  const UniqueId id_;
  const std::string name_;  // "bootstrap root <addr>"
  const int64_t start_ns_;
  const int64_t end_ns_;
  const int64_t handshake_ms_;

  std::vector<std::unique_ptr<Peer>> peers_;
  int64_t accept_paused_until_ns_ = 0;
  bool done_ = false;

  // The communicator, once the first HELLO or FORWARD told us.
  int nranks_ = 0;
  uint32_t nroots_ = 1;
  uint32_t group_ = 0;
  int expected_ = 0;  // blobs this root collects itself (its group, or everyone at root 0)
  std::vector<std::string> blobs_;
  std::vector<uint8_t> have_;  // per rank: 0 missing, 1 collected here, 2 relayed by root 0
  int joined_ = 0;
  std::vector<uint8_t> forwarded_groups_;
  // Group roots only: root 0, learned from the ranks' HELLOs.
  net::SockAddr root0_;
  uint64_t root0_uid_ = 0;
  Secret root0_secret_;
  // The serialised TABLE frame and its ENTRY frames, sent to every recipient.
  std::string table_wire_;
  bool table_ready_ = false;
  int last_progress_joined_ = 0;
  int64_t next_progress_ns_ = 0;
  int64_t next_waiting_note_ns_ = 0;  // when to log "still waiting for ranks" again
};

struct RootServer::Peer {
  UniqueFd fd;
  std::string addr;
  Role role = Role::kHandshake;
  std::unique_ptr<Handshake> hs;  // kHandshake, and kUpstream while authenticating
  short hs_events = POLLIN;
  Secret session_key;
  int64_t expires_ns = INT64_MAX;  // handshake or closing deadline
  wire::FrameReader reader;
  std::string out;  // control frames to send, before any table bytes
  size_t out_off = 0;
  bool wants_table = false;
  size_t table_off = 0;
  bool dead = false;          // closed; erased at the end of the loop iteration
  int rank = -1;              // kRank
  uint32_t group = 0;         // kForwarder
  uint32_t forward_left = 0;  // kForwarder: ENTRY frames still expected
  // kUpstream only.
  enum class Link : uint8_t { kWaitRetry, kConnecting, kHandshake, kReady };
  Link link = Link::kWaitRetry;
  int64_t retry_at_ns = 0;
  int backoff_ms = 10;
  bool got_table_header = false;
  int table_entries = 0;
};

}  // namespace detail
}  // namespace chorus::bootstrap
