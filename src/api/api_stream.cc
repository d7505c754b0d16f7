// SPDX-License-Identifier: Apache-2.0
// File: src/api/api_stream.cc
// Host streams and Chorus's own version calls.
#include <chorus/chorus.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <string_view>
#include <vector>

#include "api/api_util.h"
#include "core/engine.h"
#include "kernels/reduce/reduce.h"
#include "transports/registry.h"

using namespace chorus;       // NOLINT
using namespace chorus::api;  // NOLINT

namespace {

// Waits (driving the comm of the stream's last op) until everything queued so far is done.
void wait_stream(Stream* s) {
  std::shared_ptr<Op> last = s->last();
  if (!last || last->done()) return;
  std::vector<Comm*> comms;
  if (last->comm() != nullptr) comms.push_back(last->comm());
  drive_until([&] { return last->done(); }, comms);
}

}  // namespace

CHORUS_API ncclResult_t chorusStreamCreate(chorusStream_t* stream) {
  return guard("chorusStreamCreate", [&]() -> Status {
    if (stream == nullptr) return invalid_argument("stream is NULL");
    *stream = reinterpret_cast<chorusStream_t>(Stream::create());
    return Status();
  });
}

CHORUS_API ncclResult_t chorusStreamDestroy(chorusStream_t stream) {
  return guard("chorusStreamDestroy", [&]() -> Status {
    if (stream == nullptr) return invalid_argument("stream is NULL");
    CHORUS_ASSIGN_OR_RETURN(Stream * s, find_stream(stream));
    wait_stream(s);
    Status status = s->first_error();
    Stream::destroy(s);
    return status;
  });
}

CHORUS_API ncclResult_t chorusStreamSynchronize(chorusStream_t stream) {
  return guard("chorusStreamSynchronize", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Stream * s, find_stream(stream));
    if (s == nullptr) return Status();  // the NULL stream has nothing pending
    wait_stream(s);
    return s->first_error();
  });
}

CHORUS_API ncclResult_t chorusStreamQuery(chorusStream_t stream) {
  return guard("chorusStreamQuery", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Stream * s, find_stream(stream));
    if (s == nullptr) return Status();
    CHORUS_RETURN_IF_ERROR(s->first_error());
    if (!s->idle()) return Status(Code::kInProgress, "stream has work pending");
    return Status();
  });
}

CHORUS_API ncclResult_t chorusLaunchHostFunc(chorusStream_t stream, chorusHostFn_t fn, void* arg) {
  return guard("chorusLaunchHostFunc", [&]() -> Status {
    if (fn == nullptr) return invalid_argument("fn is NULL");
    CHORUS_ASSIGN_OR_RETURN(Stream * s, find_stream(stream));
    if (s == nullptr) {
      fn(arg);  // the NULL stream is synchronous
      return Status();
    }
    auto op = std::make_shared<Op>(std::function<void()>([fn, arg] { fn(arg); }));
    s->append(op);
    Engine::get().submit(op);
    return Status();
  });
}

namespace {

Result<Event*> find_event(chorusEvent_t event) {
  if (event == nullptr) return invalid_argument("event is NULL");
  Event* e = Event::from_handle(event);
  if (e == nullptr)
    return invalid_argument("event {} was not created by chorusEventCreate (or was destroyed)",
                            static_cast<const void*>(event));
  return e;
}

}  // namespace

CHORUS_API ncclResult_t chorusEventCreate(chorusEvent_t* event) {
  return guard("chorusEventCreate", [&]() -> Status {
    if (event == nullptr) return invalid_argument("event is NULL");
    *event = reinterpret_cast<chorusEvent_t>(Event::create());
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEventDestroy(chorusEvent_t event) {
  return guard("chorusEventDestroy", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Event * e, find_event(event));
    Event::destroy(e);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEventRecord(chorusEvent_t event, chorusStream_t stream) {
  return guard("chorusEventRecord", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Event * e, find_event(event));
    CHORUS_ASSIGN_OR_RETURN(Stream * s, find_stream(stream));
    if (s == nullptr)
      e->clear();  // the NULL stream's work is complete when its calls return
    else
      e->record(*s);
    return Status();
  });
}

CHORUS_API ncclResult_t chorusEventQuery(chorusEvent_t event) {
  return guard("chorusEventQuery", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Event * e, find_event(event));
    std::shared_ptr<Op> op = e->op();
    if (!op) return Status();
    if (!op->done()) return Status(Code::kInProgress, "the event's work is pending");
    return op->status();
  });
}

CHORUS_API ncclResult_t chorusEventSynchronize(chorusEvent_t event) {
  return guard("chorusEventSynchronize", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Event * e, find_event(event));
    return wait_op(e->op());
  });
}

CHORUS_API ncclResult_t chorusStreamWaitEvent(chorusStream_t stream, chorusEvent_t event) {
  return guard("chorusStreamWaitEvent", [&]() -> Status {
    CHORUS_ASSIGN_OR_RETURN(Stream * s, find_stream(stream));
    CHORUS_ASSIGN_OR_RETURN(Event * e, find_event(event));
    if (s == nullptr) return wait_op(e->op());  // the NULL stream is synchronous
    stream_wait_op(*s, e->op());
    return Status();
  });
}

CHORUS_API ncclResult_t chorusGetVersion(int* version) {
  return guard("chorusGetVersion", [&]() -> Status {
    if (version == nullptr) return invalid_argument("version is NULL");
    *version = CHORUS_VERSION_CODE;
    return Status();
  });
}

CHORUS_API const char* chorusBuildInfo(void) {
  static const std::string info = [] {
    std::vector<std::string_view> names;
    for (const TransportDesc* t : transports()) names.push_back(t->name);
    return fmt::format("chorus {}.{}.{} (git {}) nccl-api {}.{}.{} kernels={} transports={}",
                       CHORUS_MAJOR, CHORUS_MINOR, CHORUS_PATCH, CHORUS_GIT_SHA, NCCL_MAJOR,
                       NCCL_MINOR, NCCL_PATCH, kernels::kernels().isa, fmt::join(names, ","));
  }();
  return info.c_str();
}
