// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/bootstrap.cc
// The rank side of the rendezvous: create_unique_id(), exchange() and exchange_scalable().
#include "bootstrap/bootstrap.h"

#include <poll.h>

#include <cerrno>

#include "bootstrap/root_server.h"
#include "net/socket.h"
#include "bootstrap/wire.h"
#include "common/log.h"
#include "common/params.h"
#include "common/process.h"

namespace chorus::bootstrap {

static_assert(kMaxBlobBytes == wire::kMaxBlobBytes);

namespace {

// A rank can wait the whole bootstrap timeout for ranks that were never started or for a root
// that is gone (a stale ncclUniqueId), and nothing else is printed at the default WARN level in
// that time: say what the wait is for, first after kFirstNoteMs, then every kNoteIntervalMs.
// The wait itself stays bounded by the caller's deadline.
constexpr int64_t kFirstNoteMs = 5000;
constexpr int64_t kNoteIntervalMs = 30000;

// What a rank knows while it waits for the table, for error messages and waiting notes.
struct Waiter {
  int rank = 0;
  std::string root;
  int64_t start_ns = 0;
  int64_t joined = -1;  // from the root's PROGRESS frames; -1: none received
  int64_t expected = 0;
  int64_t next_note_ns = 0;  // when to say again that this rank is still waiting

  Waiter(int rank_in, std::string root_in)
      : rank(rank_in),
        root(std::move(root_in)),
        start_ns(now_ns()),
        next_note_ns(start_ns + kFirstNoteMs * 1000000) {}

  std::string progress() const {
    if (joined < 0) return "the root reported no progress";
    return fmt::format("{} of {} ranks had joined", joined, expected);
  }
  int64_t elapsed_ms() const { return (now_ns() - start_ns) / 1000000; }

  // Logs "still waiting" when a note is due; `what` says for what.
  void note_if_due(Deadline deadline, std::string_view what) {
    const int64_t now = now_ns();
    if (now < next_note_ns) return;
    next_note_ns = now + kNoteIntervalMs * 1000000;
    std::string limit = "no time limit";
    if (deadline.at_ns() != INT64_MAX) {
      limit = fmt::format("gives up after {} s (CHORUS_BOOTSTRAP_TIMEOUT_MS)",
                          (deadline.at_ns() - start_ns + 500000000) / 1000000000);
    }
    CHORUS_WARN(kBootstrap, "bootstrap: rank {} still waiting {} after {} s: {}; {}", rank, what,
                (now - start_ns) / 1000000000, status_line(), limit);
  }

  std::string status_line() const {
    if (joined < 0) return fmt::format("no answer yet from root {}", root);
    return fmt::format("{} of {} ranks have joined root {}{}", joined, expected, root,
                       joined < expected ? ", whose process logs which are missing" : "");
  }
};

// Waits until `fd` has something to read (or the deadline passes: the read that follows then
// fails with the usual message), saying every so often that the rank is still waiting.
Status wait_readable(int fd, Waiter& w, Deadline deadline) {
  for (;;) {
    Deadline slice = deadline.earlier(w.next_note_ns);
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, slice.remaining_ms(1000));
    if (rc > 0 || deadline.expired()) return ok_status();
    if (rc < 0 && errno != EINTR) return system_error(errno, "poll() on the bootstrap socket");
    w.note_if_due(deadline, "for ranks");
  }
}

Status waiting_failed(const Waiter& w, Status status, Deadline deadline) {
  if (deadline.cancelled()) {
    return remote_error("bootstrap: rank {} stopped waiting for root {} after {} ms: the "
                        "communicator was aborted", w.rank, w.root, w.elapsed_ms());
  }
  if (deadline.expired()) {
    return remote_error(
        "bootstrap: rank {}: no answer from root {} after {} ms "
        "(CHORUS_BOOTSTRAP_TIMEOUT_MS); {}",
        w.rank, w.root, w.elapsed_ms(), w.progress());
  }
  return remote_error("bootstrap: rank {} lost its connection to root {} after {} ms ({}): {}",
                      w.rank, w.root, w.elapsed_ms(), w.progress(), status.message());
}

// Reads PROGRESS / ERROR / TABLE + ENTRY frames until the whole table is in.
Result<std::vector<std::string>> receive_table(int fd, Waiter& w, int nranks,
                                               std::string_view my_blob, Deadline deadline) {
  std::vector<std::string> table;
  std::vector<uint8_t> seen;
  int received = 0;
  wire::FrameHeader header;
  std::string payload;
  for (;;) {
    CHORUS_RETURN_IF_ERROR(wait_readable(fd, w, deadline));
    Status st = wire::read_frame(fd, deadline, &header, &payload);
    if (!st.ok()) return waiting_failed(w, std::move(st), deadline);
    switch (header.type) {
      case wire::FrameType::kProgress: {
        uint32_t joined = 0, expected = 0;
        CHORUS_RETURN_IF_ERROR(wire::decode_pair(payload, &joined, &expected));
        w.joined = joined;
        w.expected = expected;
        continue;
      }
      case wire::FrameType::kError:
        return remote_error("bootstrap: rank {}: {}", w.rank,
                            std::string_view(payload).substr(0, wire::kMaxErrorBytes));
      case wire::FrameType::kTable: {
        wire::Reader r(payload);
        uint32_t n = r.u32();
        if (!table.empty() || !r.ok() || n != static_cast<uint32_t>(nranks)) {
          return remote_error("bootstrap: root {} sent a table of {} ranks, expected {}", w.root, n,
                              nranks);
        }
        table.resize(nranks);
        seen.assign(nranks, 0);
        continue;
      }
      case wire::FrameType::kEntry: {
        uint32_t rank = 0;
        std::string_view blob;
        CHORUS_RETURN_IF_ERROR(wire::decode_entry(payload, &rank, &blob));
        if (table.empty() || rank >= static_cast<uint32_t>(nranks) || seen[rank]) {
          return remote_error("bootstrap: root {} sent an unexpected entry for rank {}", w.root,
                              rank);
        }
        seen[rank] = 1;
        table[rank].assign(blob);
        if (++received < nranks) continue;
        if (table[w.rank] != my_blob) {
          return remote_error("bootstrap: root {} returned a different blob for rank {} itself",
                              w.root, w.rank);
        }
        return table;
      }
      default:
        return remote_error("bootstrap: root {} sent an unexpected {} frame", w.root,
                            wire::frame_type_name(header.type));
    }
  }
}

// Connects to `target`'s root, authenticates both ways, sends HELLO and waits for the table.
Result<std::vector<std::string>> run_rank(const UniqueId& target, wire::Hello hello,
                                          const Secret* root0_secret, Deadline deadline) {
  Waiter w(hello.rank, target.root.to_string());
  // Connect in slices, to say between them that the root does not answer (a root that died
  // leaves a unique id whose connections are refused until the deadline).
  auto fd = net::connect_socket(target.root, deadline.earlier(w.next_note_ns));
  while (!fd.ok() && !deadline.expired() && now_ns() >= w.next_note_ns) {
    w.note_if_due(deadline, "to reach the root");
    fd = net::connect_socket(target.root, deadline.earlier(w.next_note_ns));
  }
  if (!fd.ok()) {
    return fd.take_status().with_context(fmt::format(
        "bootstrap: rank {} cannot reach root {} after {} ms (is the process that called "
        "ncclGetUniqueId alive and reachable, and is CHORUS_SOCKET_IFNAME right?)",
        hello.rank, w.root, w.elapsed_ms()));
  }
  Secret session;
  Status st = auth_initiator(fd->get(), target.secret, kBootstrapContext, deadline, &session);
  if (!st.ok()) return st.with_context(fmt::format("bootstrap: rank {}", hello.rank));
  if (root0_secret != nullptr)
    hello.root0_secret_wrapped = wire::wrap_secret(*root0_secret, session);
  st = wire::write_frame(fd->get(), wire::FrameType::kHello, wire::encode_hello(hello), deadline);
  if (!st.ok()) return waiting_failed(w, std::move(st), deadline);
  CHORUS_INFO(kBootstrap, "rank {} joined root {} (communicator uid {:#x})", hello.rank, w.root,
              target.comm_uid);
  return receive_table(fd->get(), w, hello.nranks, hello.blob, deadline);
}

Status check_args(int rank, int nranks, std::string_view blob) {
  if (nranks < 1) return invalid_argument("bootstrap: nranks {} must be at least 1", nranks);
  if (rank < 0 || rank >= nranks) {
    return invalid_argument("bootstrap: rank {} out of range [0, {})", rank, nranks);
  }
  if (blob.size() > kMaxBlobBytes) {
    return invalid_argument("bootstrap: blob of {} bytes exceeds {} bytes", blob.size(),
                            kMaxBlobBytes);
  }
  return ok_status();
}

}  // namespace

Result<UniqueId> create_unique_id(int64_t timeout_ms) {
  CHORUS_ASSIGN_OR_RETURN(net::Interface itf, net::pick_interface());
  UniqueId id;
  CHORUS_ASSIGN_OR_RETURN(UniqueFd fd, net::listen_socket(itf.addr, &id.root));
  id.secret = Secret::random();
  while (id.comm_uid == 0) id.comm_uid = random_u64();
  if (timeout_ms <= 0) timeout_ms = params::kBootstrapTimeoutMs.get();
  CHORUS_RETURN_IF_ERROR(start_root_server(std::move(fd), id, timeout_ms));
  CHORUS_INFO(kBootstrap, "bootstrap root listening on {} ({}), communicator uid {:#x}",
              id.root.to_string(), itf.name, id.comm_uid);
  return id;
}

Status start_root_at(const UniqueId& id, int64_t timeout_ms) {
  auto fd = net::listen_socket(id.root, nullptr);
  if (!fd.ok())
    return Status(fd.status().code(),
                  fmt::format("bootstrap: rank 0 cannot listen on the rendezvous address {} ({}); "
                              "is it this host's, and the port free?",
                              id.root.to_string(), fd.status().message()));
  if (timeout_ms <= 0) timeout_ms = params::kBootstrapTimeoutMs.get();
  CHORUS_RETURN_IF_ERROR(start_root_server(std::move(*fd), id, timeout_ms));
  CHORUS_INFO(kBootstrap, "bootstrap root listening on {} (from the environment), communicator "
              "uid {:#x}", id.root.to_string(), id.comm_uid);
  return Status();
}

Result<std::vector<std::string>> exchange(const UniqueId& id, int rank, int nranks,
                                          std::string_view blob, Deadline deadline) {
  CHORUS_RETURN_IF_ERROR(check_args(rank, nranks, blob));
  wire::Hello hello;
  hello.rank = rank;
  hello.nranks = nranks;
  hello.comm_uid = id.comm_uid;
  hello.blob = blob;
  return run_rank(id, hello, nullptr, deadline);
}

Result<std::vector<std::string>> exchange_scalable(const std::vector<UniqueId>& ids, int rank,
                                                   int nranks, std::string_view blob,
                                                   Deadline deadline) {
  CHORUS_RETURN_IF_ERROR(check_args(rank, nranks, blob));
  if (ids.empty()) return invalid_argument("bootstrap: no ncclUniqueId given");
  if (ids.size() == 1) return exchange(ids[0], rank, nranks, blob, deadline);
  if (ids.size() > static_cast<size_t>(nranks)) {
    return invalid_argument("bootstrap: {} ncclUniqueIds for {} ranks (at most one per rank)",
                            ids.size(), nranks);
  }
  wire::Hello hello;
  hello.rank = rank;
  hello.nranks = nranks;
  hello.nroots = static_cast<uint32_t>(ids.size());
  hello.group = wire::group_of(rank, nranks, static_cast<int64_t>(ids.size()));
  hello.comm_uid = ids[hello.group].comm_uid;
  hello.root0 = ids[0].root;
  hello.root0_uid = ids[0].comm_uid;
  hello.blob = blob;
  return run_rank(ids[hello.group], hello, &ids[0].secret, deadline);
}

}  // namespace chorus::bootstrap
