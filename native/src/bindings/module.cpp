// kwker._native: the decode step and its kernels. Arguments are converted with the GIL held; the GIL is released
// while native code computes.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace kwker {
void register_kernels(py::module_& m);
void register_model(py::module_& m);
void register_linear(py::module_& m);
}  // namespace kwker

PYBIND11_MODULE(_native, m) {
  m.doc() = "Kwker native core";
  kwker::register_kernels(m);
  kwker::register_model(m);
  kwker::register_linear(m);
}
