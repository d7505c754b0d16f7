// SPDX-License-Identifier: Apache-2.0
// File: bindings/torch/csrc/module.cc
// chorus_torch._C: the process group's Python type (a torch ProcessGroup), the creator that
// torch.distributed calls for backend "chorus" (registered by chorus_torch/__init__.py), and the
// MoE EP types that chorus_torch/ep.py wraps (ep.h).
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "ep.h"
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
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("overlap_setup", &ProcessGroupChorus::overlap_setup, py::arg("buckets"),
           py::arg("options"), py::call_guard<py::gil_scoped_release>(),
           "Queues the (re)making of the overlap scheduler with these bucket buffers; a Work.")
      .def("overlap_ready", &ProcessGroupChorus::overlap_ready, py::arg("bucket"),
           py::call_guard<py::gil_scoped_release>(),
           "Hands one bucket to the overlap scheduler; a Work done when it is reduced.")
      .def(
          "allreduce_compressed",
          [](ProcessGroupChorus& pg, at::Tensor& tensor, int64_t key, const std::string& format,
             int block_size, bool error_feedback, bool average) {
            TORCH_CHECK(format == "e4m3" || format == "e5m2",
                        "chorus: format must be 'e4m3' or 'e5m2', not '", format, "'");
            ProcessGroupChorus::CompressOptions o;
            o.e5m2 = format == "e5m2";
            o.block_size = block_size;
            o.error_feedback = error_feedback;
            o.average = average;
            return pg.allreduce_compressed(tensor, key, o);
          },
          py::arg("tensor"), py::arg("key") = 0, py::arg("format") = "e4m3",
          py::arg("block_size") = 128, py::arg("error_feedback") = true,
          py::arg("average") = true, py::call_guard<py::gil_scoped_release>(),
          "FP8 AllReduce (in place) of a float, bfloat16 or half tensor; returns a Work. `key` "
          "names the tensor across steps (its error-feedback residual).");
  py::class_<ProcessGroupChorus::OverlapOptions>(m, "OverlapOptions")
      .def(py::init<>())
      .def_readwrite("fifo", &ProcessGroupChorus::OverlapOptions::fifo)
      .def_readwrite("fp8", &ProcessGroupChorus::OverlapOptions::fp8)
      .def_readwrite("bucket_bytes", &ProcessGroupChorus::OverlapOptions::bucket_bytes)
      .def_readwrite("partition_bytes", &ProcessGroupChorus::OverlapOptions::partition_bytes);
  m.def("create_process_group", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "What torch.distributed calls to make a group of backend 'chorus'.");
  chorus::torch_backend::bind_ep(m);
}
