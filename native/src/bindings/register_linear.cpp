// kwker._native.Pool and Linear: a float32 matrix packed for the native kernels, called like torch's F.linear.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "../model/linear.h"

namespace py = pybind11;

namespace kwker {

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

std::unique_ptr<Linear> make_linear(F32Array w, py::object bias, std::shared_ptr<ThreadPool> pool,
                                    const std::string& isa) {
  if (w.ndim() != 2) throw std::invalid_argument("weight must be 2-D");
  const float* b = nullptr;
  F32Array ba;
  if (!bias.is_none()) {
    ba = bias.cast<F32Array>();
    if (ba.size() != w.shape(0)) throw std::invalid_argument("bias has the wrong size");
    b = ba.data();
  }
  py::gil_scoped_release release;
  return std::make_unique<Linear>(w.data(), int(w.shape(0)), int(w.shape(1)), b, std::move(pool), isa);
}

// x: [m, k] float32 with unit column stride; returns a new [m, n] array.
py::array_t<float> forward(Linear& lin, py::array_t<float> x) {
  if (x.ndim() != 2 || x.shape(1) != lin.k() || x.strides(1) != sizeof(float))
    throw std::invalid_argument("input must be [m, " + std::to_string(lin.k()) + "] float32 with contiguous rows");
  const int m = int(x.shape(0));
  py::array_t<float> y({m, lin.n()});
  const float* xp = x.data();
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
      .def(py::init(&make_linear), py::arg("weight"), py::arg("bias"), py::arg("pool"), py::arg("isa"))
      .def("__call__", &forward, py::arg("x"))
      .def_property_readonly("in_features", &Linear::k)
      .def_property_readonly("out_features", &Linear::n);
}

}  // namespace kwker
