// kwker._native.Pool and Linear: a float32 matrix packed for the native kernels, called like
// torch's F.linear.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "../model/linear.h"
#include "checks.h"

namespace py = pybind11;

namespace kwker {

namespace {

std::unique_ptr<Linear> make_linear(py::object w_arg, py::object bias_arg,
                                    std::shared_ptr<ThreadPool> pool, const std::string& isa) {
  const py::array w = bindings::weight_array(w_arg, WType::F32, "weight");
  const py::array_t<float> bias = bindings::bias_array(bias_arg, w.shape(0), "bias");
  if (!pool) throw std::invalid_argument("a Linear needs a Pool");
  const float* b = bias.size() ? bias.data() : nullptr;
  const float* wp = static_cast<const float*>(w.data());
  py::gil_scoped_release release;  // packing reads our checked (and kept alive) copies
  return std::make_unique<Linear>(wp, int(w.shape(0)), int(w.shape(1)), b, std::move(pool), isa);
}

// x: [m, k] float32 with unit column stride (rows may be strided); returns a new [m, n] array.
py::array_t<float> forward(Linear& lin, py::object x_arg) {
  const py::array x = bindings::as_array(x_arg, "input");
  if (!x.dtype().equal(py::dtype::of<float>()) || x.ndim() != 2 || x.shape(1) != lin.k() ||
      x.strides(1) != sizeof(float) || x.strides(0) < py::ssize_t(sizeof(float)) * lin.k() ||
      x.strides(0) % sizeof(float))
    throw std::invalid_argument("input must be [m, " + std::to_string(lin.k()) +
                                "] float32 with contiguous, non-overlapping rows");
  const int m = int(x.shape(0));
  py::array_t<float> y({m, lin.n()});
  const float* xp = static_cast<const float*>(x.data());
  float* yp = y.mutable_data();
  const int ldx = int(x.strides(0) / sizeof(float));
  {
    py::gil_scoped_release release;
    if (m > 0) lin.forward(xp, m, ldx, yp, lin.n());
  }
  return y;
}

}  // namespace

void register_linear(py::module_& mod) {
  py::class_<ThreadPool, std::shared_ptr<ThreadPool>>(mod, "Pool")
      .def(py::init<int>(), py::arg("threads"))
      .def_property_readonly("threads", &ThreadPool::size);
  py::class_<Linear>(mod, "Linear")
      .def(py::init(&make_linear), py::arg("weight"), py::arg("bias"), py::arg("pool"),
           py::arg("isa"))
      .def("__call__", &forward, py::arg("x"))
      .def_property_readonly("in_features", &Linear::k)
      .def_property_readonly("out_features", &Linear::n);
}

}  // namespace kwker
