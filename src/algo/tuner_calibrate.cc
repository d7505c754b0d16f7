// SPDX-License-Identifier: Apache-2.0
// File: src/algo/tuner_calibrate.cc
// Measuring a communicator's cost model when it is created (tuner.h): every rank measures its
// reduction kernel; the first pair of ranks joined by the communicator's slowest transport
// ping-pongs to measure alpha and beta; the results are shared so that every rank agrees.
// A topology file (CHORUS_TOPO_FILE) that describes the communicator, or a tuner file
// (CHORUS_TUNER_FILE), gives the link figures instead of the ping-pong.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "algo/algo.h"
#include "algo/tuner.h"
#include "common/bytes.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/params.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/internal_ops.h"
#include "kernels/compress/block_codec.h"
#include "topo/cluster.h"

namespace chorus::algo {

namespace {

// CHORUS_TOPO_FILE as this rank read it: every rank reports what it got (and a digest of the
// text), so that all of them accept the file, or all fail, alike.
struct TopoFile {
  enum State : uint8_t { kNone = 0, kParsed = 1, kBad = 2 };
  State state = kNone;
  uint64_t digest = 0;
  std::optional<topo::Cluster> cluster;
  Status error;
};

TopoFile read_topo_file() {
  TopoFile t;
  const std::string& path = params::kTopoFile.get();
  if (path.empty()) return t;
  auto text = topo::read_cluster_text(path);
  auto cluster = text.ok() ? topo::parse_cluster(*text, path) : Result<topo::Cluster>(text.status());
  if (!cluster.ok()) {
    t.state = TopoFile::kBad;
    t.error = invalid_argument("CHORUS_TOPO_FILE: {}", cluster.status().message());
    return t;
  }
  t.state = TopoFile::kParsed;
  t.cluster = std::move(*cluster);
  t.digest = fnv1a(*text);
  return t;
}

// The link figures of a topology file that describes `comm`: its slowest rail across hosts
// and its intra-host link (on one host, the intra-host link is all there is), its rails. The
// kernels' figures stay measured: the file describes links, not processors.
void adopt_topology(const Comm& comm, const topo::Cluster& cluster, CostModel* model) {
  const CostModel file = model_of(cluster);
  model->intra_alpha_us = file.intra_alpha_us;
  model->intra_beta_gbps = file.intra_beta_gbps;
  if (comm.hosts().size() > 1) {
    model->alpha_us = file.alpha_us;
    model->beta_gbps = file.beta_gbps;
    model->rails = static_cast<int>(cluster.rails().size());
  } else {
    model->alpha_us = file.intra_alpha_us;
    model->beta_gbps = file.intra_beta_gbps;
  }
  model->source = "topology file " + params::kTopoFile.get();
}

constexpr int kSmallRounds = 16;
constexpr size_t kLargeBytes = 1 << 20;
constexpr int kLargeMessages = 4;

template <typename F>
double throughput_gbps(size_t bytes, F&& fn) {
  fn();  // warm caches and pages
  int64_t best = INT64_MAX;
  for (int i = 0; i < 5; ++i) {
    int64_t t0 = now_ns();
    fn();
    best = std::min(best, now_ns() - t0);
  }
  return static_cast<double>(bytes) / std::max<int64_t>(best, 1);
}

struct Measured {
  double alpha_us = 0, beta_gbps = 0;
};

// Ranks a and b measure the link between them; everybody else returns at once.
Task ping_pong(OpContext& ctx, int a, int b, Measured* out) {
  const int r = ctx.rank();
  if (r != a && r != b) co_return Status();
  const int peer = r == a ? b : a;
  char* buf = static_cast<char*>(ctx.scratch(0, kLargeBytes * kLargeMessages));
  std::memset(buf, 1, kLargeBytes * kLargeMessages);
  auto exchange = [&](bool sender, size_t bytes, int count) -> Task {
    std::vector<SendRequest> sends(sender ? count : 0);
    std::vector<RecvRequest> recvs(sender ? 0 : count);
    for (int i = 0; i < count; ++i) {
      if (sender) ctx.send(sends[i], peer, 0, buf + i * bytes, bytes);
      else ctx.recv(recvs[i], peer, 0, buf + i * bytes, bytes);
    }
    for (int i = 0; i < count; ++i)
      CHORUS_CO_RETURN_IF_ERROR(co_await ctx.wait(sender ? static_cast<const Request&>(sends[i])
                                                         : static_cast<const Request&>(recvs[i])));
    co_return Status();
  };
  // Small messages: round trips, a first.
  int64_t start = 0;
  for (int i = -2; i < kSmallRounds; ++i) {  // two rounds of warm-up
    if (i == 0) start = now_ns();
    CHORUS_CO_RETURN_IF_ERROR(co_await exchange(r == a, 8, 1));
    CHORUS_CO_RETURN_IF_ERROR(co_await exchange(r != a, 8, 1));
  }
  double rtt_us = (now_ns() - start) / 1e3 / kSmallRounds;
  // Large messages: a streams, b acknowledges the last one.
  start = now_ns();
  CHORUS_CO_RETURN_IF_ERROR(co_await exchange(r == a, kLargeBytes, kLargeMessages));
  CHORUS_CO_RETURN_IF_ERROR(co_await exchange(r != a, 8, 1));
  double stream_us = (now_ns() - start) / 1e3 - rtt_us;
  out->alpha_us = std::max(0.05, rtt_us / 2);
  out->beta_gbps = static_cast<double>(kLargeBytes * kLargeMessages) / std::max(stream_us, 1.0) / 1e3;
  co_return Status();
}

Result<Measured> measure_link(Comm& comm, int a, int b) {
  auto measured = std::make_shared<Measured>();
  auto op = std::make_shared<Op>(&comm, "tuner calibration", [a, b, measured](OpContext& ctx) {
    return ping_pong(ctx, a, b, measured.get());
  });
  CHORUS_RETURN_IF_ERROR(run_and_wait({op}, {&comm}));
  return *measured;
}

}  // namespace

double local_reduce_gbps() {
  static const double gbps = [] {
    const size_t n = (1 << 20) / sizeof(float);
    std::vector<float> x(n, 1.0f), y(n, 2.0f);
    auto fn = kernels::reduce_fn(DataType::kFloat32, kernels::ReduceOp::kSum);
    return throughput_gbps(n * sizeof(float), [&] { fn(x.data(), x.data(), y.data(), n); });
  }();
  return gbps;
}

double local_codec_gbps() {
  static const double gbps = [] {
    // Larger than the caches of the core: the codec streams gradients from memory.
    const size_t n = (8 << 20) / sizeof(float);
    std::vector<float> x(n), acc(n, 0.0f);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
    kernels::BlockCodec codec;  // fp32 -> e4m3, fp32 scales, block 128
    std::vector<unsigned char> packed(kernels::compressed_bytes(codec, n));
    // Both passes, so the figure is per pass: 2 x the input bytes.
    return throughput_gbps(2 * n * sizeof(float), [&] {
      kernels::encode(codec, packed.data(), x.data(), n);
      kernels::decode_accumulate(codec, acc.data(), packed.data(), n);
    });
  }();
  return gbps;
}

double local_copy_gbps() {
  static const double gbps = [] {
    std::vector<char> x(1 << 20, 1), y(1 << 20);
    return throughput_gbps(x.size(), [&] { std::memcpy(y.data(), x.data(), x.size()); });
  }();
  return gbps;
}

Result<TunerFile> read_tuner_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read CHORUS_TUNER_FILE {}", path);
  TunerFile file;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string key;
    if (!(words >> key)) continue;
    if (key == "reduce") {
      if (!(words >> file.gamma_gbps) || file.gamma_gbps <= 0)
        return invalid_argument("{}:{}: expected 'reduce <GB/s>'", path, number);
      continue;
    }
    if (key == "codec") {
      if (!(words >> file.codec_gbps) || file.codec_gbps <= 0)
        return invalid_argument("{}:{}: expected 'codec <GB/s>'", path, number);
      continue;
    }
    TunerFile::Link link{key, 0, 0};
    if (!(words >> link.alpha_us >> link.beta_gbps) || link.alpha_us <= 0 || link.beta_gbps <= 0)
      return invalid_argument("{}:{}: expected '<transport> <alpha_us> <beta_gbps>'", path, number);
    file.links.push_back(link);
  }
  return file;
}

Result<CostModel> calibrate(Comm& comm) {
  CostModel model;
  if (comm.nranks() == 1) {
    // No links to describe; a file that cannot be used is still an error.
    TopoFile topo_file = read_topo_file();
    if (topo_file.state == TopoFile::kBad) return topo_file.error;
    return model;
  }
  // Each rank: its most expensive transport (declared cost at 1 MiB), the first peer it
  // reaches over it, its kernel speed. The model is measured on the worst link of all.
  auto cost = [](const TransportDesc* d) { return d->cost.time_us(1 << 20); };
  const TransportDesc* worst = nullptr;
  int worst_peer = -1;
  for (int p = 0; p < comm.nranks(); ++p) {
    const TransportDesc* d = comm.transport_to(p);
    if (p == comm.rank() || d == nullptr) continue;
    if (worst == nullptr || cost(d) > cost(worst)) {
      worst = d;
      worst_peer = p;
    }
  }
  // And its most expensive transport to a rank of its host, when the communicator spans hosts
  // (the hierarchical algorithms' local stages).
  const TransportDesc* local = nullptr;
  if (comm.hosts().size() > 1) {
    for (int p : comm.hosts()[comm.host_of(comm.rank())]) {
      const TransportDesc* d = comm.transport_to(p);
      if (p != comm.rank() && d != nullptr && (local == nullptr || cost(d) > cost(local))) local = d;
    }
  }
  ByteWriter w;
  w.put_string(worst ? worst->name : "");
  w.put<int32_t>(worst_peer);
  w.put<double>(local_reduce_gbps());
  w.put<double>(local_codec_gbps());
  w.put_string(local ? local->name : "");
  w.put<uint32_t>(comm.has_boxes() ? static_cast<uint32_t>(params::kBoxBytes.get()) : 0);
  TopoFile topo_file = read_topo_file();
  w.put<uint8_t>(topo_file.state);
  w.put<uint64_t>(topo_file.digest);
  std::vector<int> all(comm.nranks());
  for (int r = 0; r < comm.nranks(); ++r) all[r] = r;
  CHORUS_ASSIGN_OR_RETURN(auto records, allgather_records(comm, all, w.take()));
  const TransportDesc* slowest = nullptr;
  const TransportDesc* intra = nullptr;
  std::string slowest_name;
  int a = -1, b = -1;
  model.gamma_gbps = 1e9;
  model.codec_gbps = 1e9;
  model.box_bytes = SIZE_MAX;
  std::vector<uint8_t> topo_state(comm.nranks());
  std::vector<uint64_t> topo_digest(comm.nranks());
  for (int r = 0; r < comm.nranks(); ++r) {
    ByteReader rd(records[r]);
    std::string name;
    int32_t peer = -1;
    double gamma = 0, codec = 0;
    CHORUS_RETURN_IF_ERROR(rd.get_string(&name, 64));
    CHORUS_RETURN_IF_ERROR(rd.get(&peer));
    CHORUS_RETURN_IF_ERROR(rd.get(&gamma));
    CHORUS_RETURN_IF_ERROR(rd.get(&codec));
    std::string intra_name;
    CHORUS_RETURN_IF_ERROR(rd.get_string(&intra_name, 64));
    uint32_t box_bytes = 0;
    CHORUS_RETURN_IF_ERROR(rd.get(&box_bytes));
    model.box_bytes = std::min<size_t>(model.box_bytes, box_bytes);
    CHORUS_RETURN_IF_ERROR(rd.get(&topo_state[r]));
    CHORUS_RETURN_IF_ERROR(rd.get(&topo_digest[r]));
    if (!intra_name.empty()) {
      const TransportDesc* d = find_transport(intra_name);
      if (d == nullptr)
        return remote_error("rank {} reports an unknown transport '{}'", r, intra_name);
      if (intra == nullptr || cost(d) > cost(intra)) intra = d;
    }
    model.gamma_gbps = std::min(model.gamma_gbps, gamma);
    model.codec_gbps = std::min(model.codec_gbps, codec);
    const TransportDesc* d = find_transport(name);
    if (d == nullptr) return remote_error("rank {} reports an unknown transport '{}'", r, name);
    if (slowest == nullptr || cost(d) > cost(slowest)) {
      slowest = d;
      slowest_name = d->name;
      a = r;
      b = peer;
    }
  }
  if (slowest != nullptr) model.network = slowest->caps.reach == TransportCaps::Reach::kAnyHost;
  // A topology file: every rank was given the same one, or none fails alike.
  if (topo_file.state == TopoFile::kBad) return topo_file.error;
  auto topo_name = [&](int r) {
    return topo_state[r] == TopoFile::kNone ? std::string("none")
                                            : fmt::format("text digest {:016x}", topo_digest[r]);
  };
  for (int r = 0; r < comm.nranks(); ++r) {
    if (topo_state[r] == TopoFile::kBad)
      return invalid_usage("rank {} cannot use its CHORUS_TOPO_FILE (its error says why)", r);
    if (topo_state[r] != topo_state[0] || topo_digest[r] != topo_digest[0]) {
      return invalid_usage("ranks 0 and {} were given different topology files "
                           "(CHORUS_TOPO_FILE: {} against {}): every rank needs the same one",
                           r, topo_name(0), topo_name(r));
    }
  }
  if (topo_file.cluster) {
    std::string mismatch = topo::placement_mismatch(*topo_file.cluster, comm.hosts());
    if (mismatch.empty()) {
      adopt_topology(comm, *topo_file.cluster, &model);
      return model;
    }
    // Every rank finds the same: rank 0 warns (a subset's communicator, from ncclCommSplit,
    // is a common reason), the others only log it.
    CHORUS_LOG(comm.rank() == 0 ? log::Level::kWarn : log::Level::kInfo, log::kColl,
               "CHORUS_TOPO_FILE {} does not describe {}: {}; measuring instead",
               params::kTopoFile.get(), comm.describe(), mismatch);
  }
  // A tuner file, if given, supplies the link figures (every rank must be given the same).
  const std::string& path = params::kTunerFile.get();
  std::optional<TunerFile> file;
  if (!path.empty()) {
    CHORUS_ASSIGN_OR_RETURN(file, read_tuner_file(path));
  }
  // The link within a host: its tuner-file line, else its transport's declared cost; on one
  // host, the model's own alpha/beta (set_intra below).
  if (intra != nullptr) {
    model.intra_alpha_us = intra->cost.alpha_us;
    model.intra_beta_gbps = intra->cost.beta_gbps;
    for (const auto& link : file ? file->links : std::vector<TunerFile::Link>{}) {
      if (link.transport != intra->name) continue;
      model.intra_alpha_us = link.alpha_us;
      model.intra_beta_gbps = link.beta_gbps;
    }
  }
  auto done = [&] {
    if (intra == nullptr) {
      model.intra_alpha_us = model.alpha_us;
      model.intra_beta_gbps = model.beta_gbps;
    }
    return model;
  };
  if (file) {
    for (const auto& link : file->links) {
      if (link.transport != slowest_name) continue;
      model.alpha_us = link.alpha_us;
      model.beta_gbps = link.beta_gbps;
      if (file->gamma_gbps > 0) model.gamma_gbps = file->gamma_gbps;
      if (file->codec_gbps > 0) model.codec_gbps = file->codec_gbps;
      model.source = "file " + path;
      return done();
    }
    CHORUS_WARN(kColl, "CHORUS_TUNER_FILE {} has no line for {}; measuring instead", path,
                slowest_name);
  }
  if (params::kTuner.get() == "STATIC") {
    model.source = "default (CHORUS_TUNER=STATIC)";
    return done();
  }
  CHORUS_ASSIGN_OR_RETURN(Measured m, measure_link(comm, a, b));
  // Everyone adopts what rank a measured.
  ByteWriter mine;
  if (comm.rank() == a) {
    mine.put(m.alpha_us);
    mine.put(m.beta_gbps);
  }
  CHORUS_ASSIGN_OR_RETURN(auto shared, allgather_records(comm, all, mine.take()));
  ByteReader rd(shared[a]);
  CHORUS_RETURN_IF_ERROR(rd.get(&model.alpha_us));
  CHORUS_RETURN_IF_ERROR(rd.get(&model.beta_gbps));
  model.source = fmt::format("measured over {} between ranks {} and {}", slowest_name, a, b);
  return done();
}

}  // namespace chorus::algo
