// SPDX-License-Identifier: Apache-2.0
// File: src/core/express.cc
// The express path of a blocking call (Comm::run_express): a small collective that the tuner
// sends through the small-message boxes runs from the caller's frame when the communicator is
// idle: no operation object, queue or coroutine frame, and one flight-recorder entry, written
// when the call ends (and first when a wait lasts a millisecond). The messages are those the
// box algorithm's fiber sends (algo::BoxCollective is the one implementation of both), so
// ranks on either path meet. A wait polls the awaited word briefly, then becomes the bounded
// wait of an operation (Comm::check_wait): abort, a same-host peer that exited, and
// CHORUS_TIMEOUT_MS without progress, each naming the peer waited for.
#include <fmt/format.h>

#include <span>
#include <string>

#include "algo/algo.h"
#include "algo/box.h"
#include "common/clock.h"
#include "common/params.h"
#include "common/process.h"
#include "compress/compressor.h"
#include "core/comm.h"
#include "core/engine.h"

namespace chorus {
namespace {
// Polls of the awaited word before the bounded wait: 1-3 microseconds of pause instructions
// (20 ns each on the development VM, up to 40 on recent Intel cores).
constexpr int kQuickPolls = 64;
// A collective call's flight-recorder entry (as Op::summarize writes one).
void summarize_call(const CollCall& in, const MsgTag& tag, OpSummary* what) {
  what->kind = OpSummary::Kind::kCollective;
  what->ncalls = 1;
  what->nsends = 0;
  what->bytes = in.count * datatype_size(in.dtype);
  what->calls[0] = {tag, tag.root, false};
}
}  // namespace

bool Comm::run_express(const CollCall& in, Status* result) {
  if (in.compressor || in.op.kind == RedOpKind::kPreMulSum || params::kExpress.get() == 0)
    return false;
  const size_t bytes = algo::choice_bytes(in, nranks());
  if (!boxes_ && bytes > kExpressBytes) return false;
  // CHORUS_COMPRESS may take plain AllReduce and ReduceScatter calls from this size up.
  if ((in.kind == CollKind::kAllReduce || in.kind == CollKind::kReduceScatter) &&
      bytes >= compress::transparent_min_bytes())
    return false;
  std::unique_lock<std::mutex> drive(drive_mutex_, std::try_to_lock);
  if (!drive.owns_lock() || current_ != nullptr ||
      pending_ops_.load(std::memory_order_acquire) != 0)
    return false;
  // The boxes, or another algorithm for a small call (drive lock: the tuner's cache).
  const bool box = boxes_ && choose(in.kind, bytes).algo == algo::Algo::kBox;
  if (!box && bytes > kExpressBytes) return false;

  // What admit() does for a queued operation.
  if (Status unusable = check_usable(); !unusable.ok()) {
    *result = std::move(unusable);
    return true;
  }
  MsgTag tag;
  tag.coll = static_cast<uint8_t>(in.kind);
  tag.dtype = static_cast<uint8_t>(in.dtype);
  tag.redop = static_cast<uint8_t>(in.op.kind);
  tag.count = in.count;
  tag.root = in.root;
  tag.seq = coll_seq_++;
  // The flight-recorder entry is written once, when the call ends, unless a wait lasts long
  // enough to matter for a diagnosis (then the call shows as running while it waits).
  auto summarize = [&](OpSummary* what) { summarize_call(in, tag, what); };
  if (!box) return run_express_fibers(in, tag, result);

  OpContext ctx(*this, tag);
  algo::BoxCollective run(ctx, in.kind, algo::args_for(in));
  Status status;
  BoxWait w;
  Idler idler;
  ExpressWait wait;
  // A peer on its own core usually answers within a cache-line transfer or two: poll for that
  // long before the bounded wait (and its clock reads) begins. With more ranks than cores the
  // peer may need this core, and CHORUS_SPIN_US=0 asks for no spinning: straight to the wait.
  const int quick_polls =
      ProcessContext::get().oversubscribed() || params::kSpinUs.get() == 0 ? 0 : kQuickPolls;
  while (!run.step(&w)) {
    auto ready = [&] {
      return static_cast<int32_t>(w.word->load(std::memory_order_acquire) - w.target) >= 0;
    };
    bool arrived = false;
    for (int i = 0; i < quick_polls && !(arrived = ready()); ++i) cpu_relax();
    if (arrived) continue;
    // Wait for the word, bounded: spin, then sleep on the doorbell (the peer rings it).
    wait.since_ns = now_coarse_ns();
    idler.reset();
    while (!ready()) {
      const int waited = run.waiting_peer();
      status = express_stalled(
          &wait, [&](std::vector<int>* peers) { peers->push_back(waited); },
          [&] { return describe_tag(tag); },
          [&] {
            return fmt::format("; waiting for {} to {} (0 of {} bytes done)",
                               peer(waited).describe(),
                               run.waiting_to_send() ? "take our data" : "send its data",
                               run.message_bytes());
          },
          summarize);
      if (!status.ok()) break;
      idler.idle([&] { return ready(); }, [](std::vector<pollfd>*) { return true; });
    }
    if (!status.ok()) break;
  }
  if (status.ok() && !run.status().ok()) status = run.status();
  if (status.ok()) algo::divide_average(in, nranks(), rank());

  end_express(std::move(status), [&] { return describe_tag(tag); }, wait, summarize, result);
  return true;
}

bool Comm::run_express_fibers(const CollCall& in, const MsgTag& tag, Status* result) {
  auto summarize = [&](OpSummary* what) { summarize_call(in, tag, what); };
  CollCall call = in;
  call.tag = tag;
  OpContext ctx(*this, tag);
  FiberSet fibers(algo::run_call(ctx, call));
  Status status;
  Idler idler;
  ExpressWait wait;
  for (;;) {
    bool moved = progress_connections();
    moved |= fibers.step_all();
    if (fibers.done()) {
      status = fibers.take_status();
      break;
    }
    if (moved) {
      wait.since_ns = 0;
      idler.reset();
      continue;
    }
    status = express_stalled(
        &wait,
        [&](std::vector<int>* peers) {
          for (const Request* r : fibers.waiting_requests()) peers->push_back(r->peer);
        },
        [&] { return describe_tag(tag); }, [&] { return waiting_summary(fibers); }, summarize);
    if (!status.ok()) break;
    idler.idle([&] { return progress_connections(); },
               [&](std::vector<pollfd>* fds) { return collect_poll_fds(fds); });
  }

  // Before the fibers' requests in this frame go.
  end_express(std::move(status), [&] { return describe_tag(tag); }, wait, summarize, result);
  return true;
}

}  // namespace chorus
