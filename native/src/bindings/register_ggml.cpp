// kwker._native.ggml_types and ggml_dequantize: the GGUF tensor types the loader reads (ggml.h),
// for the Python side's validation and for small tensors (norms, biases) it reads as float32.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../formats/formats.h"
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

// The K format (Q4K or Q6K) that holds ggml type `name` (Q4_K or Q6_K).
WType k_format(const std::string& name) {
  if (name == "Q4_K") return WType::Q4K;
  if (name == "Q6_K") return WType::Q6K;
  throw std::invalid_argument("a K format holds Q4_K or Q6_K, not " + name);
}

void check_k_shape(int rows, int k) {
  if (rows < 1 || k < kSuperBlock || k % kSuperBlock)
    throw std::invalid_argument("need rows >= 1 and k a positive multiple of 256, got " +
                                std::to_string(rows) + " x " + std::to_string(k));
}

// raw: `rows` rows of k values of ggml type `type` (Q4_K or Q6_K, uint8). Returns the packed
// panels (Q4K or Q6K, uint8).
py::array_t<uint8_t> k_pack(py::object raw_arg, const std::string& type, int rows, int k) {
  const WType t = k_format(type);
  check_k_shape(rows, k);
  const py::array raw = bindings::byte_array(raw_arg, "raw");
  const size_t row_bytes = size_t(k / kSuperBlock) * ggml_block_bytes(t);
  if (size_t(raw.size()) != size_t(rows) * row_bytes)
    throw std::invalid_argument("raw: " + std::to_string(raw.size()) + " bytes, expected " +
                                std::to_string(size_t(rows) * row_bytes));
  py::array_t<uint8_t> out(py::ssize_t(panel_bytes(t, rows, k)));
  std::fill_n(out.mutable_data(), out.size(), uint8_t(0));
  k_from_ggml(t, static_cast<const uint8_t*>(raw.data()), rows, 0, k, out.mutable_data());
  return out;
}

// packed: the panels of `rows` rows of k values (a matrix's packed bytes, Q4K or Q6K as `type`
// names its ggml type). Returns its rows as ggml blocks (uint8): a file's own bytes.
py::array_t<uint8_t> k_unpack(py::object packed_arg, const std::string& type, int rows, int k) {
  const WType t = k_format(type);
  check_k_shape(rows, k);
  const py::array packed = bindings::byte_array(packed_arg, "packed");
  if (size_t(packed.size()) != panel_bytes(t, rows, k))
    throw std::invalid_argument("packed: " + std::to_string(packed.size()) + " bytes, expected " +
                                std::to_string(panel_bytes(t, rows, k)));
  const size_t row_bytes = size_t(k / kSuperBlock) * ggml_block_bytes(t);
  py::array_t<uint8_t> out(py::ssize_t(rows * row_bytes));
  for (int r = 0; r < rows; r++)
    ggml_from_k(t, packed.data(), r, k, out.mutable_data() + r * row_bytes);
  return out;
}

// x: float32 [rows, k], k a multiple of 256. Returns its rows quantized to ggml's Q4_K blocks
// (uint8 [rows, k / 256 * 144]): what int4 packs float weights as (quantize_k.cpp).
py::array_t<uint8_t> ggml_quantize_q4_k(py::object x_arg) {
  const py::array_t<float> x = bindings::float_array(x_arg, 2, "x");
  const int rows = int(x.shape(0)), k = int(x.shape(1));
  check_k_shape(rows, k);
  const size_t row_bytes = size_t(k / kSuperBlock) * kGgmlQ4KBytes;
  py::array_t<uint8_t> out({py::ssize_t(rows), py::ssize_t(row_bytes)});
  {
    py::gil_scoped_release release;
    for (int r = 0; r < rows; r++)
      quantize_q4k_ggml(x.data() + size_t(r) * k, k, out.mutable_data() + r * row_bytes);
  }
  return out;
}

}  // namespace

void register_ggml(py::module_& m) {
  m.def("k_pack", &k_pack, py::arg("raw"), py::arg("type"), py::arg("rows"), py::arg("k"),
        "Q4K / Q6K panels (uint8) of ggml Q4_K / Q6_K rows: the same numbers, rearranged");
  m.def("k_unpack", &k_unpack, py::arg("packed"), py::arg("type"), py::arg("rows"), py::arg("k"),
        "ggml Q4_K / Q6_K rows (uint8) of Q4K / Q6K panels: a file's blocks back, bit for bit");
  m.def("ggml_quantize_q4_k", &ggml_quantize_q4_k, py::arg("x"),
        "ggml Q4_K rows (uint8) of float32 [rows, k]: int4's quantizer for float weights");
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
