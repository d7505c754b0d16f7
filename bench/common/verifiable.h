// SPDX-License-Identifier: Apache-2.0
// File: bench/common/verifiable.h
// Verifiable inputs and exact expected outputs for one collective call, as nccl-tests'
// "verifiable" module provides: inputs are small integers chosen per datatype, operator and
// rank count so that every partial result is exactly representable, whatever order an
// algorithm reduces in. Shared by the tests (tests/support/coll_check) and bench/coll.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chorus::verify {

enum class Coll {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv,  // each rank sends to rank+1 and receives from rank-1, in one group
};
const char* coll_name(Coll c);  // "AllReduce", ...
bool coll_reduces(Coll c);
bool coll_rooted(Coll c);

// Operators: 0..4 are the built-in ncclRedOp_t; kPreMulSum is a PreMulSum whose scalar is
// premul_scalar(rank) (1 on even ranks, 2 on odd ones), as in nccl-tests.
inline constexpr int kPreMulSum = 5;
inline constexpr int kNumOps = 6;
int premul_scalar(int rank);

// Bytes per element of t, or 0 for a value outside ncclDataType_t.
size_t datatype_size(ncclDataType_t t);

// One collective call as every rank makes it. count is the count argument of the call (per
// rank or per peer, as nccl.h defines it); op is ignored unless the collective reduces.
struct CallShape {
  Coll coll = Coll::kAllReduce;
  ncclDataType_t dtype = ncclFloat;
  int op = ncclSum;
  int nranks = 1;
  size_t count = 0;
  int root = 0;
};

// Result of comparing an output buffer with its expected contents.
struct Mismatch {
  size_t wrong = 0;   // elements that differ bit-wise from the expected value
  std::string first;  // " [i]: got G want W;" for the first few of them
};

// Generates rank inputs and expected outputs of one CallShape. Input element i of rank r is a
// pure function of (datatype, pattern, nranks, r, i), so any rank can compute any other rank's
// input, and the expected output is exact (0 ULP tolerance, Avg included: integer types sum
// and then divide by nranks in the type; floating types divide the exact sum in fp32, fp64 for
// double, and round once). Thread-compatible: const methods may run concurrently.
class Verifier {
 public:
  // nullptr if shape.dtype is not a datatype or shape.nranks < 1.
  static std::unique_ptr<Verifier> create(const CallShape& shape);
  virtual ~Verifier() = default;

  const CallShape& shape() const { return shape_; }
  size_t element_bytes() const { return element_bytes_; }

  // Elements of rank's send buffer the call reads: count, or count * nranks for
  // ReduceScatter, AlltoAll and (on root) Scatter; 0 for Scatter's non-root ranks.
  size_t input_count(int rank) const;
  // Elements of rank's receive buffer the call defines: count, or count * nranks for AllGather,
  // AlltoAll and (on root) Gather; 0 for Reduce's and Gather's non-root ranks.
  size_t output_count(int rank) const;

  // Writes input elements [first, first + n) of rank into buf.
  virtual void fill_input(int rank, void* buf, size_t first, size_t n) const = 0;
  // Writes the expected receive-buffer elements [first, first + n) of rank into buf.
  virtual void fill_expected(int rank, void* buf, size_t first, size_t n) const = 0;
  // Writes rank's PreMulSum scalar, encoded in the datatype, to out (element_bytes() bytes).
  virtual void encode_scalar(int rank, void* out) const = 0;
  // The value of one element of the datatype, for messages.
  virtual double decode(const void* element) const = 0;

  // Compares got (output_count(rank) elements) with the expected output of rank.
  Mismatch check(int rank, const void* got, int max_reported = 3) const;

 protected:
  explicit Verifier(const CallShape& shape, size_t element_bytes)
      : shape_(shape), element_bytes_(element_bytes) {}

 private:
  CallShape shape_;
  size_t element_bytes_;
};

}  // namespace chorus::verify
