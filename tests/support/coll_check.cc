// SPDX-License-Identifier: Apache-2.0
// File: tests/support/coll_check.cc
// Places a case's buffers (in place or not), fills the inputs from the shared verifiable
// generator, makes the call and compares the receive buffer with the expected output.
#include "support/coll_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace chorus::test {

namespace {

using verify::Verifier;

// With CHORUS_TEST_REGISTERED=1 the buffers come from ncclMemAlloc and every call runs on
// buffers registered with the comm (ncclCommRegister around the call): registered memory's
// transfers (one copy through a mapping, over shared memory) get the whole matrix.
bool registered_buffers() {
  static const bool on = [] {
    const char* v = std::getenv("CHORUS_TEST_REGISTERED");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// Grows a per-thread buffer without zeroing it (the inputs are written before use).
struct Buffer {
  unsigned char* data = nullptr;
  size_t bytes = 0;
  bool nccl = false;  // from ncclMemAlloc
  ~Buffer() { release(); }
  void release() {
    if (data == nullptr) return;
    if (nccl) {
      (void)ncclMemFree(data);
    } else {
      delete[] data;
    }
    data = nullptr;
  }
};
thread_local Buffer t_buf_a, t_buf_b;

unsigned char* sized(Buffer& b, size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  if (b.bytes < bytes) {
    b.release();
    b.nccl = registered_buffers();
    void* p = nullptr;
    if (b.nccl && ncclMemAlloc(&p, bytes) == ncclSuccess) {
      b.data = static_cast<unsigned char*>(p);
    } else {
      b.nccl = false;
      b.data = new unsigned char[bytes];
    }
    b.bytes = bytes;
  }
  return b.data;
}

// Registers the per-thread buffers with `comm` for the scope of one call.
class Registration {
 public:
  explicit Registration(ncclComm_t comm) : comm_(comm) {
    if (!registered_buffers()) return;
    for (Buffer* b : {&t_buf_a, &t_buf_b}) {
      void* h = nullptr;
      if (b->data != nullptr && ncclCommRegister(comm, b->data, b->bytes, &h) == ncclSuccess)
        handles_.push_back(h);
    }
  }
  ~Registration() {
    for (void* h : handles_) (void)ncclCommDeregister(comm_, h);
  }

 private:
  ncclComm_t comm_;
  std::vector<void*> handles_;
};

std::string call_failed(const char* what, ncclResult_t r) {
  return fmt::format("{} returned {} ({}): {}", what, static_cast<int>(r), ncclGetErrorString(r),
                     ncclGetLastError(nullptr));
}

struct Buffers {
  unsigned char* send = nullptr;
  unsigned char* recv = nullptr;
};

// The send and receive buffers of this rank; in place as nccl.h defines it per collective.
Buffers place(const Case& c, int rank, int nranks, size_t element_bytes) {
  const size_t one = c.count * element_bytes;
  const size_t all = one * static_cast<size_t>(nranks);
  const size_t block = one * static_cast<size_t>(rank);
  const bool root = rank == c.root;
  Buffers b;
  switch (c.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kBroadcast:
      b.recv = sized(t_buf_b, one);
      b.send = c.in_place ? b.recv : sized(t_buf_a, one);
      break;
    case Coll::kReduceScatter:
      b.send = sized(t_buf_a, all);
      b.recv = c.in_place ? b.send + block : sized(t_buf_b, one);
      break;
    case Coll::kAllGather:
    case Coll::kGather: {
      bool has_out = c.coll == Coll::kAllGather || root;
      b.recv = sized(t_buf_b, all);
      b.send = c.in_place && has_out ? b.recv + block : sized(t_buf_a, one);
      break;
    }
    case Coll::kAlltoAll:
      b.recv = sized(t_buf_b, all);
      b.send = c.in_place ? b.recv : sized(t_buf_a, all);
      break;
    case Coll::kScatter:
      b.send = sized(t_buf_a, all);
      b.recv = c.in_place && root ? b.send + block : sized(t_buf_b, one);
      break;
    case Coll::kSendRecv:
      b.send = sized(t_buf_a, one);
      b.recv = sized(t_buf_b, one);
      break;
  }
  return b;
}

// Each rank sends to rank+1 and receives from rank-1 in one group, alternating the order of
// the two calls across ranks: any order must work inside a group.
ncclResult_t send_recv(const Case& c, const Buffers& b, int rank, int nranks, ncclComm_t comm) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  ncclResult_t r = ncclGroupStart();
  if (rank % 2 == 0) {
    if (r == ncclSuccess) r = ncclSend(b.send, c.count, c.dtype, next, comm, c.stream);
    if (r == ncclSuccess) r = ncclRecv(b.recv, c.count, c.dtype, prev, comm, c.stream);
  } else {
    if (r == ncclSuccess) r = ncclRecv(b.recv, c.count, c.dtype, prev, comm, c.stream);
    if (r == ncclSuccess) r = ncclSend(b.send, c.count, c.dtype, next, comm, c.stream);
  }
  ncclResult_t e = ncclGroupEnd();
  return r == ncclSuccess ? e : r;
}

ncclResult_t issue(const Case& c, const Buffers& b, ncclRedOp_t op, int rank, int nranks,
                   ncclComm_t comm) {
  const size_t n = c.count;
  switch (c.coll) {
    case Coll::kAllReduce: return ncclAllReduce(b.send, b.recv, n, c.dtype, op, comm, c.stream);
    case Coll::kReduce: return ncclReduce(b.send, b.recv, n, c.dtype, op, c.root, comm, c.stream);
    case Coll::kBroadcast: return ncclBroadcast(b.send, b.recv, n, c.dtype, c.root, comm, c.stream);
    case Coll::kReduceScatter:
      return ncclReduceScatter(b.send, b.recv, n, c.dtype, op, comm, c.stream);
    case Coll::kAllGather: return ncclAllGather(b.send, b.recv, n, c.dtype, comm, c.stream);
    case Coll::kGather: return ncclGather(b.send, b.recv, n, c.dtype, c.root, comm, c.stream);
    case Coll::kAlltoAll: return ncclAlltoAll(b.send, b.recv, n, c.dtype, comm, c.stream);
    case Coll::kScatter: return ncclScatter(b.send, b.recv, n, c.dtype, c.root, comm, c.stream);
    case Coll::kSendRecv: return send_recv(c, b, rank, nranks, comm);
  }
  return ncclInvalidArgument;
}

std::string run_checked(ncclComm_t comm, const Case& c, const Verifier& v, int rank,
                        ncclRedOp_t op) {
  const int nranks = v.shape().nranks;
  Buffers b = place(c, rank, nranks, v.element_bytes());
  v.fill_input(rank, b.send, 0, v.input_count(rank));
  Registration registration(comm);
  ncclResult_t r = issue(c, b, op, rank, nranks, comm);
  if (r == ncclSuccess && c.stream != nullptr) r = chorusStreamSynchronize(c.stream);
  if (r != ncclSuccess)
    return call_failed(c.coll == Coll::kSendRecv ? "send/recv group" : coll_name(c.coll), r);
  verify::Mismatch m = v.check(rank, b.recv);
  if (m.wrong == 0) return "";
  return fmt::format("{} of {} elements wrong:{}", m.wrong, v.output_count(rank), m.first);
}

}  // namespace

const char* op_name(int op) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return op >= 0 && op < kNumTestOps ? kNames[op] : "?";
}

// nccl-tests spelling, indexed by ncclDataType_t.
constexpr const char* kTypeNames[ncclNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};

std::string Case::describe() const {
  return fmt::format("{} {} {} count={} root={} {}{}", coll_name(coll), kTypeNames[dtype],
                     coll_reduces(coll) ? op_name(op) : "-", count, root,
                     in_place ? "in-place" : "out-of-place", stream ? " stream" : "");
}

std::string run_case(ncclComm_t comm, const Case& c) {
  int rank = 0, nranks = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &nranks);
  auto v = Verifier::create({c.coll, c.dtype, c.op, nranks, c.count, c.root});
  if (v == nullptr) return "bad datatype";
  ncclRedOp_t op = static_cast<ncclRedOp_t>(c.op);
  if (c.op == kPreMulSum) {
    alignas(8) unsigned char scalar[8];
    v->encode_scalar(rank, scalar);
    ncclResult_t r = ncclRedOpCreatePreMulSum(&op, scalar, c.dtype, ncclScalarHostImmediate, comm);
    if (r != ncclSuccess) return call_failed("ncclRedOpCreatePreMulSum", r);
  }
  std::string result = run_checked(comm, c, *v, rank, op);
  if (c.op == kPreMulSum) ncclRedOpDestroy(op, comm);
  return result;
}

std::vector<ncclDataType_t> all_datatypes() {
  // CHORUS_TEST_DATATYPES=float,int8 narrows the matrices (the sanitizer runs use it: the
  // transports and algorithms do not depend on the datatype beyond its size).
  const char* only = std::getenv("CHORUS_TEST_DATATYPES");
  std::string list = only != nullptr ? fmt::format(",{},", only) : "";
  std::vector<ncclDataType_t> v;
  for (int t = 0; t < ncclNumTypes; ++t) {
    if (list.size() <= 2 || list.find(fmt::format(",{},", kTypeNames[t])) != std::string::npos)
      v.push_back(static_cast<ncclDataType_t>(t));
  }
  if (v.empty()) {
    fmt::print(stderr, "CHORUS_TEST_DATATYPES={} names no datatype (int8 ... f8e5m2)\n", only);
    std::abort();
  }
  return v;
}

std::vector<size_t> matrix_counts() { return {0, 1, 7, 1023, (size_t{1} << 20) + 3}; }

}  // namespace chorus::test
