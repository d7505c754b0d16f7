// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/approx.h
// The correctness check of the compressed collectives (--compress): their results are the
// exact ones (bench/common/verifiable.h) up to the FP8 quantization error, so each element is
// compared with the exact value within a bound derived from the codec settings and the
// magnitudes of the inputs (see approx.cc for the derivation). A second check, that every rank
// holds bitwise the same result (AllReduce, AllGather), compares a hash of the output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/coll/args.h"
#include "bench/common/verifiable.h"

namespace chorus::bench {

class ApproxChecker {
 public:
  // For the call described by v's shape (AllReduce, ReduceScatter or AllGather of fp32, bf16
  // or fp16) through a compressor configured as c. Precomputes the inputs' magnitudes per
  // block-sized chunk of every rank (the inputs are pure functions of rank and index).
  ApproxChecker(const verify::Verifier& v, const CompressOptions& c);

  // Compares got (v.output_count(rank) elements) with the exact result of rank.
  verify::Mismatch check(int rank, const void* got, int max_reported = 3) const;

  // The bound on |got - exact| for output element o of rank (for tests and messages).
  double tolerance(int rank, size_t o, double exact) const;

  // Relative error of one quantization of a value, as a fraction of its block's largest
  // magnitude: 2^-(m+1) for round-to-nearest with m mantissa bits, 2^-m stochastic.
  static double unit_error(const CompressOptions& c);

 private:
  // The largest |input| of rank r over every element within 2 * block - 2 of input index e.
  double window_max(int r, size_t e) const;

  const verify::Verifier& v_;
  size_t block_;
  double stage_factor_;  // error per unit of summed window maxima, codec and fp32 slack
  double out_rel_;       // half an ulp of the output datatype, relative
  std::vector<std::vector<double>> chunk_max_;  // [rank][chunk of block_ input elements]
};

// The codec settings of CHORUS_COMPRESS's transparent mode (CHORUS_COMPRESS=FP8_E4M3 or
// FP8_E5M2, CHORUS_COMPRESS_BLOCK, CHORUS_COMPRESS_SCALE) when the environment turns it on and
// `coll` is one it applies to (AllReduce, ReduceScatter); enabled is false otherwise.
CompressOptions transparent_compression(verify::Coll coll);

// Whether a call of this datatype and operator can travel compressed (fp32, bf16, fp16; sum,
// avg, max, min).
bool compressible(ncclDataType_t dtype, int op);

// A 64-bit hash of n bytes (not cryptographic: it tells differing outputs apart).
uint64_t hash_bytes(const void* data, size_t n);

}  // namespace chorus::bench
