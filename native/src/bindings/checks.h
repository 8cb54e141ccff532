// Argument checks shared by the bindings: every array is checked for its dtype, rank and length
// before native code touches its memory, and ids are copied (with the GIL held) into native
// vectors, so that nothing the caller owns is read after the GIL is released. Errors are ValueError
// (std::invalid_argument) or TypeError naming the argument.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/kernels.h"

namespace kwker::bindings {

namespace py = pybind11;

inline std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// `obj` as a numpy array (TypeError if it is none).
inline py::array as_array(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(what + " must be a numpy array, got " +
                         py::str(py::type::of(obj)).cast<std::string>());
  return py::reinterpret_borrow<py::array>(obj);
}

inline void check_ndim(const py::array& a, int ndim, const std::string& what) {
  if (a.ndim() != ndim)
    throw std::invalid_argument(what + " must be " + std::to_string(ndim) + "-D, got " +
                                std::to_string(a.ndim()) + "-D");
}

// A float32 array of rank ndim (-1: any), C-contiguous (copied if it is not). No other dtype is
// converted: a float64 or integer array is a caller's mistake worth hearing about. (Dtypes are
// compared by equal, here and below, not by is: an array viewed from a file's bytes, as gguf's
// reader gives, has a float32 descriptor that is another object.)
inline py::array_t<float> float_array(const py::handle& obj, int ndim, const std::string& what) {
  py::array a = as_array(obj, what);
  if (!a.dtype().equal(py::dtype::of<float>()))
    throw py::type_error(what + " must be float32, got " + dtype_name(a));
  if (ndim >= 0) check_ndim(a, ndim, what);
  return py::array_t<float, py::array::c_style>::ensure(a);
}

// A 1-D array of int32 or int64 ids, copied; int64 values must fit in int32 (no silent narrowing).
inline std::vector<int32_t> id_vector(const py::handle& obj, const std::string& what) {
  py::array a = as_array(obj, what);
  check_ndim(a, 1, what);
  std::vector<int32_t> out(size_t(a.shape(0)));
  if (a.dtype().equal(py::dtype::of<int32_t>())) {
    auto v = a.unchecked<int32_t, 1>();
    for (py::ssize_t i = 0; i < v.shape(0); i++) out[i] = v(i);
  } else if (a.dtype().equal(py::dtype::of<int64_t>())) {
    auto v = a.unchecked<int64_t, 1>();
    for (py::ssize_t i = 0; i < v.shape(0); i++) {
      if (v(i) < std::numeric_limits<int32_t>::min() || v(i) > std::numeric_limits<int32_t>::max())
        throw std::invalid_argument(what + "[" + std::to_string(i) + "] = " + std::to_string(v(i)) +
                                    " does not fit in int32");
      out[i] = int32_t(v(i));
    }
  } else {
    throw py::type_error(what + " must be int32 or int64, got " + dtype_name(a));
  }
  return out;
}

// A 2-D weight matrix as set_matrix and the kernel tests read it for type t: float32 for F32 and
// the quantized types (quantized at packing), the uint16 (or int16) bits of bf16 / fp16 for BF16,
// BF16P and F16. C-contiguous.
inline py::array weight_array(const py::handle& obj, WType t, const std::string& what) {
  py::array a = as_array(obj, what);
  check_ndim(a, 2, what);
  const bool halves = t == WType::BF16 || t == WType::BF16P || t == WType::F16;
  const bool ok = halves ? a.dtype().equal(py::dtype::of<uint16_t>()) ||
                               a.dtype().equal(py::dtype::of<int16_t>())
                         : a.dtype().equal(py::dtype::of<float>());
  if (!ok)
    throw py::type_error(what + " must be " +
                         (halves ? "uint16 (the bits of bf16 / fp16)" : "float32") +
                         " for this weight type, got " + dtype_name(a));
  if (a.shape(0) < 1 || a.shape(1) < 1 || a.shape(0) > std::numeric_limits<int>::max() / 2 ||
      a.shape(1) > std::numeric_limits<int>::max() / 2)
    throw std::invalid_argument(what + " has an empty or oversized shape");
  return py::array::ensure(a, py::array::c_style);
}

// A 1-D uint8 array, C-contiguous (the raw bytes of a file's tensor; never copied: a view of a
// memory-mapped file stays one).
inline py::array byte_array(const py::handle& obj, const std::string& what) {
  py::array a = as_array(obj, what);
  if (!a.dtype().equal(py::dtype::of<uint8_t>()))
    throw py::type_error(what + " must be uint8, got " + dtype_name(a));
  check_ndim(a, 1, what);
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(what + " must be contiguous");
  return a;
}

// An optional bias of n float32 values (none: empty).
inline py::array_t<float> bias_array(const py::handle& obj, py::ssize_t n,
                                     const std::string& what) {
  if (obj.is_none()) return py::array_t<float>();
  py::array_t<float> b = float_array(obj, 1, what);
  if (b.shape(0) != n)
    throw std::invalid_argument(what + " has " + std::to_string(b.shape(0)) + " values, expected " +
                                std::to_string(n));
  return b;
}

}  // namespace kwker::bindings
