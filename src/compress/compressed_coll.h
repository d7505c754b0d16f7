// SPDX-License-Identifier: Apache-2.0
// File: src/compress/compressed_coll.h
// The compressed collectives (include/chorus/compress.h) and where they pay.
//
// Every message is a piece of one shard, quantized by the rank that owns the data: n shards
// cut at codec-block boundaries (AllReduce) or the call's blocks (ReduceScatter, AllGather);
// each shard travels in pieces of whole codec blocks (pipelining: a piece is encoded, sent and,
// on arrival, decoded while the next ones are on the wire).
//   AllReduce:     rank r sends piece q of shard j (its data + residual, quantized) to rank j;
//                  rank j adds the decoded pieces of the n - 1 others to its own exact shard in
//                  fp32 (max/min: folds them), divides for Avg, quantizes the result once and
//                  sends it to everyone; every rank (j too) decodes the same bytes.
//   ReduceScatter: the first half; the fp32 result is rounded once to the datatype.
//   AllGather:     each rank quantizes its block once and sends it to all; all decode it.
// A direct exchange, not a ring: data is quantized twice at most, whatever the rank count.
#pragma once

#include <cstddef>

#include "algo/tuner.h"
#include "compress/compressor.h"
#include "core/op.h"
#include "core/task.h"

namespace chorus::compress {

// Runs `call` (AllReduce, ReduceScatter or AllGather, checked by check_call) compressed.
Task run(OpContext& ctx, const CollCall& call, Compressor& compressor);

// The cross-host stage of the hierarchical AllReduce (algo/all_reduce_hier.cc), compressed:
// an AllReduce of call.count elements among ctx's ranks (in place or not; call.op Sum, Max or
// Min) that are elements [base, base + count) of the tensor whose residual is `residual` (null
// without error feedback; from Compressor::begin_run, which the caller holds).
Task all_reduce_part(OpContext& ctx, const CollCall& call, const Settings& s, float* residual,
                     size_t base);

// Bytes on the wire per byte of `dtype` data with `s` (e.g. 0.258 for fp32, block 128, fp32
// scales).
double wire_ratio(const Settings& s, DataType dtype);
// Predicted microseconds of the compressed `coll` of `bytes` (one rank's whole buffer, as
// algo::predict_us) on `shape`: two exchanges' latency, the compressed bytes over the link and
// the codec passes at the model's codec speed (not overlapped: a pessimistic estimate).
double predict_us(const algo::CostModel& m, CollKind coll, size_t bytes, const algo::Shape& shape,
                  DataType dtype, const Settings& s);
// Whether compressing pays: predict_us, with a 25 % margin, below the tuner's best
// uncompressed algorithm.
bool pays(const algo::CostModel& m, CollKind coll, size_t bytes, const algo::Shape& shape,
          DataType dtype, const Settings& s);

}  // namespace chorus::compress
