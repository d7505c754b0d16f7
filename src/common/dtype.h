// SPDX-License-Identifier: Apache-2.0
// File: src/common/dtype.h
// Internal names for NCCL's datatypes, reduction operators and collectives. The numeric values
// equal the ncclDataType_t / ncclRedOp_t ones (checked in src/api), so conversion is a cast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace chorus {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
inline constexpr int kNumDataTypes = 12;

inline bool datatype_valid(int v) { return v >= 0 && v < kNumDataTypes; }

inline size_t datatype_size(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

// nccl-tests spelling: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2.
std::string_view datatype_name(DataType t);

inline bool datatype_is_float(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kFloat32 || t == DataType::kFloat64 ||
         t == DataType::kBfloat16 || t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
}

// Built-in operators; kPreMulSum is what ncclRedOpCreatePreMulSum hands out (as ids >= 5).
enum class RedOpKind : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kPreMulSum = 5 };
inline constexpr int kNumBuiltinOps = 5;

std::string_view redop_name(RedOpKind op);

// The collectives, numbered as NCCL's ncclFunc_t (tuner/profiler ids).
enum class CollKind : int {
  kBroadcast = 0,
  kReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kAllReduce = 4,
  kSendRecv = 5,
  kSend = 6,
  kRecv = 7,
  kAlltoAll = 8,
  kScatter = 9,
  kGather = 10,
  kInternal = 99,  // Chorus's own exchanges (split, shrink)
};

std::string_view coll_name(CollKind c);

}  // namespace chorus
