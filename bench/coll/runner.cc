// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/runner.cc
// The per-rank benchmark loop, following nccl-tests' TimeTest/BenchTime: warm-up at the
// largest and smallest size, then per size and placement one untimed call, a barrier, -n timed
// iterations of -m calls each (grouped), the time per call combined over ranks per -a, and -c
// checked calls on fresh inputs; the size sweep -N times.
#include "bench/coll/runner.h"

#include <chorus/stream.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace chorus::bench {

namespace {

constexpr size_t kPage = 4096;

const char* placement_name(bool in_place) { return in_place ? "in-place" : "out-of-place"; }

}  // namespace

RankRunner::RankRunner(Job& job, int local, Reporter* reporter)
    : job_(job),
      options_(job.options()),
      coll_(job.coll()),
      local_(local),
      rank_(job.global_rank(local)),
      nranks_(job.nranks()),
      reporter_(reporter),
      coll_call_(coll_.coll == verify::Coll::kSendRecv
                     ? "ncclSend/ncclRecv group"
                     : fmt::format("nccl{}", verify::coll_name(coll_.coll))) {
  if (options_.compress.enabled)
    coll_call_ = fmt::format("chorus{}Compressed", verify::coll_name(coll_.coll));
  approx_ = options_.compress.enabled ? options_.compress : transparent_compression(coll_.coll);
}

RankRunner::~RankRunner() { teardown(); }


bool RankRunner::ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return true;
  // After the job failed, errors are the expected echo of the abort: only the first is news.
  if (!job_.failed()) {
    job_.fail(fmt::format("rank {}: {} failed: {} ({})", rank_, what, ncclGetErrorString(r),
                          ncclGetLastError(nullptr)));
  }
  return false;
}

bool RankRunner::run() {
  bool good = setup();
  std::vector<RankInfo> ranks;
  if (good) good = exchange_rank_info(&ranks);
  const bool reporting = good && reporter_ != nullptr;
  if (reporting) reporter_->begin(ranks);
  if (good) good = run_tests();
  if (good) good = report_bytes();
  if (good && reporter_ != nullptr && options_.memory_report != 0)
    reporter_->memory(send_.bytes + recv_.bytes);
  teardown();
  if (reporting) reporter_->end(job_.failed() ? job_.first_error() : std::string());
  return good && !any_wrong_ && !job_.failed();
}

bool RankRunner::allocate(Buffer* buffer, size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  void* p = nullptr;
  if (options_.local_register != 0) {
    if (!ok(ncclMemAlloc(&p, rounded), "ncclMemAlloc")) return false;
    buffer->nccl_memory = true;
  } else {
    p = std::aligned_alloc(kPage, rounded);
  }
  if (p == nullptr) {
    job_.fail(fmt::format("rank {}: cannot allocate {} bytes of buffer", rank_, rounded));
    return false;
  }
  std::memset(p, 0, rounded);
  buffer->data = static_cast<unsigned char*>(p);
  buffer->bytes = rounded;
  if (options_.local_register != 0 &&
      !ok(ncclCommRegister(comm_, p, rounded, &buffer->handle), "ncclCommRegister"))
    return false;
  // nccl-tests' -R 2: a symmetric window (every rank registers the same size, in the same
  // order: send, then receive buffer).
  if (options_.local_register == 2)
    return ok(ncclCommWindowRegister(comm_, p, rounded, &buffer->window, NCCL_WIN_COLL_SYMMETRIC),
              "ncclCommWindowRegister");
  return true;
}

void RankRunner::release(Buffer* buffer) {
  if (buffer->window != nullptr && comm_ != nullptr) {
    ncclResult_t r = ncclCommWindowDeregister(comm_, buffer->window);
    if (!job_.failed()) ok(r, "ncclCommWindowDeregister");
  }
  buffer->window = nullptr;
  if (buffer->handle != nullptr && comm_ != nullptr) {
    ncclResult_t r = ncclCommDeregister(comm_, buffer->handle);
    if (!job_.failed()) ok(r, "ncclCommDeregister");
  }
  buffer->handle = nullptr;
  if (buffer->data != nullptr) {
    if (buffer->nccl_memory) {
      ncclResult_t r = ncclMemFree(buffer->data);
      if (!job_.failed()) ok(r, "ncclMemFree");
    } else {
      std::free(buffer->data);
    }
  }
  buffer->data = nullptr;
}

bool RankRunner::setup() {
  ncclComm_t comm = nullptr;
  if (!ok(ncclCommInitRank(&comm, nranks_, job_.world().id, rank_), "ncclCommInitRank"))
    return false;
  comm_ = comm;
  job_.adopt(local_, comm_);
  if (!options_.null_stream() && !ok(chorusStreamCreate(&stream_), "chorusStreamCreate"))
    return false;
  if (options_.compress.enabled) {
    if (coll_.issue_compressed == nullptr) {
      job_.fail(fmt::format("{} has no compressed variant (--compress: all_reduce_perf, "
                            "reduce_scatter_perf, all_gather_perf)",
                            coll_.tool));
      return false;
    }
    if (!create_compressor()) return false;
  }
  return allocate(&send_, options_.max_bytes) && allocate(&recv_, options_.max_bytes);
}

bool RankRunner::exchange_rank_info(std::vector<RankInfo>* ranks) {
  RankInfo mine;
  mine.rank = rank_;
  mine.proc = job_.world().proc;
  mine.pid = static_cast<int32_t>(getpid());
  if (!ok(ncclCommCuDevice(comm_, &mine.device), "ncclCommCuDevice")) return false;
  if (gethostname(mine.host, sizeof(mine.host) - 1) != 0) std::strcpy(mine.host, "?");
  ranks->resize(static_cast<size_t>(nranks_));
  return ok(ncclAllGather(&mine, ranks->data(), sizeof(RankInfo), ncclUint8, comm_, nullptr),
            "ncclAllGather (rank information)");
}

void RankRunner::teardown() {
  if (stream_ != nullptr) {
    ncclResult_t r = chorusStreamDestroy(stream_);
    stream_ = nullptr;
    if (!job_.failed()) ok(r, "chorusStreamDestroy");
  }
  if (compressor_ != nullptr) {
    ncclResult_t r = chorusCompressorDestroy(compressor_);
    compressor_ = nullptr;
    if (!job_.failed()) ok(r, "chorusCompressorDestroy");
  }
  release(&send_);
  release(&recv_);
  if (comm_ != nullptr) {
    ncclResult_t r = job_.destroy(local_);
    comm_ = nullptr;
    if (!job_.failed()) ok(r, "ncclCommDestroy");
  }
}

bool RankRunner::run_tests() {
  std::vector<int> ops{-1};
  if (verify::coll_reduces(coll_.coll)) ops = options_.ops;
  std::vector<int> roots{-1};
  if (verify::coll_rooted(coll_.coll)) {
    roots = {options_.root};
    if (options_.root == kAllRoots) {
      roots.clear();
      for (int r = 0; r < nranks_; ++r) roots.push_back(r);
    }
  }
  for (ncclDataType_t dtype : options_.dtypes)
    for (int op : ops)
      for (int root : roots)
        if (!time_test(dtype, op, root)) return false;
  return true;
}

bool RankRunner::create_op(ncclDataType_t dtype, int op, ncclRedOp_t* nccl_op) {
  *nccl_op = static_cast<ncclRedOp_t>(op);
  if (op != verify::kPreMulSum) return true;
  auto v = verify::Verifier::create({coll_.coll, dtype, op, nranks_, 0, 0});
  alignas(8) unsigned char scalar[8] = {};
  v->encode_scalar(rank_, scalar);
  return ok(ncclRedOpCreatePreMulSum(nccl_op, scalar, dtype, ncclScalarHostImmediate, comm_),
            "ncclRedOpCreatePreMulSum");
}

bool RankRunner::time_test(ncclDataType_t dtype, int op, int root) {
  ncclRedOp_t nccl_op = ncclSum;
  if (op >= 0 && !create_op(dtype, op, &nccl_op)) return false;
  bool good = warm_up(dtype, op, root, nccl_op);
  // -N: the whole sweep again, as nccl-tests' run_cycles (a row per size and cycle).
  for (int cycle = 0; cycle < options_.run_cycles && good; ++cycle) {
    for (size_t bytes : message_sizes(options_)) {
      if (!good) break;
      Step step;
      good = make_step(dtype, op, root, nccl_op, bytes, &step);
      // A size too small for one element per rank has nothing to measure: no row.
      if (!good || step.layout.param_count == 0) continue;
      job_.begin_step(local_,
                      fmt::format("{} of {} bytes ({})", coll_call_, bytes, dtype_name(dtype)));
      Row row;
      good = bench_size(step, &row);
      job_.end_step(local_);
      if (good && reporter_ != nullptr) reporter_->row(row);
    }
  }
  if (op == verify::kPreMulSum) {
    ncclResult_t r = ncclRedOpDestroy(nccl_op, comm_);
    if (good) good = ok(r, "ncclRedOpDestroy");
  }
  return good;
}

bool RankRunner::make_step(ncclDataType_t dtype, int op, int root, ncclRedOp_t nccl_op,
                           size_t bytes, Step* step) {
  step->dtype = dtype;
  step->op = op;
  step->root = root;
  step->nccl_op = nccl_op;
  step->bytes = bytes;
  step->element_bytes = verify::datatype_size(dtype);
  step->layout = coll_.layout(bytes / step->element_bytes, nranks_);
  step->verifier = verify::Verifier::create({coll_.coll, dtype, op < 0 ? ncclSum : op, nranks_,
                                             step->layout.param_count, root < 0 ? 0 : root});
  if (step->verifier == nullptr) {
    job_.fail(fmt::format("rank {}: no generator for datatype {}", rank_, static_cast<int>(dtype)));
    return false;
  }
  return true;
}

bool RankRunner::warm_up(ncclDataType_t dtype, int op, int root, ncclRedOp_t nccl_op) {
  for (size_t bytes : {options_.max_bytes, options_.min_bytes}) {
    Step step;
    if (!make_step(dtype, op, root, nccl_op, bytes, &step)) return false;
    if (step.layout.param_count == 0) continue;
    job_.begin_step(local_, fmt::format("warm-up {} of {} bytes", coll_call_, bytes));
    bool good = reset_compressor();
    for (int i = 0; i < options_.warmup_iters && good; ++i) good = issue(step, false, i);
    if (good) good = synchronize();
    job_.end_step(local_);
    if (!good) return false;
  }
  return true;
}

bool RankRunner::bench_size(const Step& step, Row* row) {
  row->bytes = std::max(step.layout.send_count, step.layout.recv_count) * step.element_bytes;
  row->count = step.layout.param_count;
  row->dtype = step.dtype;
  row->op = step.op;
  row->root = step.root;
  return bench_placement(step, false, &row->out_of_place) &&
         bench_placement(step, true, &row->in_place);
}

bool RankRunner::bench_placement(const Step& step, bool in_place, Placement* result) {
  // Generated inputs (no garbage, no subnormals to slow the arithmetic), then one untimed call.
  const verify::Verifier& v = *step.verifier;
  v.fill_input(rank_, place(step, in_place, 0).send, 0, v.input_count(rank_));
  if (compressor_ != nullptr) {
    // The timed calls cycle through slices of the buffers (place()); plain calls may read
    // whatever those hold, but an encoder may take another time on all-zero blocks: give
    // every slice the same inputs.
    for (int i = 1; i < options_.iters; ++i) {
      unsigned char* send = place(step, in_place, i).send;
      if (send == place(step, in_place, 0).send) break;
      v.fill_input(rank_, send, 0, v.input_count(rank_));
    }
  }
  // A compressor's residual is bound to one count: start each size and placement afresh.
  if (!reset_compressor()) return false;
  if (!issue(step, in_place, 0) || !synchronize()) return false;
  double seconds = 0;
  if (!time_iterations(step, in_place, &seconds)) return false;
  double combined = 0;
  if (!combine_time(seconds, &combined)) return false;
  result->time_us = combined * 1.0e6;
  result->algbw_gbps =
      algbw_gbps(coll_, step.layout.param_count * step.element_bytes, nranks_, combined);
  result->busbw_gbps = result->algbw_gbps * coll_.bus_factor(nranks_);
  result->wrong = -1;
  if (options_.check_iters == 0 || (in_place && !coll_.checks_in_place)) return true;
  return check_results(step, in_place, &result->wrong);
}

bool RankRunner::time_iterations(const Step& step, bool in_place, double* seconds) {
  if (!barrier()) return false;
  // The barrier completed on this rank, so its bytes are counted: the difference from here
  // to the end is the timed calls'.
  chorusByteCounters_t before{};
  if (!read_counters(&before)) return false;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < options_.iters; ++i)
    if (!issue_aggregated(step, in_place, i)) return false;
  if (!synchronize()) return false;
  std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  // Per call, as nccl-tests divides by iters * agg_iters.
  *seconds = elapsed.count() / (static_cast<double>(options_.iters) * options_.agg_iters);
  return count_bytes(before);
}

bool RankRunner::issue_aggregated(const Step& step, bool in_place, int iteration) {
  const int m = options_.agg_iters;
  if (m <= 1) return issue(step, in_place, iteration);
  if (!ok(ncclGroupStart(), "ncclGroupStart")) return false;
  bool good = true;
  // Successive calls take successive buffer slices (place()), as nccl-tests' iter*agg+aiter.
  for (int a = 0; a < m && good; ++a) good = issue(step, in_place, int64_t{iteration} * m + a);
  // End the group even after a failed call, so no group is left open on this thread.
  ncclResult_t r = ncclGroupEnd();
  return good && ok(r, "ncclGroupEnd");
}

bool RankRunner::check_results(const Step& step, bool in_place, int64_t* wrong) {
  const verify::Verifier& v = *step.verifier;
  *wrong = 0;
  for (int c = 0; c < options_.check_iters; ++c) {
    Placed p = place(step, in_place, 0);
    // Poison the output first, so that a call that writes nothing cannot pass on stale data.
    std::memset(p.recv, 0xff, v.output_count(rank_) * step.element_bytes);
    v.fill_input(rank_, p.send, 0, v.input_count(rank_));
    // No residual from the timed calls (whose in-place inputs grew): the bound is one call's.
    if (!reset_compressor()) return false;
    if (!issue(step, in_place, 0) || !synchronize()) return false;
    verify::Mismatch m;
    int64_t differs = 0;
    if (approx_.enabled && compressible(step.dtype, step.op < 0 ? ncclSum : step.op)) {
      if (step.approx == nullptr)
        step.approx = std::make_unique<ApproxChecker>(v, approx_);
      m = step.approx->check(rank_, p.recv);
      if (!check_same_everywhere(step, p, &differs)) return false;
    } else {
      m = v.check(rank_, p.recv);
    }
    if (m.wrong > 0) {
      fmt::print(stderr, "# rank {}: {} {} {} {} bytes {}: {} of {} elements wrong:{}\n", rank_,
                 coll_call_, dtype_name(step.dtype), op_name(step.op), step.bytes,
                 placement_name(in_place), m.wrong, v.output_count(rank_), m.first);
    }
    if (differs != 0) {
      fmt::print(stderr, "# rank {}: {} {} {} {} bytes {}: result differs from rank 0's\n", rank_,
                 coll_call_, dtype_name(step.dtype), op_name(step.op), step.bytes,
                 placement_name(in_place));
    }
    if (!sum_over_ranks(static_cast<int64_t>(m.wrong) + differs, wrong)) return false;
    if (*wrong > 0) {
      any_wrong_ = true;
      break;
    }
  }
  return true;
}

RankRunner::Placed RankRunner::place(const Step& step, bool in_place, int64_t iteration) const {
  // As nccl-tests, successive iterations use successive slices of the buffers, so that the
  // timing is not of one cache-resident slice.
  const size_t eb = step.element_bytes;
  const size_t total = std::max(step.layout.send_count, step.layout.recv_count) * eb;
  const size_t slots = total > 0 ? std::max<size_t>(options_.max_bytes / total, 1) : 1;
  const size_t shift = total * (static_cast<size_t>(iteration) % slots);
  unsigned char* send = send_.data + shift;
  unsigned char* recv = recv_.data + shift;
  if (!in_place) return {send, recv};
  const size_t rank = static_cast<size_t>(rank_);
  return {recv + step.layout.send_inplace_offset * rank * eb,
          recv + step.layout.recv_inplace_offset * rank * eb};
}

bool RankRunner::issue(const Step& step, bool in_place, int64_t iteration) {
  Placed p = place(step, in_place, iteration);
  CallArgs a;
  a.send = p.send;
  a.recv = p.recv;
  a.count = step.layout.param_count;
  a.dtype = step.dtype;
  a.op = step.nccl_op;
  a.root = step.root < 0 ? 0 : step.root;
  a.rank = rank_;
  a.nranks = nranks_;
  a.comm = comm_;
  a.stream = stream_;
  a.compressor = compressor_;
  if (compressor_ != nullptr) return ok(coll_.issue_compressed(a), coll_call_.c_str());
  return ok(coll_.issue(a), coll_call_.c_str());
}

bool RankRunner::reset_compressor() {
  if (compressor_ == nullptr) return true;
  // A new compressor rather than chorusCompressorReset: after a call on a Chorus stream and
  // chorusStreamSynchronize, Reset still answers "1 call(s) using this compressor are still
  // queued" (seen for 15 s and more; with the NULL stream it works): the finished call's hold
  // on the compressor lasts until the next call on that stream. Destroy lets queued calls keep what they need, so a fresh
  // compressor is a reset whatever still holds the old one.
  ncclResult_t r = chorusCompressorDestroy(compressor_);
  compressor_ = nullptr;
  return ok(r, "chorusCompressorDestroy") && create_compressor();
}

bool RankRunner::create_compressor() {
  const CompressOptions& c = options_.compress;
  chorusCompressConfig_t config = CHORUS_COMPRESS_CONFIG_INIT;
  config.format = c.format;
  config.blockSize = c.block;
  config.scaleKind = c.scale;
  config.rounding = c.rounding;
  config.errorFeedback = c.error_feedback;
  config.policy = c.policy;
  return ok(chorusCompressorCreate(&config, &compressor_), "chorusCompressorCreate");
}

bool RankRunner::check_same_everywhere(const Step& step, const Placed& p, int64_t* differs) {
  *differs = 0;
  // ReduceScatter leaves each rank a different block: nothing to compare.
  if (coll_.coll != verify::Coll::kAllReduce && coll_.coll != verify::Coll::kAllGather)
    return true;
  const uint64_t mine =
      hash_bytes(p.recv, step.verifier->output_count(rank_) * step.element_bytes);
  uint64_t root = mine;
  if (!ok(ncclBroadcast(&root, &root, 1, ncclUint64, 0, comm_, nullptr),
          "ncclBroadcast (result hash)"))
    return false;
  *differs = root != mine ? 1 : 0;
  return true;
}

bool RankRunner::read_counters(chorusByteCounters_t* counters) {
  return ok(chorusCommGetByteCounters(comm_, -1, counters), "chorusCommGetByteCounters");
}

bool RankRunner::count_bytes(const chorusByteCounters_t& before) {
  chorusByteCounters_t after{};
  if (!read_counters(&after)) return false;
  wire_bytes_ += after.wireBytesSent - before.wireBytesSent;
  data_bytes_ += after.dataBytesSent - before.dataBytesSent;
  return true;
}

bool RankRunner::report_bytes() {
  unsigned long long sums[2] = {wire_bytes_, data_bytes_};
  if (!ok(ncclAllReduce(sums, sums, 2, ncclUint64, ncclSum, comm_, nullptr),
          "ncclAllReduce (byte counters over ranks)"))
    return false;
  if (reporter_ != nullptr) reporter_->bytes(sums[0], sums[1]);
  return true;
}

bool RankRunner::synchronize() {
  return stream_ == nullptr || ok(chorusStreamSynchronize(stream_), "chorusStreamSynchronize");
}

bool RankRunner::barrier() {
  int32_t token = 0;
  return ok(ncclAllReduce(&token, &token, 1, ncclInt32, ncclSum, comm_, nullptr),
            "ncclAllReduce (barrier)");
}

bool RankRunner::combine_time(double seconds, double* combined) {
  *combined = seconds;
  if (options_.average == 0) return true;  // rank 0's own time: rank 0 is who prints it
  ncclRedOp_t op = options_.average == 1 ? ncclSum : options_.average == 2 ? ncclMin : ncclMax;
  if (!ok(ncclAllReduce(combined, combined, 1, ncclFloat64, op, comm_, nullptr),
          "ncclAllReduce (time over ranks)"))
    return false;
  if (options_.average == 1) *combined /= nranks_;
  return true;
}

bool RankRunner::sum_over_ranks(int64_t value, int64_t* sum) {
  *sum = value;
  return ok(ncclAllReduce(sum, sum, 1, ncclInt64, ncclSum, comm_, nullptr),
            "ncclAllReduce (#wrong over ranks)");
}

}  // namespace chorus::bench
