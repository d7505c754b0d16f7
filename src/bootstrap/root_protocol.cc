// SPDX-License-Identifier: Apache-2.0
// File: src/bootstrap/root_protocol.cc
// What the root server does with each frame: HELLO from ranks, FORWARD/ENTRY from group roots
// (at root 0), and the upstream link of a group root to root 0.
#include <algorithm>
#include <cerrno>

#include "bootstrap/root_server.h"
#include "common/log.h"

namespace chorus::bootstrap::detail {

namespace {

constexpr int64_t kMaxRanks = int64_t{1} << 20;

std::string table_header(uint32_t nranks) {
  wire::Writer w;
  w.u32(nranks);
  return w.take();
}

// "3, 5-9, 12" (at most `limit` items).
std::string format_ranks(const std::vector<int>& ranks, size_t limit = 24) {
  std::string text;
  size_t items = 0;
  for (size_t i = 0; i < ranks.size(); ++items) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (items == limit) {
      text += fmt::format(", ... ({} more)", ranks.size() - i);
      break;
    }
    if (!text.empty()) text += ", ";
    text += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace

Status RootServer::handle_frame(Peer& p) {
  const wire::FrameHeader& h = p.reader.header();
  std::string_view payload = p.reader.payload();
  if (p.role == Role::kUpstream) return on_upstream_frame(p);
  if (p.role == Role::kAuthed && h.type == wire::FrameType::kHello) return on_hello(p, payload);
  if (p.role == Role::kAuthed && h.type == wire::FrameType::kForward) return on_forward(p, payload);
  if (p.role == Role::kForwarder && h.type == wire::FrameType::kEntry && p.forward_left > 0) {
    return on_forward_entry(p, payload);
  }
  return remote_error("unexpected {} frame", wire::frame_type_name(h.type));
}

Status RootServer::configure(int64_t nranks, int64_t nroots, uint32_t group, const char* what) {
  if (nranks < 1 || nranks > kMaxRanks) {
    return invalid_argument("{} announces {} ranks (must be 1..{})", what, nranks, kMaxRanks);
  }
  if (nroots < 1 || nroots > nranks || group >= nroots) {
    return invalid_argument("{} announces {} roots and group {} for {} ranks", what, nroots, group,
                            nranks);
  }
  if (nranks_ == 0) {
    nranks_ = static_cast<int>(nranks);
    nroots_ = static_cast<uint32_t>(nroots);
    group_ = group;
    bool collects_all = nroots_ == 1 || group_ == 0;
    expected_ = collects_all ? nranks_
                             : static_cast<int>(wire::group_first(group + 1, nranks, nroots) -
                                                wire::group_first(group, nranks, nroots));
    blobs_.resize(nranks_);
    have_.assign(nranks_, 0);
    forwarded_groups_.assign(nroots_, 0);
    CHORUS_INFO(kBootstrap, "{}: communicator of {} ranks, {} root(s), this root serves group {}",
                name_, nranks_, nroots_, group_);
    return ok_status();
  }
  if (nranks != nranks_ || nroots != nroots_) {
    return invalid_argument(
        "{} announces {} ranks and {} roots but the ranks that joined before "
        "announced {} ranks and {} roots",
        what, nranks, nroots, nranks_, nroots_);
  }
  if (group != group_) {
    return invalid_argument(
        "{} is for group {} but this root serves group {} (ranks were given "
        "different lists of ncclUniqueIds?)",
        what, group, group_);
  }
  return ok_status();
}

// Checks that depend only on the HELLO come first, so that a rejected HELLO never configures
// the root (a stray or misconfigured client cannot change nranks for the others).
Status RootServer::on_hello(Peer& p, std::string_view payload) {
  wire::Hello h;
  CHORUS_RETURN_IF_ERROR(wire::decode_hello(payload, &h));
  Status st;
  if (h.comm_uid != id_.comm_uid) {
    st = invalid_argument("it presented communicator uid {:#x}, this root serves {:#x}", h.comm_uid,
                          id_.comm_uid);
  } else if (h.rank < 0 || h.rank >= h.nranks) {
    st = invalid_argument("rank {} is out of range for {} ranks", h.rank, h.nranks);
  } else if (h.nroots < 1 || h.nroots > static_cast<uint32_t>(h.nranks) ||
             wire::group_of(h.rank, h.nranks, h.nroots) != h.group) {
    st = invalid_argument("rank {} of {} does not belong to group {} of {}", h.rank, h.nranks,
                          h.group, h.nroots);
  } else if (h.nroots > 1 && h.group == 0 && h.root0_uid != id_.comm_uid) {
    st = invalid_argument("its ncclUniqueId list starts with another communicator's id");
  }
  if (st.ok()) st = configure(h.nranks, h.nroots, h.group, "its HELLO");
  if (st.ok() && have_[h.rank] != 0) {
    st = invalid_argument("rank {} already joined: two processes use the same rank", h.rank);
  }
  if (st.ok() && nroots_ > 1 && group_ != 0) {
    Secret secret = wire::wrap_secret(h.root0_secret_wrapped, p.session_key);
    if (root0_uid_ == 0) {
      root0_ = h.root0;
      root0_uid_ = h.root0_uid;
      root0_secret_ = secret;
    } else if (!(root0_ == h.root0) || root0_uid_ != h.root0_uid || !(root0_secret_ == secret)) {
      st = invalid_argument("its first ncclUniqueId differs from the one earlier ranks gave");
    }
  }
  if (!st.ok()) {
    reject(p, fmt::format("rank {} ({}): {}", h.rank, p.addr, st.message()));
    return ok_status();
  }
  p.role = Role::kRank;
  p.rank = h.rank;
  add_blob(h.rank, h.blob);
  CHORUS_INFO(kBootstrap, "{}: rank {} joined from {} ({} of {})", name_, h.rank, p.addr, joined_,
              expected_);
  wire::append_frame(&p.out, wire::FrameType::kProgress, wire::encode_pair(joined_, expected_));
  if (joined_ == expected_) on_collected();
  return ok_status();
}

Status RootServer::on_forward(Peer& p, std::string_view payload) {
  wire::Forward f;
  CHORUS_RETURN_IF_ERROR(wire::decode_forward(payload, &f));
  Status st;
  if (f.comm_uid != id_.comm_uid) {
    st = invalid_argument("FORWARD for communicator uid {:#x}, this root serves {:#x}", f.comm_uid,
                          id_.comm_uid);
  } else if (f.nranks < 1 || f.nranks > kMaxRanks || f.nroots > f.nranks || f.group == 0 ||
             f.group >= f.nroots) {
    // nranks is bounded before group_first() multiplies it by a group number.
    st = invalid_argument("FORWARD from group {} of {} for {} ranks", f.group, f.nroots, f.nranks);
  } else {
    int64_t size = wire::group_first(f.group + 1, f.nranks, f.nroots) -
                   wire::group_first(f.group, f.nranks, f.nroots);
    if (f.count != size)
      st = invalid_argument("group {} has {} ranks, not {}", f.group, size, f.count);
  }
  if (st.ok()) st = configure(f.nranks, f.nroots, 0, "its FORWARD");
  if (st.ok() && forwarded_groups_[f.group] != 0) {
    st = invalid_argument("group {} was already forwarded", f.group);
  }
  if (!st.ok()) {
    reject(p, fmt::format("the root of a group ({}): {}", p.addr, st.message()));
    return ok_status();
  }
  forwarded_groups_[f.group] = 1;
  p.role = Role::kForwarder;
  p.group = f.group;
  p.forward_left = f.count;
  CHORUS_INFO(kBootstrap, "{}: the root of group {} ({}) forwards {} ranks", name_, f.group, p.addr,
              f.count);
  return ok_status();
}

Status RootServer::on_forward_entry(Peer& p, std::string_view payload) {
  uint32_t rank = 0;
  std::string_view blob;
  CHORUS_RETURN_IF_ERROR(wire::decode_entry(payload, &rank, &blob));
  if (rank >= static_cast<uint32_t>(nranks_) || wire::group_of(rank, nranks_, nroots_) != p.group ||
      have_[rank] != 0) {
    return remote_error("forwarded rank {} is not an expected member of group {}", rank, p.group);
  }
  add_blob(static_cast<int>(rank), blob);
  --p.forward_left;
  if (joined_ == expected_) on_collected();
  return ok_status();
}

void RootServer::add_blob(int rank, std::string_view blob) {
  blobs_[rank].assign(blob);
  have_[rank] = 1;
  ++joined_;
}

void RootServer::on_collected() {
  if (nroots_ > 1 && group_ != 0) {
    start_upstream();
  } else {
    build_table();
  }
}

void RootServer::build_table() {
  size_t total = wire::kHeaderBytes + 4;
  for (const auto& b : blobs_) total += wire::kHeaderBytes + 8 + b.size();
  table_wire_.reserve(total);
  wire::append_frame(&table_wire_, wire::FrameType::kTable, table_header(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    wire::append_frame(&table_wire_, wire::FrameType::kEntry, wire::encode_entry(r, blobs_[r]));
  }
  std::vector<std::string>().swap(blobs_);
  table_ready_ = true;
  for (auto& p : peers_) {
    if (!p->dead && (p->role == Role::kRank || p->role == Role::kForwarder)) p->wants_table = true;
  }
  CHORUS_INFO(kBootstrap, "{}: all {} ranks joined; sending the table ({} bytes)", name_, nranks_,
              table_wire_.size());
}

void RootServer::start_upstream() {
  auto up = std::make_unique<Peer>();
  up->role = Role::kUpstream;
  up->addr = root0_.to_string();
  int64_t first = wire::group_first(group_, nranks_, nroots_);
  wire::Forward f{static_cast<uint32_t>(nranks_), nroots_, group_, root0_uid_,
                  static_cast<uint32_t>(expected_)};
  wire::append_frame(&up->out, wire::FrameType::kForward, wire::encode_forward(f));
  for (int64_t r = first; r < first + expected_; ++r) {
    wire::append_frame(&up->out, wire::FrameType::kEntry,
                       wire::encode_entry(static_cast<uint32_t>(r), blobs_[r]));
  }
  CHORUS_INFO(kBootstrap, "{}: all {} ranks of group {} joined; forwarding to root 0 ({})", name_,
              expected_, group_, up->addr);
  Peer& ref = *up;
  peers_.push_back(std::move(up));
  Status st = advance_upstream(ref, 0);
  if (!st.ok()) drop(ref, st);
}

// Connect (retrying refusals: root 0 may be slow to come up), authenticate with root 0's
// secret, send FORWARD + ENTRY frames, then read the table.
Status RootServer::advance_upstream(Peer& p, short revents) {
  for (;;) {
    int err = 0;
    switch (p.link) {
      case Peer::Link::kWaitRetry: {
        if (now_ns() < p.retry_at_ns) return ok_status();
        CHORUS_ASSIGN_OR_RETURN(p.fd, net::connect_start(root0_, &err));
        if (err == EINPROGRESS) {
          p.link = Peer::Link::kConnecting;
          return ok_status();
        }
        break;
      }
      case Peer::Link::kConnecting:
        if (revents == 0) return ok_status();
        err = net::connect_error(p.fd.get());
        break;
      case Peer::Link::kHandshake: {
        CHORUS_ASSIGN_OR_RETURN(short events, p.hs->advance(p.fd.get()));
        p.hs_events = events;
        if (events != 0) return ok_status();
        p.hs.reset();
        p.link = Peer::Link::kReady;
        continue;
      }
      case Peer::Link::kReady:
        CHORUS_RETURN_IF_ERROR(flush(p));
        return read_frames(p);
    }
    // A connect attempt ended with `err`.
    if (err == 0) {
      net::set_nodelay(p.fd.get());
      p.hs = std::make_unique<Handshake>(Handshake::Role::kInitiator, root0_secret_,
                                         kBootstrapContext, p.addr);
      p.link = Peer::Link::kHandshake;
      continue;
    }
    if (!net::connect_retryable(err)) return system_error(err, "connect()");
    p.fd.reset();
    p.link = Peer::Link::kWaitRetry;
    p.retry_at_ns = now_ns() + int64_t{p.backoff_ms} * 1000000;
    p.backoff_ms = std::min(p.backoff_ms * 2, 500);
    return ok_status();
  }
}

Status RootServer::on_upstream_frame(Peer& p) {
  const wire::FrameHeader& h = p.reader.header();
  std::string_view payload = p.reader.payload();
  if (h.type == wire::FrameType::kError) {
    return remote_error("root 0 reported: {}", payload.substr(0, wire::kMaxErrorBytes));
  }
  if (h.type == wire::FrameType::kProgress) return ok_status();
  if (h.type == wire::FrameType::kTable && !p.got_table_header) {
    wire::Reader r(payload);
    uint32_t n = r.u32();
    if (!r.ok() || r.remaining() != 0 || n != static_cast<uint32_t>(nranks_)) {
      return remote_error("root 0 sent a table of {} ranks, expected {}", n, nranks_);
    }
    p.got_table_header = true;
    return ok_status();
  }
  if (h.type != wire::FrameType::kEntry || !p.got_table_header) {
    return remote_error("unexpected {} frame from root 0", wire::frame_type_name(h.type));
  }
  uint32_t rank = 0;
  std::string_view blob;
  CHORUS_RETURN_IF_ERROR(wire::decode_entry(payload, &rank, &blob));
  if (rank >= static_cast<uint32_t>(nranks_) || have_[rank] == 2) {
    return remote_error("root 0 sent rank {} twice or out of range", rank);
  }
  if (have_[rank] == 1 && blobs_[rank] != blob) {
    return remote_error("root 0 sent a different blob for rank {} of this group", rank);
  }
  if (have_[rank] == 0) blobs_[rank].assign(blob);
  have_[rank] = 2;
  if (++p.table_entries == nranks_) {
    p.dead = true;
    p.fd.reset();
    build_table();
  }
  return ok_status();
}

void RootServer::broadcast_progress() {
  if (table_ready_ || joined_ == last_progress_joined_) return;
  last_progress_joined_ = joined_;
  std::string frame;
  wire::append_frame(&frame, wire::FrameType::kProgress, wire::encode_pair(joined_, expected_));
  for (auto& p : peers_) {
    if (!p->dead && p->role == Role::kRank) p->out += frame;
  }
}

std::string RootServer::missing_ranks() const {
  if (nranks_ == 0) return "no rank ever joined";
  if (joined_ == expected_) {
    if (nroots_ > 1 && group_ != 0) {
      return fmt::format("all {} ranks of group {} joined but root 0 ({}) never sent the table",
                         expected_, group_, root0_.to_string());
    }
    return fmt::format("all {} ranks joined but not all received the table", expected_);
  }
  std::vector<int> missing;
  for (int r = 0; r < nranks_; ++r) {
    bool mine = nroots_ == 1 || group_ == 0 || wire::group_of(r, nranks_, nroots_) == group_;
    if (mine && have_[r] == 0) missing.push_back(r);
  }
  return fmt::format("{} of {} ranks joined; never joined: {}", joined_, expected_,
                     format_ranks(missing));
}

}  // namespace chorus::bootstrap::detail
