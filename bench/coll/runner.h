// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/runner.h
// One rank of a benchmark, run on its own thread: creates the communicator, then for each
// datatype x operator x root and each message size times the out-of-place and in-place calls
// and checks their results, exactly as every other rank does (the calls are collective).
#pragma once

#include <chorus/compress.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bench/coll/approx.h"
#include "bench/coll/collective.h"
#include "bench/coll/job.h"
#include "bench/coll/report.h"
#include "bench/common/verifiable.h"

namespace chorus::bench {

class RankRunner {
 public:
  // reporter is non-null on the job's rank 0 only: it prints the table.
  RankRunner(Job& job, int local, Reporter* reporter);
  ~RankRunner();
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  // Runs every test; false when a check found wrong elements, or when this rank or another
  // rank of the process failed (the cause went to Job::fail).
  bool run();

 private:
  // Page-aligned host memory, every page touched once, so no page fault lands in a timing.
  // With -R 1 the memory comes from ncclMemAlloc and is registered on the comm; with -R 2 it
  // is a symmetric window as well (ncclCommWindowRegister, collective: every rank calls it).
  struct Buffer {
    unsigned char* data = nullptr;
    size_t bytes = 0;
    bool nccl_memory = false;  // from ncclMemAlloc (else aligned_alloc)
    void* handle = nullptr;    // ncclCommRegister's
    ncclWindow_t window = nullptr;  // ncclCommWindowRegister's (-R 2)
  };
  // One datatype x operator x root at one message size.
  struct Step {
    ncclDataType_t dtype = ncclFloat;
    int op = -1;    // -1: the collective does not reduce
    int root = -1;  // -1: it has no root
    ncclRedOp_t nccl_op = ncclSum;
    size_t bytes = 0;
    size_t element_bytes = 0;
    Layout layout;
    std::unique_ptr<verify::Verifier> verifier;
    // --compress: the error bound, made by the first check of the step.
    mutable std::unique_ptr<ApproxChecker> approx;
  };
  // Where one call reads and writes.
  struct Placed {
    unsigned char* send = nullptr;
    unsigned char* recv = nullptr;
  };

  bool ok(ncclResult_t r, const char* what);
  bool setup();
  bool allocate(Buffer* buffer, size_t bytes);
  void release(Buffer* buffer);
  bool exchange_rank_info(std::vector<RankInfo>* ranks);
  bool run_tests();
  bool time_test(ncclDataType_t dtype, int op, int root);
  bool warm_up(ncclDataType_t dtype, int op, int root, ncclRedOp_t nccl_op);
  bool make_step(ncclDataType_t dtype, int op, int root, ncclRedOp_t nccl_op, size_t bytes,
                 Step* step);
  bool bench_size(const Step& step, Row* row);
  bool bench_placement(const Step& step, bool in_place, Placement* result);
  bool time_iterations(const Step& step, bool in_place, double* seconds);
  // One timed iteration: -m calls, in one group when there are several.
  bool issue_aggregated(const Step& step, bool in_place, int iteration);
  bool check_results(const Step& step, bool in_place, int64_t* wrong);
  // --compress: whether every rank's output equals rank 0's, bit for bit; *differs is 1 if not.
  bool check_same_everywhere(const Step& step, const Placed& p, int64_t* differs);
  // --compress: a compressor with --compress's settings, and a fresh one in its place (an
  // unbound, zero residual: between sizes, before checks).
  bool create_compressor();
  bool reset_compressor();
  // Adds what the communicator's byte counters moved since *before to wire_/data_.
  bool count_bytes(const chorusByteCounters_t& before);
  bool read_counters(chorusByteCounters_t* counters);
  // Sums wire_/data_ over ranks and hands them to the reporter.
  bool report_bytes();
  bool issue(const Step& step, bool in_place, int64_t iteration);
  Placed place(const Step& step, bool in_place, int64_t iteration) const;
  bool synchronize();
  bool barrier();
  bool combine_time(double seconds, double* combined);
  bool sum_over_ranks(int64_t value, int64_t* sum);
  bool create_op(ncclDataType_t dtype, int op, ncclRedOp_t* nccl_op);
  void teardown();

  Job& job_;
  const Options& options_;
  const Collective& coll_;
  int local_;
  int rank_;
  int nranks_;
  Reporter* reporter_;
  ncclComm_t comm_ = nullptr;  // owned by job_ once adopted
  cudaStream_t stream_ = nullptr;
  Buffer send_;
  Buffer recv_;
  std::string coll_call_;  // "ncclAllReduce", for messages
  chorusCompressor_t compressor_ = nullptr;  // --compress
  // --compress's settings, or CHORUS_COMPRESS's (transparent mode): the results of
  // compressible calls are checked against the FP8 error bound. enabled: false otherwise.
  CompressOptions approx_;
  // Timed calls only: bytes on the wire and what they stand for, from the byte counters.
  unsigned long long wire_bytes_ = 0;
  unsigned long long data_bytes_ = 0;
  bool any_wrong_ = false;
};

}  // namespace chorus::bench
