// SPDX-License-Identifier: Apache-2.0
// File: src/compress/compressed_coll.cc
// See compressed_coll.h. Scratch slots: 0 the pieces this rank sends in the first exchange,
// 1 every shard's quantized result (AllReduce, AllGather), 2 the pieces received in the first
// exchange, 3 the fp32 accumulator and a piece-sized temporary.
#include "compress/compressed_coll.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algo/algo.h"
#include "common/log.h"
#include "core/comm.h"
#include "kernels/reduce/reduce.h"

namespace chorus::compress {

namespace {

constexpr size_t kPieceElements = 64 << 10;  // pipelining granularity
// Pieces per shard and exchange at most (a message's ordinal between two ranks wraps at 256).
constexpr size_t kMaxPieces = 32;

// How a buffer of n shards is cut into codec blocks and pieces, and where each shard's
// compressed form lies in a buffer holding all n back to back. Shard j covers elements
// [off(j), off(j) + elems(j)); its piece q starts q * piece_elems() elements into it.
class Layout {
 public:
  Layout(const kernels::BlockCodec& codec, std::vector<size_t> off, std::vector<size_t> elems)
      : codec_(codec), off_(std::move(off)), elems_(std::move(elems)) {
    const size_t B = codec.block;
    size_t max_blocks = 0;
    for (size_t e : elems_) max_blocks = std::max(max_blocks, (e + B - 1) / B);
    size_t piece_blocks = std::max((kPieceElements + B - 1) / B,
                                   (max_blocks + kMaxPieces - 1) / kMaxPieces);
    piece_elems_ = piece_blocks * B;
    piece_cbytes_ = piece_elems_ + piece_blocks * kernels::codec_scale_bytes(codec);
    coff_.resize(elems_.size() + 1, 0);
    for (size_t j = 0; j < elems_.size(); ++j)
      coff_[j + 1] = coff_[j] + kernels::compressed_bytes(codec, elems_[j]);
  }
  // Shards of a buffer cut into n near-equal runs of whole codec blocks (AllReduce).
  static Layout blocks(const kernels::BlockCodec& codec, size_t count, int n) {
    const size_t nb = (count + codec.block - 1) / codec.block;
    std::vector<size_t> off(n), elems(n);
    for (int j = 0; j < n; ++j) {
      off[j] = std::min(count, algo::block_offset(nb, n, j) * codec.block);
      elems[j] = std::min(count, algo::block_offset(nb, n, j + 1) * codec.block) - off[j];
    }
    return Layout(codec, std::move(off), std::move(elems));
  }
  // n shards of `count` elements each (ReduceScatter's input, AllGather's output).
  static Layout equal(const kernels::BlockCodec& codec, size_t count, int n) {
    std::vector<size_t> off(n), elems(n, count);
    for (int j = 0; j < n; ++j) off[j] = count * j;
    return Layout(codec, std::move(off), std::move(elems));
  }

  size_t off(int j) const { return off_[j]; }
  size_t elems(int j) const { return elems_[j]; }
  size_t piece_elems() const { return piece_elems_; }
  int pieces(int j) const {
    return static_cast<int>((elems_[j] + piece_elems_ - 1) / piece_elems_);
  }
  size_t piece_elems(int j, int q) const {
    return std::min(piece_elems_, elems_[j] - q * piece_elems_);
  }
  // Offsets of shard j's compressed form in the all-shards buffer, and of piece q in it.
  size_t coff(int j) const { return coff_[j]; }
  size_t cbytes(int j) const { return coff_[j + 1] - coff_[j]; }
  size_t ctotal() const { return coff_.back(); }
  size_t piece_coff(int q) const { return q * piece_cbytes_; }
  size_t piece_cbytes(int j, int q) const {
    return kernels::compressed_bytes(codec_, piece_elems(j, q));
  }
  int max_pieces() const {
    int m = 0;
    for (size_t j = 0; j < elems_.size(); ++j) m = std::max(m, pieces(static_cast<int>(j)));
    return m;
  }

 private:
  kernels::BlockCodec codec_;
  std::vector<size_t> off_, elems_, coff_;
  size_t piece_elems_ = 0, piece_cbytes_ = 0;
};

// Piece q travels on channel q mod channels (several paths to a peer carry pieces at once).
int lane(const OpContext& ctx, int q) { return q % ctx.channels(); }

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The per-call state of a compressed collective on this rank, and its quantization steps.
class Codec {
 public:
  // `base`: the tensor index of the call's first element (a part of a larger tensor: the
  // hierarchical AllReduce's cross-host stage), for the residual and the random streams.
  Codec(OpContext& ctx, const CollCall& call, const Settings& s, float* residual, size_t base = 0)
      : ctx_(ctx),
        s_(s),
        dtype_(call.dtype),
        esz_(datatype_size(call.dtype)),
        residual_(residual != nullptr ? residual + base : nullptr),
        base_(base),
        tag_seq_(call.tag.seq) {
    const auto& table = kernels::codecs();
    in_ = kernels::BlockCodec{dtype_, s.format, s.scale, s.rounding, s.block};
    f32_ = kernels::BlockCodec{DataType::kFloat32, s.format, s.scale, s.rounding, s.block};
    encode_in_ = kernels::codec_encode_fn(table, in_);
    encode_f32_ = kernels::codec_encode_fn(table, f32_);
    decode_out_ = kernels::codec_decode_fn(table, in_);
    decode_f32_ = kernels::codec_decode_fn(table, f32_);
    accumulate_ = kernels::codec_accumulate_fn(table, f32_);
    to_float_ = kernels::kernels().to_float[static_cast<int>(dtype_)];
    from_float_ = kernels::kernels().from_float[static_cast<int>(dtype_)];
    add_f32_ = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
  }
  const kernels::BlockCodec& codec() const { return in_; }
  size_t esz() const { return esz_; }

  // Element `index` of the quantized tensor draws its stochastic rounding from this stream.
  kernels::RandomStream stream(int phase, size_t index) const {
    uint64_t seed = mix(s_.seed ^ mix((uint64_t{tag_seq_} << 32) ^
                                      (static_cast<uint64_t>(ctx_.rank()) << 2) ^ phase));
    return kernels::RandomStream{seed, base_ + index};
  }

  // Widens m elements of the datatype to fp32.
  void widen(float* dst, const void* src, size_t m) const {
    if (to_float_ == nullptr) std::memcpy(dst, src, m * sizeof(float));
    else to_float_(dst, src, m);
  }
  // Rounds m fp32 values to the datatype.
  void narrow(void* dst, const float* src, size_t m) const {
    if (from_float_ == nullptr) kernels::copy_to_output(dst, src, m * sizeof(float));
    else from_float_(dst, src, m);
  }

  // Quantizes m elements of this rank's data (the datatype) at tensor index `index` into dst,
  // with error feedback when there is a residual. tmp: m floats.
  void quantize_input(void* dst, const char* src, size_t m, size_t index, int phase,
                      float* tmp) const {
    if (residual_ == nullptr) {
      encode_in_(dst, src, m, in_.block, stream(phase, index));
      return;
    }
    widen(tmp, src, m);
    quantize_f32(dst, tmp, m, index, phase);
  }
  // Quantizes m fp32 values (modified: the residual is added) at tensor index `index`.
  void quantize_f32(void* dst, float* x, size_t m, size_t index, int phase) const {
    if (residual_ == nullptr) {
      encode_f32_(dst, x, m, f32_.block, stream(phase, index));
      return;
    }
    float* res = residual_ + index;
    add_f32_(x, x, res, m);
    encode_f32_(dst, x, m, f32_.block, stream(phase, index));
    decode_f32_(res, dst, m, f32_.block);
    for (size_t i = 0; i < m; ++i) res[i] = x[i] - res[i];  // what this quantization dropped
    // A non-finite block (an overflow the loss scaler will skip) must not poison later steps.
    for (size_t i = 0; i < m; ++i)
      if (!(res[i] - res[i] == 0.0f)) res[i] = 0.0f;
  }
  // acc (fp32, m) folds in the decoded piece src: += for Sum/Avg, max/min otherwise.
  void fold(float* acc, const void* src, size_t m, RedOpKind op, float* tmp) const {
    if (op == RedOpKind::kMax || op == RedOpKind::kMin) {
      decode_f32_(tmp, src, m, f32_.block);
      auto fn = kernels::reduce_fn(DataType::kFloat32, op == RedOpKind::kMax
                                                           ? kernels::ReduceOp::kMax
                                                           : kernels::ReduceOp::kMin);
      fn(acc, acc, tmp, m);
      return;
    }
    accumulate_(acc, src, m, f32_.block);
  }
  void decode_out(void* dst, const void* src, size_t m) const {
    decode_out_(dst, src, m, in_.block);
  }

 private:
  OpContext& ctx_;
  Settings s_;
  DataType dtype_;
  size_t esz_;
  float* residual_;
  size_t base_;
  uint32_t tag_seq_;
  kernels::BlockCodec in_, f32_;
  kernels::CodecEncodeFn encode_in_, encode_f32_;
  kernels::CodecDecodeFn decode_out_, decode_f32_;
  kernels::CodecAccumulateFn accumulate_;
  kernels::ConvertFn to_float_, from_float_;
  kernels::ReduceFn add_f32_;
};

// Posts the receives of every peer's pieces of shards `shard_of(peer)` into buf (laid out by
// `slot_of(peer)`), starting at reqs[first]. Returns the next free index.
template <typename ShardOf, typename SlotOf>
size_t post_piece_recvs(OpContext& ctx, const Layout& L, const Codec& c,
                        RequestArray<RecvRequest>& reqs, size_t first, char* buf,
                        ShardOf shard_of, SlotOf slot_of) {
  const int n = ctx.nranks(), r = ctx.rank();
  size_t i = first;
  for (int k = 1; k < n; ++k) {
    const int from = algo::mod(r - k, n), j = shard_of(from);
    for (int q = 0; q < L.pieces(j); ++q, ++i) {
      ctx.recv(reqs[i], from, lane(ctx, q), buf + slot_of(from) + L.piece_coff(q),
               L.piece_cbytes(j, q), L.piece_elems(j, q) * c.esz());
    }
  }
  return i;
}

// The first exchange of AllReduce and ReduceScatter: quantizes and sends piece q of shard t to
// rank t (pieces in rounds, so every peer's first piece leaves first), then folds the pieces
// of this rank's shard from the n - 1 others into acc (fp32, already holding its own data) and
// calls on_piece(q) once piece q of acc is complete.
template <typename OnPiece>
Task reduce_exchange(OpContext& ctx, const Layout& L, const Codec& c, const char* in,
                     RedOpKind op, float* acc, float* tmp, RequestArray<RecvRequest>& recvs,
                     RequestArray<SendRequest>& sends, char* sendbuf, char* recvbuf,
                     OnPiece on_piece) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t esz = c.esz();
  size_t s = 0;
  for (int q = 0; q < L.max_pieces(); ++q) {
    for (int k = 1; k < n; ++k) {
      const int t = algo::mod(r + k, n);
      if (q >= L.pieces(t)) continue;
      const size_t m = L.piece_elems(t, q), index = L.off(t) + q * L.piece_elems();
      char* dst = sendbuf + L.coff(t) + L.piece_coff(q);
      c.quantize_input(dst, in + index * esz, m, index, 0, tmp);
      ctx.send(sends[s++], t, lane(ctx, q), dst, L.piece_cbytes(t, q), m * esz);
    }
    co_await yield_now();  // let the transports move what is posted
  }
  for (int q = 0; q < L.pieces(r); ++q) {
    const size_t m = L.piece_elems(r, q);
    float* a = acc + q * L.piece_elems();
    for (int k = 1; k < n; ++k) {
      const size_t i = static_cast<size_t>(k - 1) * L.pieces(r) + q;
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(recvs[i]));
      c.fold(a, recvbuf + (k - 1) * L.cbytes(r) + L.piece_coff(q), m, op, tmp);
    }
    if (op == RedOpKind::kAvg)
      kernels::divide_fn(DataType::kFloat32)(a, m, static_cast<uint32_t>(n));
    on_piece(q, a, m);
  }
  co_return Status();
}

// Decodes shard j (pieces, each its own compressed buffer) from `results` into `out`.
void decode_shard(const Layout& L, const Codec& c, char* out, const char* results, int j) {
  for (int q = 0; q < L.pieces(j); ++q)
    c.decode_out(out + (L.off(j) + q * L.piece_elems()) * c.esz(),
                 results + L.coff(j) + L.piece_coff(q), L.piece_elems(j, q));
}

// The last exchange of AllReduce and AllGather: waits for every other rank's result pieces,
// received from reqs[first] on in post_piece_recvs' order, and decodes each into `out`.
Task decode_results(OpContext& ctx, const Layout& L, const Codec& c,
                    RequestArray<RecvRequest>& reqs, size_t first, char* out,
                    const char* results) {
  const int n = ctx.nranks(), r = ctx.rank();
  size_t i = first;
  for (int k = 1; k < n; ++k) {
    const int from = algo::mod(r - k, n);
    for (int q = 0; q < L.pieces(from); ++q, ++i) {
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(reqs[i]));
      c.decode_out(out + (L.off(from) + q * L.piece_elems()) * c.esz(),
                   results + L.coff(from) + L.piece_coff(q), L.piece_elems(from, q));
    }
  }
  co_return Status();
}

Task all_reduce(OpContext& ctx, CollCall call, const Codec& c) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t esz = c.esz();
  const Layout L = Layout::blocks(c.codec(), call.count, n);
  const char* in = static_cast<const char*>(call.sendbuf);
  char* out = static_cast<char*>(call.recvbuf);
  char* sendbuf = static_cast<char*>(ctx.scratch(0, L.ctotal()));
  char* results = static_cast<char*>(ctx.scratch(1, L.ctotal()));
  char* recvbuf = static_cast<char*>(ctx.scratch(2, (n - 1) * L.cbytes(r)));
  float* acc = static_cast<float*>(ctx.scratch(3, (L.elems(r) + L.piece_elems()) * sizeof(float)));
  float* tmp = acc + L.elems(r);

  size_t others = 0;  // pieces of the other ranks' shards
  for (int j = 0; j < n; ++j) others += j == r ? 0 : L.pieces(j);
  const size_t mine = static_cast<size_t>(n - 1) * L.pieces(r);
  RequestArray<RecvRequest> recvs(mine + others);
  RequestArray<SendRequest> sends(others + mine);
  // Per peer, the first exchange's pieces come before the second's, on both sides.
  size_t next = post_piece_recvs(ctx, L, c, recvs, 0, recvbuf, [r](int) { return r; },
                                 [&](int from) {
                                   return (algo::mod(r - from, n) - 1) * L.cbytes(r);
                                 });
  post_piece_recvs(ctx, L, c, recvs, next, results, [](int from) { return from; },
                   [&](int from) { return L.coff(from); });

  c.widen(acc, in + L.off(r) * esz, L.elems(r));
  size_t s = others;
  auto finish_piece = [&](int q, float* a, size_t m) {
    char* dst = results + L.coff(r) + L.piece_coff(q);
    c.quantize_f32(dst, a, m, L.off(r) + q * L.piece_elems(), 1);
    for (int k = 1; k < n; ++k)
      ctx.send(sends[s++], algo::mod(r + k, n), lane(ctx, q), dst, L.piece_cbytes(r, q),
               m * esz);
  };
  CHORUS_CO_RETURN_IF_ERROR(co_await reduce_exchange(ctx, L, c, in, call.op.kind, acc, tmp, recvs,
                                                     sends, sendbuf, recvbuf, finish_piece));
  // Every rank decodes the same bytes, this one its own shard's too.
  decode_shard(L, c, out, results, r);
  CHORUS_CO_RETURN_IF_ERROR(co_await decode_results(ctx, L, c, recvs, mine, out, results));
  for (size_t k = 0; k < others + mine; ++k) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  co_return Status();
}

Task reduce_scatter(OpContext& ctx, CollCall call, const Codec& c) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t esz = c.esz();
  const Layout L = Layout::equal(c.codec(), call.count, n);
  const char* in = static_cast<const char*>(call.sendbuf);
  char* out = static_cast<char*>(call.recvbuf);
  char* sendbuf = static_cast<char*>(ctx.scratch(0, L.ctotal()));
  char* recvbuf = static_cast<char*>(ctx.scratch(2, (n - 1) * L.cbytes(r)));
  float* acc = static_cast<float*>(ctx.scratch(3, (L.elems(r) + L.piece_elems()) * sizeof(float)));
  float* tmp = acc + L.elems(r);

  size_t sent = 0;
  for (int j = 0; j < n; ++j) sent += j == r ? 0 : L.pieces(j);
  const size_t mine = static_cast<size_t>(n - 1) * L.pieces(r);
  RequestArray<RecvRequest> recvs(mine);
  RequestArray<SendRequest> sends(sent);
  post_piece_recvs(ctx, L, c, recvs, 0, recvbuf, [r](int) { return r; },
                   [&](int from) { return (algo::mod(r - from, n) - 1) * L.cbytes(r); });
  c.widen(acc, in + L.off(r) * esz, L.elems(r));
  auto finish_piece = [&](int q, float* a, size_t m) {
    c.narrow(out + q * L.piece_elems() * esz, a, m);
  };
  CHORUS_CO_RETURN_IF_ERROR(co_await reduce_exchange(ctx, L, c, in, call.op.kind, acc, tmp, recvs,
                                                     sends, sendbuf, recvbuf, finish_piece));
  for (size_t k = 0; k < sent; ++k) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  co_return Status();
}

Task all_gather(OpContext& ctx, CollCall call, const Codec& c) {
  const int n = ctx.nranks(), r = ctx.rank();
  const size_t esz = c.esz();
  const Layout L = Layout::equal(c.codec(), call.count, n);
  const char* in = static_cast<const char*>(call.sendbuf);
  char* out = static_cast<char*>(call.recvbuf);
  char* results = static_cast<char*>(ctx.scratch(1, L.ctotal()));
  float* tmp = static_cast<float*>(ctx.scratch(3, L.piece_elems() * sizeof(float)));

  const size_t pieces = L.pieces(r), others = static_cast<size_t>(n - 1) * pieces;
  RequestArray<RecvRequest> recvs(others);
  RequestArray<SendRequest> sends(others);
  post_piece_recvs(ctx, L, c, recvs, 0, results, [](int from) { return from; },
                   [&](int from) { return L.coff(from); });
  size_t s = 0;
  for (size_t q = 0; q < pieces; ++q) {
    const size_t m = L.piece_elems(r, static_cast<int>(q)), index = q * L.piece_elems();
    char* dst = results + L.coff(r) + L.piece_coff(static_cast<int>(q));
    c.quantize_input(dst, in + index * esz, m, index, 0, tmp);
    for (int k = 1; k < n; ++k)
      ctx.send(sends[s++], algo::mod(r + k, n), lane(ctx, static_cast<int>(q)), dst,
               L.piece_cbytes(r, static_cast<int>(q)), m * esz);
    co_await yield_now();
  }
  // In place, `in` is this rank's block of `out`: read above, overwritten now.
  decode_shard(L, c, out, results, r);
  CHORUS_CO_RETURN_IF_ERROR(co_await decode_results(ctx, L, c, recvs, 0, out, results));
  for (size_t k = 0; k < others; ++k) CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sends[k]));
  co_return Status();
}

// One rank: nothing travels, nothing is quantized.
void run_alone(const CollCall& call) {
  algo::copy_result_if_needed(call.recvbuf, call.sendbuf, call.count * datatype_size(call.dtype));
}

}  // namespace

Task all_reduce_part(OpContext& ctx, const CollCall& call, const Settings& s, float* residual,
                     size_t base) {
  if (call.count == 0 || ctx.nranks() == 1) co_return Status();
  Codec codec(ctx, call, s, residual, base);
  co_return co_await all_reduce(ctx, call, codec);
}

Task run(OpContext& ctx, const CollCall& call, Compressor& compressor) {
  if (call.count == 0) co_return Status();
  if (ctx.nranks() == 1) {
    run_alone(call);
    co_return Status();
  }
  Result<float*> residual = compressor.begin_run();
  if (!residual.ok()) co_return residual.take_status();
  // Ends the run however the coroutine ends: done, failed, or destroyed by an abort.
  struct RunGuard {
    Compressor& c;
    ~RunGuard() { c.end_run(); }
  } guard{compressor};
  Codec codec(ctx, call, compressor.settings(), *residual);
  CHORUS_TRACE(kColl, "{}: compressed ({} block {})", describe_tag(call.tag),
               datatype_name(compressor.settings().format), compressor.settings().block);
  Status status;
  switch (call.kind) {
    case CollKind::kAllReduce: status = co_await all_reduce(ctx, call, codec); break;
    case CollKind::kReduceScatter: status = co_await reduce_scatter(ctx, call, codec); break;
    case CollKind::kAllGather: status = co_await all_gather(ctx, call, codec); break;
    default: status = internal_error("{} has no compressed algorithm", coll_name(call.kind));
  }
  co_return status;
}

double wire_ratio(const Settings& s, DataType dtype) {
  const double scale = s.scale == kernels::ScaleKind::kUe8m0 ? 1.0 : 4.0;
  return (1.0 + scale / s.block) / static_cast<double>(datatype_size(dtype));
}

double predict_us(const algo::CostModel& m, CollKind coll, size_t bytes, const algo::Shape& shape,
                  DataType dtype, const Settings& s) {
  const int n = shape.nranks;
  if (n <= 1) return 0;
  if (coll == CollKind::kAllReduce && shape.hosts > 1 && shape.local > 1) {
    // The hierarchical AllReduce with its cross-host stage compressed (algo/run.cc).
    const algo::CostModel local = algo::within_host_model(m);
    const algo::Shape host = algo::Shape::flat(shape.local);
    return algo::predict_us(local, algo::Algo::kDirect, CollKind::kReduceScatter, bytes, host) +
           predict_us(algo::across_model(m, shape), coll, bytes / shape.local,
                      algo::Shape::flat(shape.hosts), dtype, s) +
           algo::predict_us(local, algo::Algo::kDirect, CollKind::kAllGather, bytes, host);
  }
  const double S = static_cast<double>(bytes), a = m.alpha_us;
  // A direct exchange: across hosts, a host's ranks share its link (tuner.h).
  const double wire = m.beta_gbps * 1e3 / algo::host_link_share(shape);  // bytes per us
  const double codec = m.codec_gbps * 1e3;
  const double part = static_cast<double>(n - 1) / n;
  // Codec passes over the data, in fp32 bytes (the codec's speed is measured on fp32 input).
  const double f32 = S * 4.0 / static_cast<double>(datatype_size(dtype));
  const double exchange = a + (n - 2) * a / 4;
  switch (coll) {
    case CollKind::kAllReduce:  // encode + fold (n-1)/n, encode 1/n, decode all
      return 2 * exchange + 2 * part * S * wire_ratio(s, dtype) / wire +
             (2 * part + 1.0 / n + 1) * f32 / codec;
    case CollKind::kReduceScatter:
      return exchange + part * S * wire_ratio(s, dtype) / wire + 2 * part * f32 / codec;
    case CollKind::kAllGather:
      return exchange + part * S * wire_ratio(s, dtype) / wire + (1.0 / n + 1) * f32 / codec;
    default: return 1e30;
  }
}

bool pays(const algo::CostModel& m, CollKind coll, size_t bytes, const algo::Shape& shape,
          DataType dtype, const Settings& s) {
  if (shape.nranks <= 1) return false;
  // Ranks that share memory move bytes faster than the codec makes them: the model's
  // figures for such links, measured once at creation, can say otherwise (with more ranks than
  // cores their latency is the scheduler's), so it is not asked.
  if (!m.network) return false;
  double plain = 1e30;
  for (algo::Algo a : algo::algorithms_for(coll))
    plain = std::min(plain, algo::predict_us(m, a, coll, bytes, shape));
  // Compression changes the result: only where it is clearly faster (the model's error is
  // larger than the margin between the two on links as fast as the codec).
  constexpr double kMargin = 1.25;
  return predict_us(m, coll, bytes, shape, dtype, s) * kMargin < plain;
}

}  // namespace chorus::compress
