// SPDX-License-Identifier: Apache-2.0
// File: examples/overlap_train.cc
// A data-parallel training step that really computes, with its gradients reduced by the
// overlap scheduler (<chorus/overlap.h>) while the backward pass goes on.
//
// The model: L fully connected layers of D x D (ReLU between them), a batch of B random inputs
// per rank regressed onto fixed random targets (mean squared error), plain SGD. Forward and
// backward are OpenBLAS sgemm calls on one thread per rank. Backward hands each layer's weight
// gradient to the scheduler as soon as it is computed (last layer first); the next forward
// pass waits for layer l's reduced gradient just before it updates and uses layer l.
//
// One run measures, on the same communicator and data, the median step time (the slowest
// rank's) of:
//   compute     forward + backward + update, no communication
//   serial      compute, then every gradient reduced after backward (plain ncclAllReduce)
//   per policy (priority; fifo; ddp: FIFO, 25 MiB buckets, 1 MiB first, no pieces or credit;
//   priority-fp8: priority with every piece reduced through FP8, E4M3 with error feedback):
//     comm      communication alone: every gradient ready at once, wait for all
//     overlap   the training step with the scheduler
// and prints, per policy, hidden = (compute + comm - overlap) / comm, and the last step's
// scheduler statistics. The loss printed at the end of each training mode should fall alike.
//
//   chorus-run -n 2 overlap_train [--layers 8] [--width 2048] [--batch 256] [--steps 5]
//              [--warmup 1] [--policies priority,fifo,ddp,priority-fp8] [--trace DIR]
// (the multi-host test bed: bench/overlap/overlap_speed.sh).
#include <cblas.h>
#include <chorus/compress.h>
#include <chorus/launch.h>
#include <chorus/overlap.h>
#include <nccl.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Options {
  int layers = 8, width = 2048, batch = 256, steps = 5, warmup = 1;
  std::string policies = "priority,fifo,ddp";
  std::string trace_dir;
};

#define CHECK_NCCL(call)                                                                  \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                   ncclGetLastError(nullptr));                                            \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Model {
 public:
  Model(const Options& o, int rank) : o_(o), D_(o.width), B_(o.batch) {
    const size_t dd = static_cast<size_t>(D_) * D_, bd = static_cast<size_t>(B_) * D_;
    w_.assign(o.layers, std::vector<float>(dd));
    g_.assign(o.layers, std::vector<float>(dd));
    z_.assign(o.layers, std::vector<float>(bd));
    a_.assign(o.layers + 1, std::vector<float>(bd));
    da_.resize(bd);
    dz_.resize(bd);
    y_.resize(bd);
    std::mt19937 data(1000 + rank);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (float& x : a_[0]) x = n01(data);
    for (float& x : y_) x = 0.5f * n01(data);
    reset();
  }
  // The same initial weights on every rank (and for every mode).
  void reset() {
    std::mt19937 init(7);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    const float scale = std::sqrt(2.0f / static_cast<float>(D_));
    for (auto& w : w_)
      for (float& x : w) x = scale * n01(init);
  }
  int layers() const { return o_.layers; }
  float* grad(int l) { return g_[l].data(); }
  size_t grad_count() const { return static_cast<size_t>(D_) * D_; }

  // Applies layer l's (reduced) gradient, then computes its output.
  void update(int l, float lr) { cblas_saxpy(static_cast<int>(grad_count()), -lr, g_[l].data(), 1, w_[l].data(), 1); }
  void forward_layer(int l) {
    // z = a W^T (B x D), then ReLU except after the last layer.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B_, D_, D_, 1.0f, a_[l].data(), D_,
                w_[l].data(), D_, 0.0f, z_[l].data(), D_);
    float* out = a_[l + 1].data();
    const float* z = z_[l].data();
    const size_t n = static_cast<size_t>(B_) * D_;
    if (l + 1 < o_.layers) {
      for (size_t i = 0; i < n; ++i) out[i] = z[i] > 0 ? z[i] : 0;
    } else {
      std::memcpy(out, z, n * sizeof(float));
    }
  }
  float loss() const {
    double s = 0;
    const auto& out = a_[o_.layers];
    for (size_t i = 0; i < out.size(); ++i) s += 0.5 * (out[i] - y_[i]) * (out[i] - y_[i]);
    return static_cast<float>(s / static_cast<double>(out.size()));
  }
  // Backward, last layer first; ready(l) as soon as layer l's weight gradient exists.
  template <typename Ready>
  void backward(Ready&& ready) {
    const size_t n = static_cast<size_t>(B_) * D_;
    const auto& out = a_[o_.layers];
    for (size_t i = 0; i < n; ++i) dz_[i] = (out[i] - y_[i]) / static_cast<float>(n);
    for (int l = o_.layers - 1; l >= 0; --l) {
      // dW = dz^T a (D x D); da = dz W (B x D), then through the ReLU below.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D_, D_, B_, 1.0f, dz_.data(), D_,
                  a_[l].data(), D_, 0.0f, g_[l].data(), D_);
      ready(l);
      if (l == 0) break;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B_, D_, D_, 1.0f, dz_.data(), D_,
                  w_[l].data(), D_, 0.0f, da_.data(), D_);
      const float* z = z_[l - 1].data();
      for (size_t i = 0; i < n; ++i) dz_[i] = z[i] > 0 ? da_[i] : 0;
    }
  }

 private:
  const Options& o_;
  const int D_, B_;
  std::vector<std::vector<float>> w_, g_, z_, a_;
  std::vector<float> da_, dz_, y_;
};

constexpr float kLr = 0.5f;

// The slowest rank's time.
double slowest(ncclComm_t comm, double t) {
  CHECK_NCCL(ncclAllReduce(&t, &t, 1, ncclFloat64, ncclMax, comm, nullptr));
  return t;
}

// Every rank starts a step at about the same time.
void align(ncclComm_t comm) {
  int one = 1;
  CHECK_NCCL(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, nullptr));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Result {
  double step = 0;
  double busy = 0;  // of the step, the time not spent waiting for gradients (slowest rank)
  float loss = 0;
};

// CPU time this process used so far (every thread: the scheduler's and the progress engine's).
double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Training steps; `reduce` is called after backward (serial), `scheduler` overlaps.
// `timing`: a communicator of its own for aligning steps and taking the slowest rank's time, so
// that those calls never mix with the scheduler's buckets on `comm`.
Result train(const Options& o, Model& m, ncclComm_t comm, ncclComm_t timing, chorusOverlap_t scheduler,
             bool serial) {
  m.reset();
  std::vector<double> times, busy;
  bool have_grads = false;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    align(timing);
    const double t0 = now_s();
    double waited = 0;
    auto wait = [&](int l) {
      const double w0 = now_s();
      CHECK_NCCL(chorusOverlapWait(scheduler, m.grad(l)));
      waited += now_s() - w0;
    };
    for (int l = 0; l < m.layers(); ++l) {
      if (have_grads) {
        if (scheduler != nullptr) wait(l);
        m.update(l, kLr);
      }
      m.forward_layer(l);
    }
    m.backward([&](int l) {
      if (scheduler != nullptr)
        CHECK_NCCL(chorusOverlapReady(scheduler, m.grad(l), m.grad_count(), ncclFloat32));
    });
    if (serial) {
      for (int l = m.layers() - 1; l >= 0; --l)
        CHECK_NCCL(ncclAllReduce(m.grad(l), m.grad(l), m.grad_count(), ncclFloat32, ncclAvg, comm, nullptr));
    }
    have_grads = true;
    // A step ends where the next forward pass could start layer 0: for the scheduler, once
    // layer 0's gradient is reduced (the rest may still be in flight).
    if (scheduler != nullptr) wait(0);
    const double elapsed = now_s() - t0;
    const double t = slowest(timing, elapsed);
    const double b = slowest(timing, elapsed - waited);
    if (step >= o.warmup) {
      times.push_back(t);
      busy.push_back(b);
    }
  }
  if (scheduler != nullptr) CHECK_NCCL(chorusOverlapWaitAll(scheduler));
  return Result{median(times), median(busy), m.loss()};
}

// Communication alone: every gradient ready at once. Also the CPU time a step of it costs
// the process (the most of any rank, median over steps): what it takes from compute beside it.
struct CommOnly {
  double step = 0;
  double cpu = 0;
};
CommOnly comm_only(const Options& o, Model& m, ncclComm_t timing, chorusOverlap_t scheduler) {
  std::vector<double> times, cpus;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    align(timing);
    const double t0 = now_s(), c0 = cpu_s();
    for (int l = m.layers() - 1; l >= 0; --l)
      CHECK_NCCL(chorusOverlapReady(scheduler, m.grad(l), m.grad_count(), ncclFloat32));
    CHECK_NCCL(chorusOverlapWaitAll(scheduler));
    const double c = slowest(timing, cpu_s() - c0);
    const double t = slowest(timing, now_s() - t0);
    if (step >= o.warmup) {
      times.push_back(t);
      cpus.push_back(c);
    }
  }
  return CommOnly{median(times), median(cpus)};
}

chorusOverlapConfig_t policy_config(const std::string& name) {
  chorusOverlapConfig_t c;
  chorusOverlapConfigInit(&c);
  if (name == "fifo") c.policy = chorusOverlapFifo;
  if (name == "priority-fp8") {
    static chorusCompressConfig_t fp8 = CHORUS_COMPRESS_CONFIG_INIT;
    fp8.errorFeedback = 1;
    c.compress = &fp8;
  }
  if (name == "ddp") {
    c.policy = chorusOverlapFifo;
    c.bucketBytes = 25 << 20;
    c.firstBucketBytes = 1 << 20;
    c.partitionBytes = 0;
    c.creditBytes = 0;
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--layers") o.layers = std::atoi(next().c_str());
    else if (a == "--width") o.width = std::atoi(next().c_str());
    else if (a == "--batch") o.batch = std::atoi(next().c_str());
    else if (a == "--steps") o.steps = std::atoi(next().c_str());
    else if (a == "--warmup") o.warmup = std::atoi(next().c_str());
    else if (a == "--policies") o.policies = next();
    else if (a == "--trace") o.trace_dir = next();
    else {
      std::fprintf(stderr, "usage: overlap_train [--layers L] [--width D] [--batch B] [--steps S] "
                           "[--warmup W] [--policies priority,fifo,ddp,priority-fp8] [--trace DIR]\n");
      return 2;
    }
  }
  if (o.layers < 1 || o.width < 1 || o.batch < 1 || o.steps < 1 || o.warmup < 0) {
    std::fprintf(stderr, "overlap_train: layers, width, batch and steps must be positive\n");
    return 2;
  }
  openblas_set_num_threads(1);
  // chorus-run, torchrun, mpirun or srun: the communicator comes from the launcher.
  ncclComm_t comm;
  CHECK_NCCL(chorusCommInitFromEnv(&comm, nullptr));
  int rank = 0, nranks = 1;
  CHECK_NCCL(ncclCommUserRank(comm, &rank));
  CHECK_NCCL(ncclCommCount(comm, &nranks));
  ncclComm_t timing;
  CHECK_NCCL(ncclCommSplit(comm, 0, rank, &timing, nullptr));
  Model m(o, rank);
  const double grad_mib = static_cast<double>(m.grad_count()) * 4 * o.layers / (1 << 20);
  if (rank == 0) {
    std::printf("# overlap_train: %d ranks, %d layers of %d x %d, batch %d, %.1f MiB of gradients "
                "per step; median of %d steps (after %d), slowest rank\n",
                nranks, o.layers, o.width, o.width, o.batch, grad_mib, o.steps, o.warmup);
  }
  const Result compute = train(o, m, comm, timing, nullptr, false);
  const Result serial = train(o, m, comm, timing, nullptr, true);
  if (rank == 0) {
    std::printf("%-10s %-8s %10s %12s\n", "policy", "mode", "step ms", "loss");
    std::printf("%-10s %-8s %10.1f %12.8f\n", "-", "compute", compute.step * 1e3, compute.loss);
    std::printf("%-10s %-8s %10.1f %12.8f\n", "-", "serial", serial.step * 1e3, serial.loss);
  }
  size_t start = 0;
  while (start <= o.policies.size()) {
    size_t comma = o.policies.find(',', start);
    if (comma == std::string::npos) comma = o.policies.size();
    const std::string name = o.policies.substr(start, comma - start);
    start = comma + 1;
    if (name.empty()) continue;
    const chorusOverlapConfig_t c = policy_config(name);
    chorusOverlap_t s;
    CHECK_NCCL(chorusOverlapCreate(comm, &c, &s));
    for (int l = 0; l < o.layers; ++l)
      CHECK_NCCL(chorusOverlapRegister(s, m.grad(l), m.grad_count(), ncclFloat32, l));
    const CommOnly comm_only_run = comm_only(o, m, timing, s);
    const double comm_s = comm_only_run.step;
    const Result overlap = train(o, m, comm, timing, s, false);
    chorusOverlapStats_t st;
    CHECK_NCCL(chorusOverlapGetStats(s, &st));
    if (!o.trace_dir.empty()) {
      const std::string path = o.trace_dir + "/overlap_" + name + "_rank" + std::to_string(rank) + ".json";
      CHECK_NCCL(chorusOverlapDumpTrace(s, path.c_str()));
    }
    CHECK_NCCL(chorusOverlapDestroy(s));
    if (rank == 0) {
      const double hidden = (compute.step + comm_s - overlap.step) / comm_s;
      std::printf("%-10s %-8s %10.1f %12s   cpu %.1f ms per step\n", name.c_str(), "comm",
                  comm_s * 1e3, "", comm_only_run.cpu * 1e3);
      std::printf("%-10s %-8s %10.1f %12.8f   hidden %.1f %%, %.2fx serial; compute %.1f ms "
                  "(%+.1f %%); last step: %lu buckets, %lu agreements, comm %.1f ms, exposed "
                  "%.1f ms\n",
                  name.c_str(), "overlap", overlap.step * 1e3, overlap.loss, 100 * hidden,
                  serial.step / overlap.step, overlap.busy * 1e3,
                  100 * (overlap.busy / compute.step - 1), static_cast<unsigned long>(st.buckets),
                  static_cast<unsigned long>(st.agreements), st.commUs / 1e3, st.exposedUs / 1e3);
      std::fflush(stdout);
    }
  }
  CHECK_NCCL(ncclCommDestroy(timing));
  CHECK_NCCL(ncclCommDestroy(comm));
  return 0;
}
