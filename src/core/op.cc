// SPDX-License-Identifier: Apache-2.0
#include "core/op.h"

#include <fmt/format.h>

#include "core/comm.h"

namespace chorus {

void Op::summarize(OpSummary* out) const {
  out->bytes = bytes();
  out->ncalls = calls_.size();
  out->nsends = 0;
  if (is_host_fn()) {
    out->kind = OpSummary::Kind::kHostFn;
  } else if (is_internal() || outside_) {
    out->kind = OpSummary::Kind::kInternal;
    out->internal = internal_;
  } else {
    out->kind = p2p_batch_ ? OpSummary::Kind::kP2p : OpSummary::Kind::kCollective;
  }
  for (size_t i = 0; i < calls_.size(); ++i) {
    const CollCall& c = calls_[i];
    bool send = c.kind == CollKind::kSend;
    out->nsends += send ? 1 : 0;
    if (i < out->calls.size()) out->calls[i] = {c.tag, send ? c.root : c.tag.root, send};
  }
}

std::string Op::describe() const {
  OpSummary summary;
  summarize(&summary);
  return summary.describe(false);
}

std::string OpSummary::describe(bool detailed) const {
  switch (kind) {
    case Kind::kHostFn:
      return "host function";
    case Kind::kInternal:
      return internal;
    case Kind::kCollective:
      return describe_tag(calls[0].tag);
    case Kind::kP2p:
      break;
  }
  std::string text = fmt::format("group of {} sends and {} receives", nsends, ncalls - nsends);
  if (!detailed) return text;
  text += ":";
  for (size_t i = 0; i < ncalls && i < calls.size(); ++i) {
    const Call& c = calls[i];
    text += fmt::format(" {} {} #{} ({} x {})", c.send ? "send to" : "receive from", c.peer,
                        c.tag.seq, c.tag.count, datatype_name(static_cast<DataType>(c.tag.dtype)));
  }
  if (ncalls > calls.size()) text += fmt::format(" ... ({} more)", ncalls - calls.size());
  return text;
}

size_t Op::bytes() const {
  size_t total = 0;
  for (const auto& c : calls_) total += c.count * datatype_size(c.dtype);
  return total;
}

Op::~Op() {
  std::vector<std::shared_ptr<Op>> release = std::move(deps_);
  while (!release.empty()) {
    std::shared_ptr<Op> d = std::move(release.back());
    release.pop_back();
    // The last owner takes its deps before it goes; one that others still own is theirs to free.
    if (d.use_count() == 1) {
      for (auto& dd : d->deps_) release.push_back(std::move(dd));
      d->deps_.clear();
    }
  }
}

bool Op::deps_done() const {
  for (const auto& d : deps_)
    if (!d->done()) return false;
  return true;
}

Status Op::deps_status() const {
  for (const auto& d : deps_)
    if (d->done() && !d->status().ok()) return d->status();
  return Status();
}

void Op::complete(Status status) {
  status_ = std::move(status);
  done_.store(1, std::memory_order_release);
}

OpContext::OpContext(Comm& comm, const MsgTag& tag, Op* op)
    : comm_(comm),
      root_(this),
      pinned_(op != nullptr && !op->pins.empty() ? op : nullptr),
      rank_(comm.rank()),
      nranks_(comm.nranks()),
      channels_(comm.channels()),
      tag_(tag) {}

OpContext::OpContext(OpContext& parent, std::vector<int> members)
    : comm_(parent.comm_),
      root_(parent.root_),
      pinned_(parent.pinned_),
      rank_(-1),
      nranks_(static_cast<int>(members.size())),
      channels_(parent.channels_),
      tag_(parent.tag_) {
  for (int& m : members) {
    m = parent.comm_rank(m);
    if (m == comm_.rank()) rank_ = static_cast<int>(&m - members.data());
  }
  members_ = std::move(members);
}

void OpContext::post(Request& req, int peer, size_t bytes, const MsgTag& tag) {
  req.peer = peer;
  req.bytes = bytes;
  req.tag = tag;
  req.key = nullptr;
}

const RegistrationKey* OpContext::key_for(const void* p, size_t bytes, int peer) {
  if (bytes == 0 || pinned_->pin_keys.empty()) return nullptr;
  const int slot = comm_.key_slot(peer);
  if (slot < 0) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  std::vector<RegistrationPin>& pins = pinned_->pins;
  for (size_t i = 0; i < pins.size(); ++i) {
    const RegisteredRange& range = pins[i].range();
    const auto base = reinterpret_cast<uintptr_t>(range.base);
    if (begin < base || begin - base > range.bytes || bytes > range.bytes - (begin - base))
      continue;
    Op::PinKey& k = pinned_->pin_keys[i * static_cast<size_t>(comm_.key_slots()) + slot];
    if (!k.looked_up) {
      k.looked_up = true;
      Result<RegistrationKey*> key = pins[i].key(slot);
      if (key.ok()) {
        k.key = *key;
      } else {
        comm_.note_key_error(key.status());
      }
    }
    return k.key;
  }
  return nullptr;
}

void OpContext::name_message(Request& req, int peer, int channel, bool send) {
  // A send or receive call is its own message: its per-pair sequence number names it, however
  // the calls are grouped on either side.
  if (req.tag.coll == static_cast<uint8_t>(CollKind::kSendRecv)) {
    req.tag.set_message(static_cast<uint32_t>(channel), 0);
    return;
  }
  OpContext& root = *root_;
  if (root.ordinal_count_ == 0) {
    root.ordinal_count_ = static_cast<size_t>(2 * comm_.nranks() * channels_);
    if (root.ordinal_count_ <= kInlineOrdinals) {
      root.ordinals_inline_.fill(0);
    } else {
      root.ordinals_heap_.assign(root.ordinal_count_, 0);
    }
  }
  uint8_t* ordinals = root.ordinal_count_ <= kInlineOrdinals ? root.ordinals_inline_.data()
                                                             : root.ordinals_heap_.data();
  uint8_t& ordinal = ordinals[2 * (static_cast<size_t>(peer) * channels_ + channel) + (send ? 1 : 0)];
  req.tag.set_message(static_cast<uint32_t>(channel), ordinal++);
}

void OpContext::send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes) {
  send(req, peer, channel, buf, bytes, bytes);
}

void OpContext::recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes) {
  recv(req, peer, channel, dst, bytes, bytes);
}

void OpContext::send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes,
                     size_t data_bytes) {
  peer = comm_rank(peer);
  post_send(req, peer, channel, buf, bytes, tag_);
  comm_.count_bytes(peer, true, bytes, data_bytes);
}

void OpContext::recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes,
                     size_t data_bytes) {
  peer = comm_rank(peer);
  post_recv(req, peer, channel, dst, bytes, tag_);
  comm_.count_bytes(peer, false, bytes, data_bytes);
}

void OpContext::send_tagged(SendRequest& req, int peer, int channel, const void* buf,
                            size_t bytes, const MsgTag& tag) {
  peer = comm_rank(peer);
  post_send(req, peer, channel, buf, bytes, tag);
  comm_.count_bytes(peer, true, bytes, bytes);
}

void OpContext::post_send(SendRequest& req, int peer, int channel, const void* buf, size_t bytes,
                          const MsgTag& tag) {
  post(req, peer, bytes, tag);
  name_message(req, peer, channel, true);
  req.buf = buf;
  req.memfd = MemfdLocation{};
  if (pinned_ != nullptr) {
    const auto begin = reinterpret_cast<uintptr_t>(buf);
    for (const SharedRange& r : pinned_->shared) {
      if (begin < r.begin || begin + bytes > r.end) continue;
      req.memfd = r.memfd;
      req.memfd.offset += begin - r.begin;
      break;
    }
    req.key = key_for(buf, bytes, peer);
  }
  PeerLink* link = comm_.link(peer);
  link->post_send(&req);
  comm_.activate(link);
}

void OpContext::recv_tagged(RecvRequest& req, int peer, int channel, void* dst, size_t bytes,
                            const MsgTag& tag) {
  peer = comm_rank(peer);
  post_recv(req, peer, channel, dst, bytes, tag);
  comm_.count_bytes(peer, false, bytes, bytes);
}

void OpContext::post_recv(RecvRequest& req, int peer, int channel, void* dst, size_t bytes,
                          const MsgTag& tag) {
  post(req, peer, bytes, tag);
  name_message(req, peer, channel, false);
  req.dst = dst;
  req.reduce = nullptr;
  if (pinned_ != nullptr) req.key = key_for(dst, bytes, peer);
  PeerLink* link = comm_.link(peer);
  link->post_recv(&req);
  comm_.activate(link);
}

void OpContext::recv_reduce(RecvRequest& req, int peer, int channel, void* dst, const void* src,
                            size_t bytes, kernels::ReduceFn fn, size_t elem_size) {
  peer = comm_rank(peer);
  post(req, peer, bytes, tag_);
  comm_.count_bytes(peer, false, bytes, bytes);
  name_message(req, peer, channel, false);
  req.dst = dst;
  req.src = src;
  req.reduce = kernels::reduce_for_output(fn, bytes);
  req.elem_size = elem_size;
  if (pinned_ != nullptr) req.key = key_for(dst, bytes, peer);
  PeerLink* link = comm_.link(peer);
  link->post_recv(&req);
  comm_.activate(link);
}

Status OpContext::check(const Request& req) const {
  if (!req.failed()) return Status();
  for (int ch = 0; ch < channels_; ++ch) {
    Connection* conn = comm_.conn(req.peer, ch);
    if (conn != nullptr && !conn->error().ok()) return conn->error();
  }
  if (PeerLink* link = comm_.link(req.peer); link != nullptr && !link->error().ok())
    return link->error();
  if (comm_.aborting()) return remote_error("{} was aborted", comm_.describe());
  return remote_error("a transfer with {} failed", comm_.peer(req.peer).describe());
}

void* OpContext::scratch(int slot, size_t bytes) { return comm_.scratch(slot, bytes); }

}  // namespace chorus
