// SPDX-License-Identifier: Apache-2.0
// File: src/overlap/scheduler.cc
// The overlap scheduler (scheduler.h).
#include "overlap/scheduler.h"

#include <chorus/compress.h>
#include <chorus/stream.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <tuple>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/params.h"

namespace chorus::overlap {

struct Scheduler::Tensor {
  std::byte* buf = nullptr;
  size_t count = 0;
  int datatype = 0;
  size_t elem = 0;
  int layer = 0;
  std::vector<int> pieces;
  uint64_t ready_count = 0;  // ready() calls
  uint64_t done_count = 0;   // steps whose reduction of it finished here
  size_t pieces_done = 0;    // in the running step
  size_t bytes() const { return count * elem; }
};

struct Scheduler::Piece {
  int tensor = 0;
  size_t offset = 0;  // bytes from the tensor's start
  size_t bytes = 0;
  // The running step: launched in a bucket, the round it was agreed ready in.
  bool launched = false;
  uint64_t agreed_round = 0;
  // With compression, for fp32/bf16/fp16: this piece's own compressor (and residual).
  chorusCompressor_t compressor = nullptr;
};

struct Scheduler::Bucket {
  Scheduler* owner = nullptr;
  std::vector<int> pieces;
  int datatype = 0;
  size_t bytes = 0;
  std::byte* data = nullptr;        // the pieces themselves (back to back), or staging
  std::vector<std::byte> staging;   // empty when reduced in place
  bool done = false;                // reduced here (guarded by the mutex)
  int64_t launch_ns = 0, done_ns = 0;
};

struct Scheduler::StepRecord {
  uint64_t step = 0;
  int64_t first_launch_ns = 0, last_done_ns = 0, exposed_ns = 0;
  uint64_t bytes = 0, rounds = 0;
  struct BucketRecord {
    int64_t launch_ns, done_ns;
    size_t bytes, pieces;
    int min_layer, max_layer;
    bool staged;
  };
  std::vector<BucketRecord> buckets;
};

namespace {

// A failed call of the public API, with the calling thread's last error text.
Status from_nccl(ncclResult_t r, const char* what) {
  return Status(static_cast<Code>(r), fmt::format("{}: {}", what, ncclGetLastError(nullptr)))
      .mark_logged();
}

}  // namespace

Scheduler::Scheduler(ncclComm_t comm, const chorusOverlapConfig_t& config)
    : comm_(comm), config_(config) {
  if (config.compress != nullptr) {
    compress_ = true;
    compress_config_ = *config.compress;
  }
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(ncclComm_t comm,
                                                     const chorusOverlapConfig_t& config) {
  std::unique_ptr<Scheduler> s(new Scheduler(comm, config));
  ncclResult_t r = ncclSuccess;
  if (s->compress_) {
    // A bad compression setting is refused here, naming the field, not at registration.
    chorusCompressor_t probe = nullptr;
    r = chorusCompressorCreate(&s->compress_config_, &probe);
    if (r != ncclSuccess) return from_nccl(r, "the overlap scheduler's compression");
    chorusCompressorDestroy(probe);
  }
  r = ncclCommUserRank(comm, &s->rank_);
  if (r == ncclSuccess) r = ncclCommCount(comm, &s->nranks_);
  if (r != ncclSuccess) return from_nccl(r, "the scheduler's communicator");
  // The agreement runs on a communicator of its own, so that it never waits behind buckets.
  r = ncclCommSplit(comm, 0, s->rank_, &s->agree_comm_, nullptr);
  if (r != ncclSuccess) return from_nccl(r, "splitting off the agreement communicator");
  r = chorusStreamCreate(&s->stream_);
  if (r != ncclSuccess) return from_nccl(r, "creating the scheduler's stream");
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

Scheduler::~Scheduler() {
  bool agreeing = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    // Mid-step the thread may be waiting in an agreement for peers: aborting our end of the
    // agreement communicator lets it go (the peers then fail naming this rank).
    agreeing = max_ready_ > step_ && error_.ok();
  }
  cv_.notify_all();
  if (agreeing) ncclCommAbort(agree_comm_);
  if (thread_.joinable()) thread_.join();
  if (!agreeing) ncclCommDestroy(agree_comm_);
  if (stream_ != nullptr) {
    // Buckets in flight finish (or fail, bounded by CHORUS_TIMEOUT_MS) before their memory goes.
    chorusStreamDestroy(stream_);
  }
  for (Piece& p : pieces_)
    if (p.compressor != nullptr) chorusCompressorDestroy(p.compressor);
}

int Scheduler::find(const void* buf) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].buf == buf) return static_cast<int>(i);
  return -1;
}

Status Scheduler::add(void* buf, size_t count, int datatype, int layer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (frozen_) {
    return invalid_usage("register every tensor before the first chorusOverlapReady: {} tensors "
                         "are registered and steps have begun", tensors_.size());
  }
  Tensor t;
  t.buf = static_cast<std::byte*>(buf);
  t.count = count;
  t.datatype = datatype;
  t.elem = datatype_size(static_cast<DataType>(datatype));
  t.layer = layer;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& o = tensors_[i];
    if (t.buf < o.buf + o.bytes() && o.buf < t.buf + t.bytes()) {
      return invalid_argument("tensor {} ({} bytes) overlaps registered tensor {} ({} at {}, "
                              "{} bytes)", buf, t.bytes(), i, static_cast<void*>(o.buf),
                              o.layer, o.bytes());
    }
  }
  // Pieces of at most partitionBytes (whole elements), so that a later, more urgent gradient
  // need not wait behind all of a large one.
  size_t piece = t.bytes();
  if (config_.partitionBytes > 0) piece = std::max(t.elem, config_.partitionBytes / t.elem * t.elem);
  const int index = static_cast<int>(tensors_.size());
  const bool compressible = compress_ && (datatype == ncclFloat32 || datatype == ncclBfloat16 ||
                                          datatype == ncclFloat16);
  for (size_t off = 0; off < t.bytes(); off += piece) {
    Piece p;
    p.tensor = index;
    p.offset = off;
    p.bytes = std::min(piece, t.bytes() - off);
    if (compressible) {
      const ncclResult_t r = chorusCompressorCreate(&compress_config_, &p.compressor);
      if (r != ncclSuccess) {
        for (int q : t.pieces) chorusCompressorDestroy(pieces_[q].compressor);
        pieces_.resize(pieces_.size() - t.pieces.size());
        return from_nccl(r, "a piece's compressor");
      }
    }
    t.pieces.push_back(static_cast<int>(pieces_.size()));
    pieces_.push_back(p);
  }
  tensors_.push_back(std::move(t));
  return Status();
}

Status Scheduler::ready(void* buf, size_t count, int datatype) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    CHORUS_RETURN_IF_ERROR(error_);
    const int i = find(buf);
    if (i < 0) return invalid_usage("{} is not a registered tensor (chorusOverlapRegister)", buf);
    Tensor& t = tensors_[i];
    if (count != t.count || datatype != t.datatype) {
      return invalid_usage("tensor {} (layer {}) was registered with {} elements of {} but is "
                           "ready with {} of {}", i, t.layer, t.count,
                           datatype_name(static_cast<DataType>(t.datatype)), count,
                           datatype_valid(datatype) ? datatype_name(static_cast<DataType>(datatype))
                                                    : "an invalid datatype");
    }
    if (t.ready_count > t.done_count) {
      return invalid_usage("tensor {} (layer {}) is ready twice in one step: its reduction of "
                           "step {} has not finished", i, t.layer, t.ready_count);
    }
    frozen_ = true;
    ++t.ready_count;
    max_ready_ = std::max(max_ready_, t.ready_count);
  }
  cv_.notify_all();
  return Status();
}

Status Scheduler::wait(void* buf) {
  int i;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    i = find(buf);
    if (i < 0) return invalid_usage("{} is not a registered tensor (chorusOverlapRegister)", buf);
    target = max_ready_;
  }
  return wait_for({i}, target, /*step_end=*/false);
}

Status Scheduler::wait_all() {
  std::vector<int> all;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < tensors_.size(); ++i) all.push_back(static_cast<int>(i));
    target = max_ready_;
  }
  return wait_for(all, target, /*step_end=*/true);
}

Status Scheduler::wait_for(const std::vector<int>& which, uint64_t target, bool step_end) {
  const int64_t start = now_ns();
  const int64_t timeout_ms = params::kTimeoutMs.get();
  std::unique_lock<std::mutex> lock(mutex_);
  auto done = [&] {
    for (int i : which)
      if (tensors_[i].done_count < target) return false;
    return !step_end || step_ >= target;
  };
  const bool finished = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return !error_.ok() || done();
  });
  exposed_ns_ += now_ns() - start;
  CHORUS_RETURN_IF_ERROR(error_);
  if (finished) return Status();
  // Name what is missing: tensors this rank never readied, else the ranks that did not.
  std::string never, elsewhere;
  std::vector<bool> missing_rank(static_cast<size_t>(nranks_), false);
  const size_t n = last_agreed_.size() / static_cast<size_t>(std::max(nranks_, 1));
  if (std::all_of(which.begin(), which.end(),
                                   [&](int i) { return tensors_[i].done_count >= target; })) {
    return remote_error("waited {} ms (CHORUS_TIMEOUT_MS) for the end of step {}: reduced here, "
                        "not yet agreed finished by every rank", timeout_ms, target);
  }
  for (int i : which) {
    const Tensor& t = tensors_[i];
    if (t.done_count >= target) continue;
    if (t.ready_count < target) {
      never += fmt::format("{}{} (layer {})", never.empty() ? "" : ", ", i, t.layer);
      continue;
    }
    elsewhere += fmt::format("{}{} (layer {})", elsewhere.empty() ? "" : ", ", i, t.layer);
    for (int p : t.pieces) {
      for (int r = 0; r < nranks_ && static_cast<size_t>(p) < n; ++r)
        if (last_agreed_[static_cast<size_t>(r) * n + static_cast<size_t>(p)] == 0) missing_rank[r] = true;
    }
  }
  if (!never.empty()) {
    return invalid_usage("waited {} ms (CHORUS_TIMEOUT_MS) for tensors never ready on rank {} in "
                         "step {}: {}", timeout_ms, rank_, target, never);
  }
  std::string ranks;
  for (int r = 0; r < nranks_; ++r)
    if (missing_rank[r]) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
  return remote_error("waited {} ms (CHORUS_TIMEOUT_MS) for tensors {} of step {}: not ready on "
                      "rank(s) {}", timeout_ms, elsewhere, target,
                      ranks.empty() ? "(no agreement yet)" : ranks);
}

void Scheduler::fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
  cv_.notify_all();
}

void Scheduler::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto cycle = std::chrono::microseconds(static_cast<int64_t>(config_.cycleUs));
  for (;;) {
    // A step begins when a tensor is ready in it here.
    cv_.wait(lock, [&] { return stop_ || (error_.ok() && max_ready_ > step_); });
    if (stop_) return;
    while (!stop_ && round(lock)) cv_.wait_for(lock, cycle, [&] { return stop_; });
    if (!error_.ok()) {
      cv_.wait(lock, [&] { return stop_; });
      return;
    }
  }
}

Status Scheduler::agree(const std::vector<uint8_t>& mine, std::vector<uint8_t>* all) {
  all->assign(mine.size() * static_cast<size_t>(nranks_), 0);
  ncclResult_t r = ncclAllGather(mine.data(), all->data(), mine.size(), ncclUint8, agree_comm_,
                                 nullptr);
  if (r != ncclSuccess) return from_nccl(r, "the overlap scheduler's agreement");
  return Status();
}

bool Scheduler::round(std::unique_lock<std::mutex>& lock) {
  // This rank's flags: each piece ready here, each launched bucket reduced here.
  const size_t np = pieces_.size();
  std::vector<uint8_t> mine(np + buckets_.size());
  for (size_t p = 0; p < np; ++p) mine[p] = tensors_[pieces_[p].tensor].ready_count > step_;
  for (size_t b = 0; b < buckets_.size(); ++b) mine[np + b] = buckets_[b]->done;
  lock.unlock();
  Status status;
  const ncclResult_t q = chorusStreamQuery(stream_);
  if (q != ncclSuccess && q != ncclInProgress) status = from_nccl(q, "a bucket's AllReduce");
  std::vector<uint8_t> all;
  if (status.ok()) status = agree(mine, &all);
  lock.lock();
  if (!status.ok()) {
    fail(std::move(status));
    return false;
  }
  if (stop_) return false;
  ++rounds_;
  last_agreed_ = all;
  const size_t n = mine.size();
  auto everywhere = [&](size_t i) {
    for (int r = 0; r < nranks_; ++r)
      if (all[static_cast<size_t>(r) * n + i] == 0) return false;
    return true;
  };
  std::vector<int> candidates;
  bool all_launched = true;
  for (size_t p = 0; p < np; ++p) {
    Piece& piece = pieces_[p];
    if (piece.launched) continue;
    all_launched = false;
    if (!everywhere(p)) continue;
    if (piece.agreed_round == 0) piece.agreed_round = rounds_;
    candidates.push_back(static_cast<int>(p));
  }
  size_t inflight = 0;
  bool all_done = true;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (everywhere(np + b)) continue;
    inflight += buckets_[b]->bytes;
    all_done = false;
  }
  if (all_launched && all_done) {
    end_step();
    return false;
  }
  std::vector<Bucket*> launches;
  for (std::vector<int>& group : plan(std::move(candidates))) {
    size_t bytes = 0;
    for (int p : group) bytes += pieces_[p].bytes;
    // The credit: one bucket may always go; more only while the agreed bytes in flight allow.
    if (config_.creditBytes > 0 && inflight > 0 && inflight + bytes > config_.creditBytes) break;
    auto b = std::make_unique<Bucket>();
    b->owner = this;
    b->datatype = tensors_[pieces_[group.front()].tensor].datatype;
    b->bytes = bytes;
    for (int p : group) pieces_[p].launched = true;
    b->pieces = std::move(group);
    inflight += bytes;
    launches.push_back(b.get());
    buckets_.push_back(std::move(b));
  }
  lock.unlock();
  for (Bucket* b : launches) {
    status = launch(b);
    if (!status.ok()) break;
  }
  lock.lock();
  if (!status.ok()) {
    fail(std::move(status));
    return false;
  }
  return true;
}

std::vector<std::vector<int>> Scheduler::plan(std::vector<int> candidates) const {
  // Priority: the forward pass's first layers first. FIFO: in the order they were agreed
  // ready, and within one round in backward order (last layers first).
  auto key = [&](int p) {
    const Piece& x = pieces_[p];
    const Tensor& t = tensors_[x.tensor];
    if (config_.policy == chorusOverlapFifo)
      return std::make_tuple(static_cast<int64_t>(x.agreed_round), -t.layer, x.tensor, x.offset);
    return std::make_tuple(int64_t{0}, t.layer, x.tensor, x.offset);
  };
  std::sort(candidates.begin(), candidates.end(), [&](int a, int b) { return key(a) < key(b); });
  std::vector<std::vector<int>> groups;
  std::vector<int> group;
  size_t bytes = 0;
  for (int p : candidates) {
    const size_t cap = buckets_.empty() && groups.empty() && config_.firstBucketBytes > 0
                           ? config_.firstBucketBytes
                           : config_.bucketBytes;
    const int dtype = tensors_[pieces_[p].tensor].datatype;
    // A compressed piece goes alone: its compressor's residual is the piece's.
    if (!group.empty() && (dtype != tensors_[pieces_[group.front()].tensor].datatype ||
                           bytes + pieces_[p].bytes > cap || pieces_[p].compressor != nullptr ||
                           pieces_[group.front()].compressor != nullptr)) {
      groups.push_back(std::move(group));
      group.clear();
      bytes = 0;
    }
    group.push_back(p);
    bytes += pieces_[p].bytes;
  }
  if (!group.empty()) groups.push_back(std::move(group));
  return groups;
}

Status Scheduler::launch(Bucket* b) {
  // Tensors and pieces do not change once steps have begun: read without the lock.
  auto at = [&](int p) { return tensors_[pieces_[p].tensor].buf + pieces_[p].offset; };
  bool contiguous = true;
  for (size_t i = 1; i < b->pieces.size() && contiguous; ++i)
    contiguous = at(b->pieces[i - 1]) + pieces_[b->pieces[i - 1]].bytes == at(b->pieces[i]);
  if (contiguous) {
    b->data = at(b->pieces.front());
  } else {
    b->staging.resize(b->bytes);
    size_t off = 0;
    for (int p : b->pieces) {
      std::memcpy(b->staging.data() + off, at(p), pieces_[p].bytes);
      off += pieces_[p].bytes;
    }
    b->data = b->staging.data();
  }
  const size_t elem = datatype_size(static_cast<DataType>(b->datatype));
  b->launch_ns = now_ns();
  const auto dtype = static_cast<ncclDataType_t>(b->datatype);
  chorusCompressor_t compressor = pieces_[b->pieces.front()].compressor;
  ncclResult_t r = compressor != nullptr
                       ? chorusAllReduceCompressed(b->data, b->data, b->bytes / elem, dtype,
                                                   config_.op, compressor, comm_, stream_)
                       : ncclAllReduce(b->data, b->data, b->bytes / elem, dtype, config_.op,
                                       comm_, stream_);
  if (r != ncclSuccess) return from_nccl(r, "a bucket's AllReduce");
  r = chorusLaunchHostFunc(stream_, &Scheduler::bucket_done, b);
  if (r != ncclSuccess) return from_nccl(r, "queueing a bucket's completion");
  return Status();
}

void Scheduler::bucket_done(void* arg) {
  auto* b = static_cast<Bucket*>(arg);
  Scheduler* s = b->owner;
  if (!b->staging.empty()) {
    size_t off = 0;
    for (int p : b->pieces) {
      const Piece& piece = s->pieces_[p];
      std::memcpy(s->tensors_[piece.tensor].buf + piece.offset, b->staging.data() + off, piece.bytes);
      off += piece.bytes;
    }
  }
  {
    std::lock_guard<std::mutex> lock(s->mutex_);
    b->done = true;
    b->done_ns = now_ns();
    for (int p : b->pieces) {
      Tensor& t = s->tensors_[s->pieces_[p].tensor];
      if (++t.pieces_done == t.pieces.size()) ++t.done_count;
    }
  }
  s->cv_.notify_all();
}

void Scheduler::end_step() {
  auto record = std::make_unique<StepRecord>();
  record->step = step_;
  record->rounds = rounds_;
  record->exposed_ns = exposed_ns_;
  for (const auto& b : buckets_) {
    StepRecord::BucketRecord br{b->launch_ns, b->done_ns, b->bytes, b->pieces.size(), INT32_MAX,
                                INT32_MIN, !b->staging.empty()};
    for (int p : b->pieces) {
      br.min_layer = std::min(br.min_layer, tensors_[pieces_[p].tensor].layer);
      br.max_layer = std::max(br.max_layer, tensors_[pieces_[p].tensor].layer);
    }
    record->buckets.push_back(br);
    record->bytes += b->bytes;
    if (record->first_launch_ns == 0 || b->launch_ns < record->first_launch_ns)
      record->first_launch_ns = b->launch_ns;
    record->last_done_ns = std::max(record->last_done_ns, b->done_ns);
  }
  last_step_ = std::move(record);
  buckets_.clear();
  rounds_ = 0;
  exposed_ns_ = 0;
  for (Piece& p : pieces_) {
    p.launched = false;
    p.agreed_round = 0;
  }
  for (Tensor& t : tensors_) t.pieces_done = 0;
  ++step_;
  cv_.notify_all();
}

chorusOverlapStats_t Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  chorusOverlapStats_t s{};
  s.step = step_;
  if (!last_step_) return s;
  const StepRecord& r = *last_step_;
  s.commUs = static_cast<double>(r.last_done_ns - r.first_launch_ns) / 1e3;
  s.exposedUs = static_cast<double>(r.exposed_ns) / 1e3;
  s.hiddenFraction = s.commUs > 0 ? std::clamp(1.0 - s.exposedUs / s.commUs, 0.0, 1.0) : 1.0;
  s.bytes = r.bytes;
  s.buckets = r.buckets.size();
  s.agreements = r.rounds;
  return s;
}

Status Scheduler::dump_trace(const std::string& path) const {
  std::string json = "{\"traceEvents\": [\n";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!last_step_) return invalid_usage("no step has completed yet: nothing to trace");
    const StepRecord& r = *last_step_;
    for (size_t i = 0; i < r.buckets.size(); ++i) {
      const auto& b = r.buckets[i];
      json += fmt::format(
          "{}{{\"name\": \"bucket {} (layers {}-{})\", \"cat\": \"allreduce\", \"ph\": \"X\", "
          "\"ts\": {:.3f}, \"dur\": {:.3f}, \"pid\": {}, \"tid\": 0, \"args\": {{\"bytes\": {}, "
          "\"pieces\": {}, \"staged\": {}, \"step\": {}}}}}",
          i == 0 ? "" : ",\n", i, b.min_layer, b.max_layer,
          static_cast<double>(b.launch_ns - r.first_launch_ns) / 1e3,
          static_cast<double>(b.done_ns - b.launch_ns) / 1e3, rank_, b.bytes, b.pieces,
          b.staged ? "true" : "false", r.step);
    }
  }
  json += "\n]}\n";
  std::ofstream out(path);
  out << json;
  if (!out) return invalid_argument("cannot write the trace to {}", path);
  return Status();
}

}  // namespace chorus::overlap
