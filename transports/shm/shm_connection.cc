// SPDX-License-Identifier: Apache-2.0
// File: transports/shm/shm_connection.cc
// The FIFO protocol: the producer copies messages into the peer's ring and publishes head, the
// consumer copies (or reduces) out of its own ring and publishes tail. See README.md.
#include "transports/shm/shm_connection.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/log.h"
#include "common/params.h"
#include "common/process.h"
#include "common/unique_fd.h"
#include "kernels/reduce/reduce.h"

namespace chorus::shm {

namespace {

// Progress is published at least this often so that a large message pipelines through the FIFO
// (the consumer drains the first piece while the producer writes the next).
constexpr uint64_t kPublishBytesMax = 256 << 10;
// Larger messages are rejected so that stream arithmetic cannot overflow.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 62;
// A message by reference is read in pieces of at most this many bytes per progress() call, and
// a reducing receive stages them in a bounce buffer of this size (it stays in cache).
constexpr uint64_t kReferencePiece = 256 << 10;

constexpr uint64_t round_up(uint64_t bytes) { return (bytes + kFifoAlign - 1) & ~(kFifoAlign - 1); }

uint64_t publish_bytes_for(uint64_t fifo_bytes) {
  uint64_t quarter = (fifo_bytes / 4) & ~(kFifoAlign - 1);
  return std::clamp<uint64_t>(quarter, kFifoAlign, kPublishBytesMax);
}

}  // namespace

ShmConnection::ShmConnection(ShmConnectionConfig config)
    : Connection(config.peer_rank, config.channel),
      self_rank_(config.self_rank),
      peer_pid_(config.peer_pid),
      send_(config.send_fifo),
      recv_(config.recv_fifo),
      peer_doorbell_(config.peer_doorbell),
      keep_alive_(std::move(config.keep_alive)),
      publish_bytes_(publish_bytes_for(config.send_fifo.fifo_bytes)),
      box_(config.send_box != nullptr && config.recv_box != nullptr
               ? std::make_unique<SmallBox>(config.send_box, config.recv_box, config.peer_doorbell,
                                            config.self_rank, config.peer_rank)
               : nullptr),
      cma_min_bytes_(static_cast<uint64_t>(params::kShmCmaBytes.get())),
      map_min_bytes_(static_cast<uint64_t>(params::kShmMapBytes.get())),
      stream_min_bytes_(kernels::stream_copy_min_bytes()),
      probe_word_(random_u64() | 1) {
  // Publish where the consumer can find a known word of ours, to test process_vm_readv.
  send_.control->probe_value = probe_word_;
  send_.control->probe_addr.store(reinterpret_cast<uint64_t>(&probe_word_), std::memory_order_release);
}

ShmConnection::~ShmConnection() {
  // Requests still pending can never complete: fail them rather than leave their owners waiting.
  sends_.fail_all();
  by_reference_.fail_all();
  recvs_.fail_all();
  close();
}

void ShmConnection::close() {
  if (closed_) return;
  closed_ = true;
  flush_head();
  // Release: pairs with the peer's acquire load of the flag, after which it re-reads head and
  // so sees everything we published before closing.
  send_.control->producer_closed.store(1, std::memory_order_release);
  recv_.control->consumer_closed.store(1, std::memory_order_release);
  if (box_) box_->close();
  ring_doorbell(peer_doorbell_);
}

void ShmConnection::post_send(SendRequest* req) {
  if (error().ok() && (req->bytes > kMaxMessageBytes || (req->bytes > 0 && req->buf == nullptr))) {
    fail_all(internal_error("send of {} ({} bytes) to rank {}: no buffer or too large",
                            describe_tag(req->tag), req->bytes, peer()));
  }
  if (!error().ok()) {
    req->fail();
    return;
  }
  sends_.push(req);
}

void ShmConnection::post_recv(RecvRequest* req) {
  if (error().ok()) {
    Status status = check_recv_request(*req);
    if (!status.ok()) fail_all(std::move(status));
  }
  if (!error().ok()) {
    req->fail();
    return;
  }
  recvs_.push(req);
}

Status ShmConnection::check_recv_request(const RecvRequest& req) const {
  if (Status st = check_reducing_receive(req, peer()); !st.ok()) return st;
  bool bad = req.bytes > kMaxMessageBytes || (req.bytes > 0 && req.dst == nullptr);
  if (req.reduce != nullptr) {
    // Elements must divide kFifoAlign so that none straddles the end of the ring (whole
    // elements of a known size: check_reducing_receive above).
    size_t e = req.elem_size;
    bool elem_ok = e <= kFifoAlign && (e & (e - 1)) == 0;
    bad = bad || !elem_ok || (req.bytes > 0 && req.src == nullptr);
  }
  if (!bad) return Status();
  return internal_error("receive of {} ({} bytes, element size {}) from rank {}: malformed request",
                        describe_tag(req.tag), req.bytes, req.elem_size, peer());
}

bool ShmConnection::progress() {
  if (!error().ok()) return false;
  if (recv_.control->cma_state.load(std::memory_order_relaxed) == kCmaUnknown) probe_cma();
  // Receives first: freeing space in our ring lets the peer's sends move on.
  bool changed = progress_recvs();
  // Sends the consumer finished reading complete even if it has closed since.
  changed = complete_by_reference_sends() || changed;
  if (error().ok() && (!sends_.empty() || !by_reference_.empty()) && !check_consumer_closed()) {
    if (!sends_.empty()) changed = progress_sends() || changed;
  }
  // Only when stuck: the producer may have closed after publishing what we still consume.
  if (error().ok() && !changed && !recvs_.empty()) changed = check_producer_closed();
  return changed || !error().ok();
}

bool ShmConnection::progress_sends() {
  const uint64_t start = send_pos_;
  bool completed = false;
  uint64_t budget = send_.fifo_bytes;
  while (!sends_.empty() && error().ok()) {
    SendRequest* req = sends_.front();
    if (!write_front(req, &budget)) break;
    // Published before complete(): whoever sees the send done may rely on the data being out.
    publish_head();
    if (send_by_reference_) {
      by_reference_.push(req);  // completes when the consumer has read it
    } else {
      req->complete();
    }
    sends_.pop();
    send_cursor_ = 0;
    ++send_index_;
    completed = true;
  }
  if (error().ok()) flush_head();
  return completed || send_pos_ != start;
}

bool ShmConnection::write_front(SendRequest* req, uint64_t* budget) {
  const uint64_t fifo = send_.fifo_bytes;
  if (send_cursor_ == 0) {
    if (*budget < kFifoAlign || send_space(kFifoAlign) < kFifoAlign) return false;
    const bool mapped = by_mapping(*req);
    send_by_reference_ = mapped || by_reference(*req);
    MsgHeader header{};
    header.magic = kMsgMagic;
    header.index = send_index_;
    header.tag = req->tag;
    header.bytes = req->bytes;
    if (mapped) {
      header.flags = kByReference | kByMapping;
      header.reserved = static_cast<uint32_t>(req->memfd.fd);
      header.mapped.offset = req->memfd.offset;
      header.mapped.inode = req->memfd.inode;
    } else if (send_by_reference_) {
      header.flags = kByReference;
      header.address = reinterpret_cast<uint64_t>(req->buf);
    } else if (req->bytes <= kInlineBytes) {
      header.flags = kInline;
      if (req->bytes > 0) std::memcpy(header.inline_payload, req->buf, req->bytes);
      req->bytes_done.store(req->bytes, std::memory_order_relaxed);
    }
    send_inline_ = (header.flags & kInline) != 0;
    // send_pos_ is kFifoAlign-aligned and so is fifo: the header never wraps.
    std::memcpy(send_.data + send_pos_ % fifo, &header, sizeof(header));
    send_pos_ += kFifoAlign;
    send_cursor_ = kFifoAlign;
    *budget -= kFifoAlign;
  }
  const uint64_t total =
      kFifoAlign + (send_by_reference_ || send_inline_ ? 0 : round_up(req->bytes));
  const auto* src = static_cast<const std::byte*>(req->buf);
  while (send_cursor_ < total) {
    if (send_pos_ - head_published_ >= publish_bytes_) flush_head();
    const uint64_t off = send_pos_ % fifo;
    const uint64_t piece = publish_bytes_ - (send_pos_ - head_published_);
    // Every term is a multiple of kFifoAlign, so positions stay aligned; the last piece of a
    // message includes its padding.
    uint64_t n = std::min({total - send_cursor_, fifo - off, *budget, piece});
    if (n > 0) n = std::min(n, send_space(n));
    if (n == 0) return false;
    const uint64_t payload_off = send_cursor_ - kFifoAlign;  // < req->bytes
    const uint64_t len = std::min<uint64_t>(n, req->bytes - payload_off);
    // An ordinary copy: the consumer reads these bytes next, from the cache.
    std::memcpy(send_.data + off, src + payload_off, len);
    send_pos_ += n;
    send_cursor_ += n;
    *budget -= n;
    req->bytes_done.store(payload_off + len, std::memory_order_relaxed);
  }
  return true;
}

bool ShmConnection::progress_recvs() {
  const uint64_t start = recv_pos_;
  const uint64_t ref_start = ref_done_;  // a read by reference moves no FIFO position
  bool completed = false;
  uint64_t budget = recv_.fifo_bytes;
  while (!recvs_.empty() && error().ok()) {
    RecvRequest* req = recvs_.front();
    if (!read_front(req, &budget)) break;
    req->complete();
    recvs_.pop();
    recv_cursor_ = 0;
    ++recv_index_;
    completed = true;
  }
  if (error().ok()) flush_tail();
  return completed || recv_pos_ != start || ref_done_ != ref_start;
}

bool ShmConnection::peek(MsgTag* tag, uint64_t* bytes) {
  if (!error().ok() || !recvs_.empty() || !peer_closed().ok()) return false;
  if (recv_available(kFifoAlign) < kFifoAlign) {
    // Acquire, then a fresh look at head: what the producer published before closing counts.
    if (recv_.control->producer_closed.load(std::memory_order_acquire) == 0 ||
        recv_available(kFifoAlign) >= kFifoAlign) {
      return false;
    }
    // Between messages: what it sent on its other channels may still be unread there
    // (transport.h, peer_closed()). A receive posted here fails when it finds the ring closed.
    set_peer_closed(remote_error("rank {} (pid {}) closed its shared-memory connection "
                                 "(channel {}) while rank {} waits for its next message",
                                 peer(), peer_pid_, channel(), self_rank_));
    return false;
  }
  MsgHeader header;
  std::memcpy(&header, recv_.data + recv_pos_ % recv_.fifo_bytes, sizeof(header));
  if (header.magic == kMsgMagic && header.index == recv_index_ && (header.flags & kFarewell)) {
    read_farewell(header, nullptr);
    return false;
  }
  if (Status status = check_framing(header); !status.ok()) {
    fail_all(std::move(status));
    return false;
  }
  *tag = header.tag;
  *bytes = header.bytes;
  return true;
}

bool ShmConnection::read_front(RecvRequest* req, uint64_t* budget) {
  const uint64_t fifo = recv_.fifo_bytes;
  if (recv_cursor_ == 0) {
    if (*budget < kFifoAlign || recv_available(kFifoAlign) < kFifoAlign) return false;
    MsgHeader header;
    std::memcpy(&header, recv_.data + recv_pos_ % fifo, sizeof(header));
    if (header.magic == kMsgMagic && header.index == recv_index_ && (header.flags & kFarewell)) {
      read_farewell(header, req);
      return false;
    }
    Status status = check_header(header, req);
    if (!status.ok()) {
      fail_all(std::move(status));
      return false;
    }
    recv_pos_ += kFifoAlign;
    recv_cursor_ = kFifoAlign;
    *budget -= kFifoAlign;
    recv_by_reference_ = (header.flags & kByReference) != 0;
    recv_by_mapping_ = (header.flags & kByMapping) != 0;
    ref_address_ = recv_by_mapping_ ? header.mapped.offset : header.address;
    ref_fd_ = static_cast<int>(header.reserved);
    ref_inode_ = header.mapped.inode;
    ref_view_ = nullptr;
    ref_done_ = 0;
    if ((header.flags & kInline) != 0) {
      // check_header bounded bytes to kInlineBytes and made it req->bytes.
      if (req->bytes == 0) return true;
      if (req->reduce != nullptr) {
        req->reduce(req->dst, req->src, header.inline_payload, req->bytes / req->elem_size);
      } else {
        std::memcpy(req->dst, header.inline_payload, req->bytes);
      }
      req->bytes_done.store(req->bytes, std::memory_order_relaxed);
      return true;
    }
  }
  if (recv_by_mapping_) return read_by_mapping(req, budget);
  if (recv_by_reference_) return read_by_reference(req, budget);
  const uint64_t total = kFifoAlign + round_up(req->bytes);
  auto* dst = static_cast<std::byte*>(req->dst);
  const auto* src = static_cast<const std::byte*>(req->src);
  while (recv_cursor_ < total) {
    if (recv_pos_ - tail_published_ >= publish_bytes_) flush_tail();
    const uint64_t off = recv_pos_ % fifo;
    const uint64_t piece = publish_bytes_ - (recv_pos_ - tail_published_);
    uint64_t n = std::min({total - recv_cursor_, fifo - off, *budget, piece});
    if (n > 0) n = std::min(n, recv_available(n));
    if (n == 0) return false;
    const uint64_t payload_off = recv_cursor_ - kFifoAlign;
    // A multiple of elem_size: n is a multiple of kFifoAlign, or this is the payload's end.
    const uint64_t len = std::min<uint64_t>(n, req->bytes - payload_off);
    const std::byte* ring = recv_.data + off;
    if (req->reduce != nullptr) {
      req->reduce(dst + payload_off, src + payload_off, ring, len / req->elem_size);
    } else {
      if (req->bytes >= stream_min_bytes_) {
        kernels::stream_copy_fn()(dst + payload_off, ring, len);
      } else {
        std::memcpy(dst + payload_off, ring, len);
      }
    }
    recv_pos_ += n;
    recv_cursor_ += n;
    *budget -= n;
    req->bytes_done.store(payload_off + len, std::memory_order_relaxed);
  }
  return true;
}

bool ShmConnection::by_reference(const SendRequest& req) {
  return cma_min_bytes_ > 0 && req.bytes >= cma_min_bytes_ &&
         send_.control->cma_state.load(std::memory_order_acquire) == kCmaWorks;
}

void ShmConnection::probe_cma() {
  // Acquire: pairs with the producer's release store, so probe_value is visible.
  uint64_t addr = recv_.control->probe_addr.load(std::memory_order_acquire);
  if (addr == 0) return;  // the producer's connection is not there yet
  uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(value)};
  ssize_t n = process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
  bool works = n == static_cast<ssize_t>(sizeof(value)) && value == recv_.control->probe_value;
  if (!works) {
    CHORUS_INFO(kShm, "rank {} cannot read the memory of rank {} (pid {}): {}; large messages "
                "go through the FIFO", self_rank_, peer(), peer_pid_,
                n < 0 ? std::strerror(errno) : "probe mismatch");
  }
  // Release: the producer loads it (acquire) before sending by reference.
  recv_.control->cma_state.store(works ? kCmaWorks : kCmaDenied, std::memory_order_release);
}

bool ShmConnection::read_by_reference(RecvRequest* req, uint64_t* budget) {
  auto* dst = static_cast<std::byte*>(req->dst);
  const auto* src = static_cast<const std::byte*>(req->src);
  if (req->reduce != nullptr && !bounce_) bounce_ = std::make_unique<std::byte[]>(kReferencePiece);
  while (ref_done_ < req->bytes) {
    if (*budget == 0) return false;
    uint64_t n = std::min({req->bytes - ref_done_, kReferencePiece, *budget});
    if (req->reduce != nullptr) n -= n % req->elem_size;
    std::byte* target = req->reduce != nullptr ? bounce_.get() : dst + ref_done_;
    iovec local{target, n};
    iovec remote{reinterpret_cast<void*>(ref_address_ + ref_done_), n};
    ssize_t got = process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      int err = errno;
      if (err == ESRCH) {
        fail_all(remote_error("rank {} (pid {}) exited while rank {} was reading {} ({} of {} "
                              "bytes done)", peer(), peer_pid_, self_rank_, describe_tag(req->tag),
                              ref_done_, req->bytes));
      } else if (err == EFAULT) {
        // The sender keeps its buffer until we say we are done, unless it gave up: its
        // operation failed (its connections close, possibly after it freed the buffer).
        bool closed = recv_.control->producer_closed.load(std::memory_order_acquire) != 0;
        fail_all(remote_error("rank {} (pid {}) {} while rank {} was reading {} from its memory "
                              "({} of {} bytes done; its buffer is gone)", peer(), peer_pid_,
                              closed ? fmt::format("closed its shared-memory connection (channel "
                                                   "{})", channel())
                                     : std::string("gave up on the message"),
                              self_rank_, describe_tag(req->tag), ref_done_, req->bytes));
      } else {
        fail_all(system_error(err, fmt::format("process_vm_readv from rank {} (pid {})", peer(),
                                               peer_pid_)));
      }
      return false;
    }
    n = static_cast<uint64_t>(got);
    if (req->reduce != nullptr) {
      n -= n % req->elem_size;  // a short read: fold whole elements, re-read the rest
      req->reduce(dst + ref_done_, src + ref_done_, bounce_.get(), n / req->elem_size);
    }
    ref_done_ += n;
    *budget -= std::min(*budget, n);
    req->bytes_done.store(ref_done_, std::memory_order_relaxed);
  }
  return finish_by_reference(req);
}

bool ShmConnection::finish_by_reference(const RecvRequest* req) {
  // A producer closes with a message by reference unread only when it failed: its buffer may
  // have been reused while we read it, so the data cannot be trusted.
  if (recv_.control->producer_closed.load(std::memory_order_acquire) != 0) {
    fail_all(remote_error("rank {} (pid {}) closed its shared-memory connection (channel {}) "
                          "while rank {} was reading {} from its memory", peer(), peer_pid_,
                          channel(), self_rank_, describe_tag(req->tag)));
    return false;
  }
  // Release: every read of the sender's buffer happens before it learns it may reuse it.
  recv_.control->by_reference_done.store(++ref_finished_, std::memory_order_release);
  ring_doorbell(peer_doorbell_);
  recv_by_reference_ = false;
  recv_by_mapping_ = false;
  ref_view_ = nullptr;
  return true;
}

namespace {

// Reads one byte of every page of a fresh mapping. MAP_POPULATE fills the guest's page tables,
// but under a hypervisor that shadows them (this project's CI VM: PVM) the first access to each
// page still traps, about 2 us a page, invisible to the guest's fault counters: 60 ms for a
// 128 MiB buffer, paid by whichever transfers touch the pages first (measured: a 1 MiB
// AlltoAll over registered buffers took 0.9 ms on its first pass over a 128 MiB buffer and
// 0.25 ms afterwards). Taking it once here keeps it out of the transfers; on bare metal the
// loop costs about a millisecond per GiB.
void touch_pages(const void* p, size_t bytes) {
  const auto* bytes_p = static_cast<const volatile unsigned char*>(p);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  unsigned char sink = 0;
  for (size_t off = 0; off < bytes; off += page) sink ^= bytes_p[off];
  (void)sink;
}

}  // namespace

bool ShmConnection::by_mapping(const SendRequest& req) const {
  return map_min_bytes_ > 0 && req.memfd.fd >= 0 && req.bytes >= map_min_bytes_;
}

Result<const std::byte*> ShmConnection::map_producer_memfd(int fd, uint64_t inode, uint64_t end,
                                                           const RecvRequest& req) {
  for (size_t i = 0; i < producer_memfds_.size(); ++i) {
    ProducerMemfd& m = producer_memfds_[i];
    if (m.fd != fd || m.inode != inode || m.mapping.size() < end) continue;
    std::rotate(producer_memfds_.begin() + static_cast<ptrdiff_t>(i),
                producer_memfds_.begin() + static_cast<ptrdiff_t>(i) + 1, producer_memfds_.end());
    return static_cast<const std::byte*>(producer_memfds_.back().mapping.get());
  }
  auto fail = [&](int err, const char* what) {
    return remote_error("rank {} (pid {}) sent {} from its registered memory (memfd fd {}), "
                        "which rank {} cannot map: {}: {}", peer(), peer_pid_,
                        describe_tag(req.tag), fd, self_rank_, what,
                        err ? std::strerror(err) : "");
  };
  std::string path = fmt::format("/proc/{}/fd/{}", peer_pid_, fd);
  UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file.valid()) return fail(errno, "open");
  struct stat st {};
  if (fstat(file.get(), &st) != 0) return fail(errno, "fstat");
  if (static_cast<uint64_t>(st.st_ino) != inode)
    return fail(0, "its fd names another file now (the buffer was freed)");
  if (static_cast<uint64_t>(st.st_size) < end)
    return fail(0, "the message ends past the memfd's end");
  // Populated now: page faults on first touch would otherwise land inside later transfers.
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED | MAP_POPULATE,
                 file.get(), 0);
  if (p == MAP_FAILED) return fail(errno, "mmap");
  touch_pages(p, static_cast<size_t>(st.st_size));
  // A few buffers per peer in practice; drop the least recently used beyond that.
  constexpr size_t kMaxProducerMemfds = 8;
  for (size_t i = 0; i < producer_memfds_.size(); ++i) {
    if (producer_memfds_[i].fd == fd || producer_memfds_.size() >= kMaxProducerMemfds) {
      producer_memfds_.erase(producer_memfds_.begin() + static_cast<ptrdiff_t>(i));
      break;
    }
  }
  producer_memfds_.push_back(ProducerMemfd{fd, inode, Mapping(p, static_cast<size_t>(st.st_size))});
  return static_cast<const std::byte*>(p);
}

bool ShmConnection::read_by_mapping(RecvRequest* req, uint64_t* budget) {
  if (ref_view_ == nullptr) {
    auto base = map_producer_memfd(ref_fd_, ref_inode_, ref_address_ + req->bytes, *req);
    if (!base.ok()) {
      fail_all(base.take_status());
      return false;
    }
    ref_view_ = *base + ref_address_;
  }
  auto* dst = static_cast<std::byte*>(req->dst);
  const auto* src = static_cast<const std::byte*>(req->src);
  while (ref_done_ < req->bytes) {
    if (*budget == 0) return false;
    uint64_t n = std::min({req->bytes - ref_done_, kReferencePiece, *budget});
    if (req->reduce != nullptr) {
      if (n < req->bytes - ref_done_) n -= n % req->elem_size;
      if (n == 0) return false;  // less than an element of budget left: next pass
      req->reduce(dst + ref_done_, src + ref_done_, ref_view_ + ref_done_, n / req->elem_size);
    } else if (req->bytes >= stream_min_bytes_) {
      kernels::stream_copy_fn()(dst + ref_done_, ref_view_ + ref_done_, n);
    } else {
      std::memcpy(dst + ref_done_, ref_view_ + ref_done_, n);
    }
    ref_done_ += n;
    *budget -= std::min(*budget, n);
    req->bytes_done.store(ref_done_, std::memory_order_relaxed);
  }
  return finish_by_reference(req);
}

bool ShmConnection::complete_by_reference_sends() {
  if (by_reference_.empty()) return false;
  // Acquire: pairs with the consumer's release store after its last read of our buffers.
  uint64_t done = send_.control->by_reference_done.load(std::memory_order_acquire);
  bool completed = false;
  while (by_reference_completed_ < done && !by_reference_.empty()) {
    SendRequest* req = by_reference_.front();
    req->bytes_done.store(req->bytes, std::memory_order_relaxed);
    by_reference_.pop();
    ++by_reference_completed_;
    req->complete();
    completed = true;
  }
  return completed;
}

Status ShmConnection::check_framing(const MsgHeader& header) const {
  if (header.magic != kMsgMagic || header.index != recv_index_) {
    return remote_error(
        "shared-memory FIFO from rank {} (pid {}, channel {}) is corrupted: message header at "
        "stream offset {} has magic {:#x} and index {} (expected {:#x} and {})",
        peer(), peer_pid_, channel(), recv_pos_, header.magic, header.index, kMsgMagic,
        recv_index_);
  }
  if ((header.flags & kInline) != 0 &&
      (header.bytes > kInlineBytes || (header.flags & kByReference) != 0)) {
    return remote_error(
        "shared-memory FIFO from rank {} (pid {}, channel {}) is corrupted: message {} claims "
        "{} bytes inside its header (at most {})",
        peer(), peer_pid_, channel(), recv_index_, header.bytes, kInlineBytes);
  }
  return Status();
}

Status ShmConnection::check_header(const MsgHeader& header, RecvRequest* req) {
  CHORUS_RETURN_IF_ERROR(check_framing(header));
  return accept_incoming(req, header.tag, header.bytes, peer(), self_rank_);
}

uint64_t ShmConnection::send_space(uint64_t want) {
  const uint64_t fifo = send_.fifo_bytes;
  if (fifo - (send_pos_ - tail_cached_) >= want) return fifo - (send_pos_ - tail_cached_);
  // Acquire: pairs with the consumer's release store of tail, so its reads of the ring bytes
  // before tail happen before we overwrite them.
  const uint64_t tail = send_.control->tail.load(std::memory_order_acquire);
  if (tail < tail_cached_ || tail > head_published_ || tail % kFifoAlign != 0) {
    fail_all(remote_error(
        "shared-memory FIFO to rank {} (pid {}, channel {}) is corrupted: tail {} outside "
        "[{}, {}]",
        peer(), peer_pid_, channel(), tail, tail_cached_, head_published_));
    return 0;
  }
  tail_cached_ = tail;
  return fifo - (send_pos_ - tail_cached_);
}

uint64_t ShmConnection::recv_available(uint64_t want) {
  if (head_cached_ - recv_pos_ >= want) return head_cached_ - recv_pos_;
  // Acquire: pairs with the producer's release store of head, so the ring bytes before head
  // are visible.
  const uint64_t head = recv_.control->head.load(std::memory_order_acquire);
  if (head < head_cached_ || head - tail_published_ > recv_.fifo_bytes || head % kFifoAlign != 0) {
    fail_all(remote_error(
        "shared-memory FIFO from rank {} (pid {}, channel {}) is corrupted: head {} outside "
        "[{}, {}]",
        peer(), peer_pid_, channel(), head, head_cached_, tail_published_ + recv_.fifo_bytes));
    return 0;
  }
  head_cached_ = head;
  return head_cached_ - recv_pos_;
}

void ShmConnection::publish_head() {
  if (send_pos_ == head_published_) return;
  // Release: the ring bytes written before it become visible to the consumer's acquire load.
  send_.control->head.store(send_pos_, std::memory_order_release);
  head_published_ = send_pos_;
}

void ShmConnection::flush_head() {
  publish_head();
  if (head_rung_ == head_published_) return;
  // Rung only after the store above: a peer going to sleep either sees the new head or is woken.
  ring_doorbell(peer_doorbell_);
  head_rung_ = head_published_;
}

void ShmConnection::flush_tail() {
  if (recv_pos_ == tail_published_) return;
  // Release: our reads of the ring bytes before it happen before the producer overwrites them.
  recv_.control->tail.store(recv_pos_, std::memory_order_release);
  tail_published_ = recv_pos_;
  ring_doorbell(peer_doorbell_);  // the sender may be waiting for space
}

// The flag loads below are acquire: they pair with the release stores in the peer's close(),
// so a head loaded after one includes everything the peer published before closing.

bool ShmConnection::check_consumer_closed() {
  if (send_.control->consumer_closed.load(std::memory_order_acquire) == 0) return false;
  // Sends complete once copied into the ring (or read by reference); nobody would read these.
  const SendRequest* req = sends_.empty() ? by_reference_.front() : sends_.front();
  fail_all(remote_error(
      "rank {} (pid {}) closed its shared-memory connection (channel {}): {} from rank {} "
      "cannot be delivered",
      peer(), peer_pid_, channel(), describe_message(req->tag, req->bytes), self_rank_));
  return true;
}

bool ShmConnection::check_producer_closed() {
  if (recv_.control->producer_closed.load(std::memory_order_acquire) == 0) return false;
  // At most one FIFO's worth is left and the budget of one call covers it: after this, the
  // front receive can never complete.
  progress_recvs();
  if (!error().ok() || recvs_.empty()) return true;
  const RecvRequest* req = recvs_.front();
  fail_all(remote_error(
      "rank {} (pid {}) closed its shared-memory connection (channel {}) before sending {} "
      "that rank {} expects from it",
      peer(), peer_pid_, channel(), describe_message(req->tag, req->bytes), self_rank_));
  return true;
}

void ShmConnection::farewell(const Status& why) {
  // Only between messages, in one contiguous piece of free ring, before closing.
  if (closed_ || why.ok() || send_cursor_ != 0) return;
  const std::string text = why.message().substr(0, kMaxFarewellBytes);
  const uint64_t fifo = send_.fifo_bytes;
  const uint64_t total = kFifoAlign + round_up(text.size());
  const uint64_t off = send_pos_ % fifo;
  if (fifo - off < total || send_space(total) < total) return;
  MsgHeader header{};
  header.magic = kMsgMagic;
  header.index = send_index_;
  header.flags = kFarewell;
  header.bytes = text.size();
  header.address = static_cast<uint64_t>(why.code());
  std::memcpy(send_.data + off, &header, sizeof(header));
  std::memcpy(send_.data + off + kFifoAlign, text.data(), text.size());
  send_pos_ += total;
  close();  // publishes it
}

void ShmConnection::read_farewell(const MsgHeader& header, const RecvRequest* req) {
  // Published in one piece with its header, before the producer closed.
  const uint64_t fifo = recv_.fifo_bytes;
  const uint64_t off = recv_pos_ % fifo;
  const uint64_t len = std::min<uint64_t>({header.bytes, kMaxFarewellBytes, fifo - off - kFifoAlign});
  const uint64_t have = recv_available(kFifoAlign + len);
  std::string text(reinterpret_cast<const char*>(recv_.data + off + kFifoAlign),
                   have >= kFifoAlign + len ? len : 0);
  fail_all(Status(farewell_code(static_cast<uint32_t>(header.address)),
                  fmt::format("rank {} (pid {}) gave up while rank {} was receiving {} "
                              "on shared-memory channel {}: {}",
                              peer(), peer_pid_, self_rank_, describe_request(req), channel(),
                              text)));
}

void ShmConnection::fail_all(Status status) {
  farewell(status);
  CHORUS_WARN(kShm, "{}", status.message());
  set_error(std::move(status.mark_logged()));
  sends_.fail_all();
  by_reference_.fail_all();
  recvs_.fail_all();
  // The streams may now hold half a message: close both directions so that the peer fails its
  // pending requests too instead of waiting for bytes that will not come.
  close();
}

}  // namespace chorus::shm
