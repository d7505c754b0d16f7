// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/ep.h
// MoE expert parallelism on torch CPU tensors: <chorus/ep.h> behind chorus_torch._C.EpBuffer
// and chorus_torch._C.EpHandle (normal mode), EpLowLatencyHandle and EpHook (low-latency mode),
// which chorus_torch/ep.py wraps in DeepEP's Buffer API.
//
// An EpBuffer owns a chorusEpBuffer_t on a communicator split from its "chorus" group for it
// (ProcessGroupChorus::split_comm): its calls are blocking collectives made on the calling
// thread, and <chorus/ep.h> wants a communicator that carries no other work during a call,
// which the group's own, driven by the group's lane threads, cannot promise. One call at a
// time per buffer (a mutex; the GIL is released while a call blocks).
//
// Checks: tensors must be CPU, contiguous, of the documented dtype and shape, or the call
// raises (TypeError for a dtype, ValueError otherwise) on this rank before any communication;
// ranks that did not raise then wait in the call until the group's timeout, as for any
// collective one rank skipped. What the C API checks (expert indices, layouts, sizes, arguments
// that must match between ranks) is agreed by every rank: it raises RuntimeError, with
// Chorus's message, on every rank, and the buffer stays usable.
//
// Low-latency hooks (return_recv_hook): an EpHook holds the call's output tensors until it has
// run chorusEpHookWait (which <chorus/ep.h> requires), and a share of the buffer's communicator,
// which is torn down only once the buffer is destroyed and no hook is pending (the C API lets a
// hook outlive its buffer). A second call of a hook does nothing (or raises its first failure
// again); a hook Python drops uncalled waits in its destructor (the GIL released), so its
// outputs are written and nothing leaks.
#pragma once

#include <pybind11/pybind11.h>

namespace chorus::torch_backend {

// Adds EpBuffer, EpHandle, EpLowLatencyHandle, EpHook, ep_buffer_size_hint and
// ep_low_latency_size_hint to the module.
void bind_ep(pybind11::module_& m);

}  // namespace chorus::torch_backend
