// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/module.cc
// chorus_torch._C: the process group's Python type (a torch ProcessGroup) and the creator that
// torch.distributed calls for backend "chorus" (registered by chorus_torch/__init__.py).
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "process_group.h"

namespace py = pybind11;
using chorus::torch_backend::ProcessGroupChorus;

namespace {

c10::intrusive_ptr<ProcessGroupChorus> create(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size,
                                              const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<ProcessGroupChorus>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Chorus's torch.distributed backend (CPU tensors)";
  // The base type is torch's, registered by torch.distributed.
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupChorus, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupChorus>>(
      m, "ProcessGroupChorus")
      .def(py::init(&create), py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
  m.def("create_process_group", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "What torch.distributed calls to make a group of backend 'chorus'.");
}
