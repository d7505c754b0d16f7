// SPDX-License-Identifier: Apache-2.0
// File: bench/coll/common.cc
// perf_main: command line -> world -> one RankRunner thread per local rank -> exit status.
// Thread t of process p is rank p * nthreads + t; only rank 0 prints the table.
#include "bench/coll/common.h"

#include <fmt/format.h>
#include <pthread.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include "bench/coll/args.h"
#include "bench/coll/collective.h"
#include "bench/coll/job.h"
#include "bench/coll/report.h"
#include "bench/coll/runner.h"
#include "bench/coll/world.h"

namespace chorus::bench {

namespace {

// Options that are only checkable once the number of ranks is known.
std::string check_against_ranks(const Options& o, const Collective& c, int nranks) {
  if (o.compress.enabled && c.issue_compressed == nullptr)
    return "--compress: only all_reduce_perf, reduce_scatter_perf and all_gather_perf have "
           "compressed variants";
  if (verify::coll_rooted(c.coll) && o.root != kAllRoots && o.root >= nranks) {
    int nprocs = nranks / o.nthreads;
    return fmt::format("-r/--root {} is not a rank: ranks are 0..{} ({} process{} x {} thread{})",
                       o.root, nranks - 1, nprocs, nprocs == 1 ? "" : "es", o.nthreads,
                       o.nthreads == 1 ? "" : "s");
  }
  return "";
}

// Runs local rank `local` to completion; false on failure or wrong results.
bool run_rank(Job& job, int local, Reporter* reporter) {
  std::string name = fmt::format("bench-r{}", job.global_rank(local));
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  try {
    RankRunner runner(job, local, reporter);
    return runner.run();
  } catch (const std::exception& e) {
    job.fail(fmt::format("rank {}: {}", job.global_rank(local), e.what()));
  }
  return false;
}

int run_job(const Options& options, const World& world, const Collective& coll, int argc,
            char** argv) {
  Job job(options, world, coll);
  std::unique_ptr<Reporter> reporter;
  if (world.proc == 0) reporter = std::make_unique<Reporter>(options, world, coll.tool, argc, argv);
  std::vector<char> passed(static_cast<size_t>(options.nthreads), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < options.nthreads; ++t) {
    try {
      threads.emplace_back([&, t] {
        passed[static_cast<size_t>(t)] = run_rank(job, t, t == 0 ? reporter.get() : nullptr);
      });
    } catch (const std::system_error& e) {
      // The ranks already started would wait for this one: fail them (Job aborts their comms).
      job.fail(fmt::format("cannot start the thread of rank {}: {}", job.global_rank(t), e.what()));
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  bool all_passed = !job.failed();
  for (char p : passed) all_passed = all_passed && p != 0;
  std::fflush(stdout);
  // A failed job aborts an MPI launch at once; wrong results end it normally, with status 1.
  leave_world(world, job.failed());
  return all_passed ? 0 : 1;
}

}  // namespace

int perf_main(verify::Coll which, int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const Collective& coll = collective(which);
  ParsedOptions parsed = parse_options(argc, argv);
  const bool first = first_process_by_environment();
  if (!parsed.error.empty()) {
    if (first) fmt::print(stderr, "{}: {}\nTry '{} --help'.\n", coll.tool, parsed.error, argv[0]);
    return 2;
  }
  if (parsed.options.help) {
    if (first) fmt::print("{}", usage_text(argv[0]));
    return 0;
  }
  JoinedWorld joined = join_world(&argc, &argv);
  if (!joined.error.empty()) {
    fmt::print(stderr, "{}: {}\n", coll.tool, joined.error);
    leave_world(joined.world, true);
    return 1;
  }
  const int nranks = joined.world.nprocs * parsed.options.nthreads;
  std::string invalid = check_against_ranks(parsed.options, coll, nranks);
  if (!invalid.empty()) {
    if (joined.world.proc == 0) fmt::print(stderr, "{}: {}\n", coll.tool, invalid);
    leave_world(joined.world, false);
    return 2;
  }
  return run_job(parsed.options, joined.world, coll, argc, argv);
}

}  // namespace chorus::bench
