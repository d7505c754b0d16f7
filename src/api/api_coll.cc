// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_coll.cc
// The collective and point-to-point entry points, and group calls: validate, then submit.
#include <chorus/compress.h>
#include <nccl.h>

#include "api/api_util.h"
#include "compress/compressor.h"
#include "core/group.h"

namespace chorus::api {
namespace {

struct CallSpec {
  CollKind kind;
  bool reduces;          // takes an op
  bool rooted;           // takes a root (or a peer for send/recv)
  size_t send_blocks;    // send buffer = count * this (kN: nranks; 0: no send buffer)
  size_t recv_blocks;    // receive buffer = count * this (kN: nranks; 0: no receive buffer)
  bool send_root_only;   // sendbuff only read at the root
  bool recv_root_only;   // recvbuff only written at the root
};

constexpr size_t kN = ~size_t{0};  // stands for nranks
constexpr CallSpec kAllReduce{CollKind::kAllReduce, true, false, 1, 1, false, false};
constexpr CallSpec kReduceScatter{CollKind::kReduceScatter, true, false, kN, 1, false, false};
constexpr CallSpec kAllGather{CollKind::kAllGather, false, false, 1, kN, false, false};
constexpr CallSpec kAlltoAll{CollKind::kAlltoAll, false, false, kN, kN, false, false};
constexpr CallSpec kBroadcast{CollKind::kBroadcast, false, true, 1, 1, true, false};
constexpr CallSpec kReduce{CollKind::kReduce, true, true, 1, 1, false, true};
constexpr CallSpec kGather{CollKind::kGather, false, true, 1, kN, false, true};
constexpr CallSpec kScatter{CollKind::kScatter, false, true, kN, 1, true, false};
constexpr CallSpec kSend{CollKind::kSend, false, true, 1, 0, false, false};
constexpr CallSpec kRecv{CollKind::kRecv, false, true, 0, 1, false, false};

// datatype and op: the caller's ncclDataType_t and ncclRedOp_t as ints (enum_bits).
// `compressor`: for a compressed call (chorus*Compressed), else null.
Status validate_and_submit(const CallSpec& spec, const void* sendbuff, void* recvbuff,
                           size_t count, int datatype, int op, int root,
                           const std::shared_ptr<Comm>& comm, cudaStream_t stream,
                           const std::shared_ptr<compress::Compressor>& compressor) {
  if (comm->state() == Comm::State::kRevoked)
    return invalid_usage("{} was revoked; only destroy, split and shrink are allowed",
                         comm->describe());
  CHORUS_RETURN_IF_ERROR(check_datatype(datatype));
  const int n = comm->nranks();
  CollCall call;
  call.kind = spec.kind;
  call.sendbuf = sendbuff;
  call.recvbuf = recvbuff;
  call.count = count;
  call.dtype = static_cast<DataType>(datatype);
  if (spec.reduces) {
    CHORUS_ASSIGN_OR_RETURN(call.op, resolve_op(*comm, op, datatype));
  }
  if (spec.rooted) {
    bool p2p = spec.kind == CollKind::kSend || spec.kind == CollKind::kRecv;
    CHORUS_RETURN_IF_ERROR(check_rank(p2p ? "peer" : "root", root, n));
    call.root = root;
  }
  size_t send_mult = spec.send_blocks == kN ? n : spec.send_blocks;
  size_t recv_mult = spec.recv_blocks == kN ? n : spec.recv_blocks;
  CHORUS_RETURN_IF_ERROR(check_size(count, datatype, std::max(send_mult, recv_mult)));
  bool is_root = spec.rooted && comm->rank() == root;
  if (count > 0) {
    bool need_send = spec.send_blocks != 0 && (!spec.send_root_only || is_root) &&
                     spec.kind != CollKind::kRecv;
    bool need_recv = spec.recv_blocks != 0 && (!spec.recv_root_only || is_root) &&
                     spec.kind != CollKind::kSend;
    if (need_send && sendbuff == nullptr)
      return invalid_argument("sendbuff is NULL but count is {}", count);
    if (need_recv && recvbuff == nullptr)
      return invalid_argument("recvbuff is NULL but count is {}", count);
    const size_t elem = datatype_size(call.dtype);
    if (need_send) call.send_bytes = count * elem * send_mult;
    if (need_recv) call.recv_bytes = count * elem * recv_mult;
  }
  if (compressor) {
    CHORUS_RETURN_IF_ERROR(compress::check_call(call.kind, call.dtype, call.op.kind));
    compress::Compressor::Binding b;
    b.kind = call.kind;
    b.elements = count * send_mult;
    b.dtype = call.dtype;
    b.comm_uid = comm->uid();
    b.rank = comm->rank();
    b.nranks = n;
    CHORUS_RETURN_IF_ERROR(compressor->bind(b));
    call.compressor = std::make_shared<compress::CompressorHold>(compressor);
  }
  CHORUS_ASSIGN_OR_RETURN(Stream* s, find_stream(stream));
  return submit_call(comm, call, s);
}

ncclResult_t coll(const char* name, const CallSpec& spec, const void* sendbuff, void* recvbuff,
                  size_t count, int datatype, int op, int root,
                  ncclComm_t comm, cudaStream_t stream,
                  chorusCompressor_t compressor = nullptr, bool compressed = false) {
  return guard(name, [&]() -> Status {
    auto c = usable_comm(comm);
    Result<std::shared_ptr<compress::Compressor>> comp = std::shared_ptr<compress::Compressor>();
    if (compressed) comp = find_compressor(compressor);
    Status s = !c.ok()     ? c.take_status()
               : !comp.ok() ? comp.take_status()
                            : validate_and_submit(spec, sendbuff, recvbuff, count, datatype, op,
                                                  root, *c, stream, *comp);
    // Name the rank, unless the message already does (failures of the operation itself).
    if (!s.ok() && c.ok() && s.message().find((*c)->describe()) == std::string::npos)
      s.with_context((*c)->describe());
    if (!s.ok()) group_fail(s);
    return s;
  });
}

}  // namespace
}  // namespace chorus::api

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

CHORUS_NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return coll("ncclAllReduce", kAllReduce, sendbuff, recvbuff, count, enum_bits(datatype),
              enum_bits(op), -1, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff,
                size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return coll("ncclReduceScatter", kReduceScatter, sendbuff, recvbuff, recvcount,
              enum_bits(datatype), enum_bits(op), -1, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff,
                size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclAllGather", kAllGather, sendbuff, recvbuff, sendcount, enum_bits(datatype),
              ncclSum, -1, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count,
                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclAlltoAll", kAlltoAll, sendbuff, recvbuff, count, enum_bits(datatype), ncclSum,
              -1, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
                ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return coll("ncclBroadcast", kBroadcast, sendbuff, recvbuff, count, enum_bits(datatype), ncclSum,
              root, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclBcast", kBroadcast, buff, buff, count, enum_bits(datatype), ncclSum, root, comm,
              stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
                ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return coll("ncclReduce", kReduce, sendbuff, recvbuff, count, enum_bits(datatype), enum_bits(op),
              root, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count,
                ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclGather", kGather, sendbuff, recvbuff, count, enum_bits(datatype), ncclSum, root,
              comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count,
                ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  return coll("ncclScatter", kScatter, sendbuff, recvbuff, count, enum_bits(datatype), ncclSum,
              root, comm, stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count,
                ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclSend", kSend, sendbuff, nullptr, count, enum_bits(datatype), ncclSum, peer, comm,
              stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype,
                int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclRecv", kRecv, nullptr, recvbuff, count, enum_bits(datatype), ncclSum, peer, comm,
              stream);
}

CHORUS_NCCL_API(ncclResult_t, ncclGroupStart, void);
ncclResult_t ncclGroupStart(void) {
  return guard("ncclGroupStart", [] { return group_start(); });
}

CHORUS_NCCL_API(ncclResult_t, ncclGroupEnd, void);
ncclResult_t ncclGroupEnd(void) {
  return guard("ncclGroupEnd", [] { return group_end(); });
}

CHORUS_NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return guard("ncclGroupSimulateEnd", [&]() -> Status {
    if (simInfo == nullptr) return invalid_argument("simInfo is NULL");
    if (simInfo->magic != 0x74685283u)
      return invalid_argument("simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER");
    float us = 0;
    CHORUS_RETURN_IF_ERROR(group_simulate_end(&us));
    simInfo->estimatedTime = us;
    return Status();
  });
}

CHORUS_API ncclResult_t chorusAllReduceCompressed(const void* sendbuff, void* recvbuff,
                                                  size_t count, ncclDataType_t datatype,
                                                  ncclRedOp_t op, chorusCompressor_t compressor,
                                                  ncclComm_t comm, cudaStream_t stream) {
  return coll("chorusAllReduceCompressed", kAllReduce, sendbuff, recvbuff, count,
              enum_bits(datatype), enum_bits(op), -1, comm, stream, compressor, true);
}

CHORUS_API ncclResult_t chorusReduceScatterCompressed(const void* sendbuff, void* recvbuff,
                                                      size_t recvcount, ncclDataType_t datatype,
                                                      ncclRedOp_t op,
                                                      chorusCompressor_t compressor,
                                                      ncclComm_t comm, cudaStream_t stream) {
  return coll("chorusReduceScatterCompressed", kReduceScatter, sendbuff, recvbuff, recvcount,
              enum_bits(datatype), enum_bits(op), -1, comm, stream, compressor, true);
}

CHORUS_API ncclResult_t chorusAllGatherCompressed(const void* sendbuff, void* recvbuff,
                                                  size_t sendcount, ncclDataType_t datatype,
                                                  chorusCompressor_t compressor, ncclComm_t comm,
                                                  cudaStream_t stream) {
  return coll("chorusAllGatherCompressed", kAllGather, sendbuff, recvbuff, sendcount,
              enum_bits(datatype), ncclSum, -1, comm, stream, compressor, true);
}
