// SPDX-License-Identifier: Apache-2.0
// File: src/ep/moves.h
// What a normal-mode dispatch or combine moves (Buffer::DispatchMove, Buffer::CombineMove) and
// how it lays its data out: element sizes, a token's record on the wire, where combine's
// weights start in a staging area, and the pieces that cross-host messages travel in. Shared
// by buffer.cc, dispatch.cc and combine.cc.
#pragma once

#include <chorus/ep.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/params.h"
#include "ep/buffer.h"

namespace chorus::ep {

inline size_t elem_size(int datatype) {
  return datatype == ncclFloat32 ? 4 : datatype == ncclBfloat16 ? 2 : 1;
}
inline size_t align8(size_t v) { return (v + 7) / 8 * 8; }
// Where combine's weights start in a staging area after `rows` rows of `row` bytes (8-byte
// aligned: BF16 rows may be odd-sized).
inline size_t combine_weights_at(size_t rows, size_t row) { return align8(rows * row); }

// Dispatch's records and combine's rows between a pair of ranks on different hosts travel in
// pieces of about CHORUS_EP_PIECE_BYTES, at most kMaxPieces: the receiver unpacks or sums what
// the first pieces brought while the later ones travel. Both ends compute it from the same
// count of items of `item` bytes.
inline constexpr size_t kMaxPieces = 16;
inline size_t piece_count(size_t items, size_t item) {
  const auto piece = static_cast<size_t>(params::kEpPieceBytes.get());
  return std::clamp<size_t>(items * item / piece, 1, std::min(kMaxPieces, std::max<size_t>(items, 1)));
}
// Items [first, last) of piece p (< piece_count(items, item)).
inline std::pair<size_t, size_t> piece_items(size_t items, size_t item, size_t p) {
  const size_t n = piece_count(items, item);
  return {items * p / n, items * (p + 1) / n};
}

// One dispatched token on the wire: x, its FP8 scales, topk int64 indices, topk float weights.
inline size_t record_bytes(size_t hidden, size_t elem, int topk) {
  const size_t scales = elem == 1 ? hidden / CHORUS_EP_FP8_BLOCK * sizeof(float) : 0;
  return align8(hidden * elem + scales +
                static_cast<size_t>(topk) * (sizeof(int64_t) + sizeof(float)));
}

struct Buffer::DispatchMove : Move {
  chorusEpDispatchArgs_t args{};
  chorusEpDispatchOutput_t out{};  // the caller's output arrays
  size_t elem = 0, record = 0, num_recv = 0;
  std::shared_ptr<const Handle> handle;  // the tokens for each rank
  // This rank's tokens for each host's forwarder (PeerAreas::forwarder), ascending.
  std::vector<std::vector<size_t>> forwarded_tokens;
  // Row s (`width` = nranks + hosts wide): the tokens rank s sends to each rank, then to each
  // forwarder.
  std::vector<int64_t> counts;
  size_t width = 0;
  uint64_t step = 0;
  // What this rank receives to forward: `count` records of rank `source` at record `first` of
  // the forward area.
  struct Forwarded {
    size_t source, first, count;
  };
  std::vector<Forwarded> forwarded;
  char* forward_area = nullptr;
  // This rank's own records in the receive area, unpacked by early() (an empty range when not).
  std::pair<size_t, size_t> own_records{0, 0};

  // Tokens rank s sends to rank q.
  size_t to_rank(size_t s, size_t q) const { return static_cast<size_t>(counts[s * width + q]); }
  // Where rank q reads the records of rank s: after those of the ranks below s.
  size_t read_at(size_t s, size_t q) const {
    size_t at = 0;
    for (size_t j = 0; j < s; ++j) at += to_rank(j, q);
    return at;
  }
};

struct Buffer::CombineMove : Move {
  std::shared_ptr<const Handle> handle;
  const void* x = nullptr;
  bool bf16 = false;
  bool with_weights = false;
  const float* topk_weights = nullptr;
  void* combined_x = nullptr;
  float* combined_weights = nullptr;
  uint64_t step = 0;
};

}  // namespace chorus::ep
