// SPDX-License-Identifier: Apache-2.0
#include "common/dtype.h"

namespace chorus {

std::string_view datatype_name(DataType t) {
  static constexpr std::string_view kNames[kNumDataTypes] = {
      "int8", "uint8", "int32", "uint32", "int64", "uint64",
      "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  int i = static_cast<int>(t);
  return datatype_valid(i) ? kNames[i] : "invalid";
}

std::string_view redop_name(RedOpKind op) {
  switch (op) {
    case RedOpKind::kSum: return "sum";
    case RedOpKind::kProd: return "prod";
    case RedOpKind::kMax: return "max";
    case RedOpKind::kMin: return "min";
    case RedOpKind::kAvg: return "avg";
    case RedOpKind::kPreMulSum: return "mulsum";
  }
  return "invalid";
}

std::string_view coll_name(CollKind c) {
  switch (c) {
    case CollKind::kBroadcast: return "Broadcast";
    case CollKind::kReduce: return "Reduce";
    case CollKind::kAllGather: return "AllGather";
    case CollKind::kReduceScatter: return "ReduceScatter";
    case CollKind::kAllReduce: return "AllReduce";
    case CollKind::kSendRecv: return "SendRecv";
    case CollKind::kSend: return "Send";
    case CollKind::kRecv: return "Recv";
    case CollKind::kAlltoAll: return "AlltoAll";
    case CollKind::kScatter: return "Scatter";
    case CollKind::kGather: return "Gather";
    case CollKind::kInternal: return "Internal";
  }
  return "Unknown";
}

}  // namespace chorus
