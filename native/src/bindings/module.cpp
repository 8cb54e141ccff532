// kwker._native: the decode step and its kernels. Arguments are checked and converted with the GIL
// held (checks.h); the GIL is released while native code computes.
#include <pybind11/pybind11.h>

#include "../kernels/kernels.h"
#include "../model/threadpool.h"

namespace py = pybind11;

namespace kwker {
void register_machine(py::module_& m);
void register_sampler(py::module_& m);
void register_kernel_tests(py::module_& m);
void register_model(py::module_& m);
void register_linear(py::module_& m);
void register_ggml(py::module_& m);
}  // namespace kwker

PYBIND11_MODULE(_native, m) {
  m.doc() = "Kwker native core";
  // The enums come first: the functions registered after them take them (and no bare ints).
  py::enum_<kwker::WType>(m, "WType", "Weight formats of packed matrices (kernels.h)")
      .value("F32", kwker::WType::F32)
      .value("BF16", kwker::WType::BF16)
      .value("F16", kwker::WType::F16)
      .value("Q8", kwker::WType::Q8)
      .value("Q4", kwker::WType::Q4)
      .value("BF16P", kwker::WType::BF16P)
      .value("Q4K", kwker::WType::Q4K)
      .value("Q6K", kwker::WType::Q6K);
  py::enum_<kwker::Activation>(m, "Activation", "The MLP gate's activation")
      .value("Silu", kwker::Activation::Silu)
      .value("GeluTanh", kwker::Activation::GeluTanh);
  m.def(
      "bits_per_weight", [](kwker::WType t) { return kwker::format(t).bits_per_weight; },
      py::arg("wtype"),
      "Bits a packed weight of this format takes (its block's scales and mins included).");
  m.attr("max_threads") = kwker::kMaxThreads;
  kwker::register_machine(m);
  kwker::register_sampler(m);
  kwker::register_kernel_tests(m);
  kwker::register_model(m);
  kwker::register_linear(m);
  kwker::register_ggml(m);
}
