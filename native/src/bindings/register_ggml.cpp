// kwker._native.ggml_types and ggml_dequantize: the GGUF tensor types the loader reads (ggml.h),
// for the Python side's validation and for small tensors (norms, biases) it reads as float32.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "../formats/ggml.h"
#include "checks.h"

namespace py = pybind11;

namespace kwker {

namespace {

// raw: a 1-D uint8 array holding `rows` rows of k values of ggml type `type`, exactly. Returns
// float32 [rows, k].
py::array_t<float> ggml_dequantize(py::object raw_arg, int type, int rows, int k) {
  const GgmlTypeInfo* t = ggml_type_info(type);
  if (!t) throw std::invalid_argument("ggml type " + std::to_string(type) + " is not supported");
  if (rows < 0 || k < 1 || k % t->block)
    throw std::invalid_argument(std::string("rows of ") + std::to_string(k) +
                                " values are not whole " + t->name + " blocks");
  const py::array raw = bindings::byte_array(raw_arg, "raw");
  if (size_t(raw.size()) != size_t(rows) * ggml_row_bytes(*t, k))
    throw std::invalid_argument("raw has " + std::to_string(raw.size()) + " bytes, " +
                                std::to_string(rows) + " rows of " + std::to_string(k) + " " +
                                t->name + " values take " +
                                std::to_string(size_t(rows) * ggml_row_bytes(*t, k)));
  py::array_t<float> out({py::ssize_t(rows), py::ssize_t(k)});
  const uint8_t* src = static_cast<const uint8_t*>(raw.data());
  float* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (int r = 0; r < rows; r++)
      ggml_dequantize_row(*t, src + size_t(r) * ggml_row_bytes(*t, k), k, dst + size_t(r) * k);
  }
  return out;
}

}  // namespace

void register_ggml(py::module_& m) {
  py::dict types;
  for (int id = 0; id < 64; id++)
    if (const GgmlTypeInfo* t = ggml_type_info(id))
      types[py::int_(id)] = py::make_tuple(t->name, t->block, t->block_bytes);
  m.attr("ggml_types") = types;  // {id: (name, values per block, bytes per block)}
  m.def("ggml_dequantize", &ggml_dequantize, py::arg("raw"), py::arg("type"), py::arg("rows"),
        py::arg("k"),
        "float32 [rows, k] of a GGUF tensor's bytes (uint8), as transformers dequantizes them");
}

}  // namespace kwker
