// SPDX-License-Identifier: Apache-2.0
// File: tools/chorus_info_tune.cc
// chorus-info's tuner section: the cost model, the algorithms it picks by size, and
// `--tune`, which measures alpha/beta of each local transport between two ranks and can save
// them as a CHORUS_TUNER_FILE.
#include "tools/chorus_info_tune.h"

#include <fmt/format.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "algo/tuner.h"
#include "api/api_util.h"
#include "common/params.h"
#include "transports/registry.h"

namespace chorus::info {

namespace {

const CollKind kColls[] = {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather,
                           CollKind::kBroadcast, CollKind::kReduce, CollKind::kAlltoAll};

void print_choices(const algo::CostModel& model, int nranks) {
  fmt::print("  Choices for {} ranks ({}):\n", nranks, model.to_string());
  // As a communicator of this model would see it: its small-message boxes included.
  algo::Shape shape = algo::Shape::flat(nranks);
  shape.box_bytes = model.box_bytes;
  fmt::print("    {:<14}", "size");
  for (CollKind c : kColls) fmt::print(" {:>13}", coll_name(c));
  fmt::print("\n");
  for (size_t bytes = 8; bytes <= (size_t{128} << 20); bytes *= 8) {
    fmt::print("    {:<14}", bytes);
    for (CollKind c : kColls) {
      algo::Choice ch = algo::choose(model, c, bytes, shape, 1);
      fmt::print(" {:>13}", algo::algo_name(ch.algo));
    }
    fmt::print("\n");
  }
}

// Creates a 2-rank communicator with CHORUS_TRANSPORT=transport (ranks as two threads, or as
// this process and a forked child) and returns the model it calibrated.
Result<algo::CostModel> measure(const char* transport, bool processes) {
  // The caller's CHORUS_TRANSPORT comes back afterwards (chorus-info prints the parameters).
  const char* before = std::getenv("CHORUS_TRANSPORT");
  const std::optional<std::string> saved =
      before != nullptr ? std::optional<std::string>(before) : std::nullopt;
  auto restore = [&saved] {
    if (saved) {
      setenv("CHORUS_TRANSPORT", saved->c_str(), 1);
    } else {
      unsetenv("CHORUS_TRANSPORT");
    }
    params::reload_for_testing();
  };
  setenv("CHORUS_TRANSPORT", transport, 1);
  params::reload_for_testing();
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    restore();
    return internal_error("{}", ncclGetLastError(nullptr));
  }
  auto init = [&](int rank, ncclComm_t* comm) { return ncclCommInitRank(comm, 2, id, rank); };
  ncclComm_t comms[2] = {nullptr, nullptr};
  pid_t child = -1;
  if (processes) {
    child = fork();
    if (child == 0) {
      ncclComm_t c;
      _exit(init(1, &c) == ncclSuccess && ncclCommDestroy(c) == ncclSuccess ? 0 : 1);
    }
    if (init(0, &comms[0]) != ncclSuccess) {
      int status = 0;
      kill(child, SIGKILL);  // it would wait for rank 0 until the bootstrap timeout
      waitpid(child, &status, 0);
      restore();
      return remote_error("{}", ncclGetLastError(nullptr));
    }
  } else {
    std::thread peer([&] { init(1, &comms[1]); });
    ncclResult_t r = init(0, &comms[0]);
    peer.join();
    if (r != ncclSuccess || comms[1] == nullptr) {
      for (ncclComm_t c : comms)
        if (c != nullptr) ncclCommDestroy(c);
      restore();
      return remote_error("{}", ncclGetLastError(nullptr));
    }
  }
  algo::CostModel model;
  {
    auto comm = api::find_comm(comms[0]);
    if (comm.ok()) model = (*comm)->cost_model();
  }
  for (ncclComm_t c : comms)
    if (c != nullptr) ncclCommDestroy(c);
  if (child > 0) {
    int status = 0;
    waitpid(child, &status, 0);
  }
  restore();
  return model;
}

}  // namespace

void print_tuner() {
  fmt::print("Tuner: predicted time = rounds x alpha + extra messages x "
             "alpha/4 + wire bytes / beta + reduced bytes / gamma; the cheapest algorithm wins.\n"
             "  Parameters: measured when each communicator is created (CHORUS_TUNER={}), or "
             "read from CHORUS_TUNER_FILE='{}'; CHORUS_ALGO='{}' forces algorithms.\n",
             params::kTuner.get(), params::kTunerFile.get(), params::kAlgo.get());
  fmt::print("  This host: reduction (float sum) {:.1f} GB/s, memcpy {:.1f} GB/s, FP8 codec "
             "{:.1f} GB/s per pass\n",
             algo::local_reduce_gbps(), algo::local_copy_gbps(), algo::local_codec_gbps());
  fmt::print("  Algorithms:");
  for (CollKind c : kColls) {
    fmt::print(" {}:", coll_name(c));
    for (algo::Algo a : algo::algorithms_for(c)) fmt::print(" {}", algo::algo_name(a));
    fmt::print(";");
  }
  fmt::print("\n");
  algo::CostModel defaults;
  const std::string& path = params::kTunerFile.get();
  if (!path.empty()) {
    auto file = algo::read_tuner_file(path);
    if (!file.ok()) {
      fmt::print("  {}\n", file.status().message());
      return;
    }
    fmt::print("  The models of CHORUS_TUNER_FILE, one per transport in it:\n");
    for (const auto& link : file->links) {
      algo::CostModel m{link.alpha_us, link.beta_gbps,
                        file->gamma_gbps > 0 ? file->gamma_gbps : defaults.gamma_gbps,
                        fmt::format("{} from {}", link.transport, path)};
      if (file->codec_gbps > 0) m.codec_gbps = file->codec_gbps;
      print_choices(m, 2);
    }
    return;
  }
  if (params::kTuner.get() == "STATIC") {
    fmt::print("  The built-in default model, which communicators use (CHORUS_TUNER=STATIC):\n");
    print_choices(defaults, 2);
    print_choices(defaults, 8);
    return;
  }
  // The built-in defaults (alpha 5 us, gamma 4 GB/s...) are not what a communicator uses: it
  // measures its own at creation. Measure as a communicator of this host would, between two
  // processes over shared memory, and show the choices of that model.
  auto measured = measure("SHM", /*processes=*/true);
  if (measured.ok()) {
    fmt::print("  The model measured now between two processes of this host (shm), as a "
               "communicator measures its own at creation (for 8 ranks too):\n");
    print_choices(*measured, 2);
    print_choices(*measured, 8);
    return;
  }
  fmt::print("  Measuring between two processes failed ({}); the built-in default model, which "
             "a communicator replaces by its own measurement:\n",
             measured.status().message());
  print_choices(defaults, 2);
  print_choices(defaults, 8);
}

int tune(const char* path) {
  std::string file = "# chorus tuner file (chorus-info --tune): <transport> <alpha_us> <beta_gbps>\n";
  double gamma = algo::local_reduce_gbps();
  int measured = 0;
  // Measure, whatever the environment says: not the figures of an older file.
  unsetenv("CHORUS_TUNER_FILE");
  setenv("CHORUS_TUNER", "MEASURE", 1);
  // Every registered transport, between two threads of this process when it reaches only
  // that far, else between this process and a forked child.
  for (const TransportDesc* desc : transports()) {
    std::string forced = desc->name;
    std::transform(forced.begin(), forced.end(), forced.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    bool processes = desc->caps.reach != TransportCaps::Reach::kSameProcess;
    auto model = measure(forced.c_str(), processes);
    if (!model.ok()) {
      // A transport this host cannot run (no UCX device, say) is left out of the file.
      fmt::print(stderr, "chorus-info: measuring {} failed, left out: {}\n", desc->name,
                 model.status().message());
      continue;
    }
    ++measured;
    fmt::print("{:<7} {}\n", desc->name, model->to_string());
    file += fmt::format("{} {:.3f} {:.3f}\n", desc->name, model->alpha_us, model->beta_gbps);
    print_choices(*model, 2);
  }
  if (measured == 0) return 1;
  file += fmt::format("reduce {:.3f}\ncodec {:.3f}\n", gamma, algo::local_codec_gbps());
  if (path != nullptr) {
    std::ofstream out(path);
    out << file;
    if (!out) {
      fmt::print(stderr, "chorus-info: cannot write {}\n", path);
      return 1;
    }
    fmt::print("wrote {} (use it with CHORUS_TUNER_FILE={})\n", path, path);
  }
  return 0;
}

}  // namespace chorus::info
