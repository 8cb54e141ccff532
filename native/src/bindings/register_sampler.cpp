// The sampler's native pass (kwker.sampling): softmax statistics of a row of scores, on the kernels
// chosen once for the process (the best ISA, or KWKER_ISA). Every ISA gives the same bits, so the
// choice is one of speed.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "../kernels/kernels.h"
#include "checks.h"

namespace py = pybind11;

namespace kwker {

namespace {

const Kernels& sampler_kernels() {
  static const Kernels& k = []() -> const Kernels& {
    const char* forced = std::getenv("KWKER_ISA");
    return kernels_select(forced ? forced : "");
  }();
  return k;
}

}  // namespace

// (max q, sum of exp(q - max q), ids of the q >= max q - close) for q = x / temperature, x a
// float32 row, on the kernels kern.
py::tuple softmax_stats_on(const Kernels& kern, py::object x_arg, float t, float close) {
  const py::array_t<float> x = bindings::float_array(x_arg, 1, "scores");
  if (x.shape(0) == 0) throw std::invalid_argument("softmax_stats takes a non-empty row");
  if (!(t > 0) || !std::isfinite(t))
    throw std::invalid_argument("the temperature must be positive and finite");
  if (!(close >= 0) || !std::isfinite(close))
    throw std::invalid_argument("close must be >= 0 and finite");
  const int n = int(x.shape(0));
  // kept: a fresh vocabulary-sized buffer is page faults on every call
  thread_local std::vector<int32_t> ids;
  if (ids.size() < size_t(n)) ids.resize(n);
  float mx;
  double sum;
  int count;
  {
    py::gil_scoped_release release;
    count = kern.softmax_stats(x.data(), n, t, close, &mx, &sum, ids.data());
  }
  py::array_t<int64_t> out(count);
  std::copy(ids.begin(), ids.begin() + count, out.mutable_data());
  return py::make_tuple(mx, sum, out);
}

void register_sampler(py::module_& m) {
  m.def(
      "softmax_stats",
      [](py::object x, float t, float close) {
        return softmax_stats_on(sampler_kernels(), x, t, close);
      },
      py::arg("x"), py::arg("temperature"), py::arg("close"),
      "(max q, sum of exp(q - max q), ids of the q >= max q - close) for q = x / temperature "
      "(float32)");
  m.def(
      "sampler_isa", [] { return std::string(sampler_kernels().name); },
      "The ISA softmax_stats runs on.");
}

}  // namespace kwker
