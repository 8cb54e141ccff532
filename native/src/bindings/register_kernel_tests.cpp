// Kernel entry points for the parity tests (tests/native) and the bench's kernel microbenchmark:
// pad the caller's arrays into the layout the kernels read, run one ISA's kernel, and return
// unpadded results. Nothing in the engine calls these.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "../kernels/canonical.h"
#include "../kernels/kernels.h"
#include "../model/buffer.h"
#include "checks.h"

namespace py = pybind11;

namespace kwker {

// register_sampler.cpp: the sampler's entry, on the given kernels
py::tuple softmax_stats_on(const Kernels& kern, py::object x, float t, float close);

namespace {

using bindings::float_array;
using bindings::weight_array;

std::vector<float> pad_rows(const float* src, int rows, int cols, int stride) {
  std::vector<float> out(size_t(rows) * stride + kPad, 0.f);
  for (int r = 0; r < rows; r++)
    std::memcpy(&out[size_t(r) * stride], src + size_t(r) * cols, sizeof(float) * cols);
  return out;
}

// Rows [m, kp] of padded activations quantized as the model quantizes them for the quantized
// kernels: per block (Q8, Q4) or per super-block (Q4K).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> dsum;
  std::vector<int16_t> sums, sums16;
  QuantizedRows(const float* x, int m, int kp, bool super = false)
      : q(size_t(m) * kp),
        d(size_t(m) * kp / (super ? kSuperBlock : kQBlock)),
        dsum(super ? 0 : d.size()),
        sums(super ? size_t(m) * kp / kQBlock : 0),
        sums16(super ? size_t(m) * kp / 16 : 0) {
    if (super)
      quantize_rows_super(x, m, kp, kp, q.data(), d.data(), sums.data(), sums16.data());
    else
      quantize_rows(x, m, kp, kp, q.data(), d.data(), dsum.data());
  }
  QRows view() const { return QRows{q.data(), d.data(), dsum.data(), sums.data(), sums16.data()}; }
};

// The rows the kernel of type t reads: quantized for the quantized types (none otherwise).
QuantizedRows rows_for(WType t, const float* x, int m, int kp) {
  return QuantizedRows(x, wtype_quantized(t) ? m : 0, kp, wtype_super(t));
}

// The weights w packed as type t into `packed`; [*n, *k] their shape. w: float32 [n, k], or
// uint16 [n, k] (bf16 / f16 bits), or for the K formats uint8 [n, k / 256 * block bytes] (ggml
// Q4_K / Q6_K rows; Q4K also quantizes float32 [n, k], k a multiple of 256).
void pack_weights(py::object w_arg, WType t, int* n, int* k, std::vector<char>* packed) {
  const py::array w = bindings::as_array(w_arg, "w");
  if (wtype_super(t) && !(t == WType::Q4K && w.dtype().equal(py::dtype::of<float>()))) {
    const int bb = ggml_block_bytes(t);
    if (!w.dtype().equal(py::dtype::of<uint8_t>()) || w.ndim() != 2 || w.shape(1) % bb ||
        w.shape(0) < 1 || w.shape(1) < 1)
      throw std::invalid_argument("w: " + std::string(format(t).name) + " weights are uint8 [n, " +
                                  "k / 256 * " + std::to_string(bb) + "] (ggml rows)" +
                                  (t == WType::Q4K ? " or float32 [n, k]" : ""));
    const py::array wc = py::array::ensure(w, py::array::c_style);
    *n = int(wc.shape(0)), *k = int(wc.shape(1) / bb * kSuperBlock);
    packed->assign(panel_bytes(t, *n, *k), 0);
    k_from_ggml(t, static_cast<const uint8_t*>(wc.data()), *n, 0, *k, packed->data());
    return;
  }
  const py::array wc = weight_array(w_arg, t, "w");
  *n = int(wc.shape(0)), *k = int(wc.shape(1));
  packed->resize(panel_bytes(t, *n, *k));
  pack_panels(wc.data(), t, *n, *k, packed->data());
}

// y [m, np] = x w^T (+ bias) over every panel, by the kernel of w's type (x as given, or as qx for
// quantized w). Panels [p0, p1) of the call (p1 < 0: all).
void run_matmul(const Kernels& kern, WType t, const float* x, const QuantizedRows& qx, int m,
                int kp, const void* w, int np, float* y, const float* bias, int p0 = 0,
                int p1 = -1) {
  if (p1 < 0) p1 = np / kPanel;
  if (wtype_quantized(t))
    kern.qmatmul[int(t)](qx.view(), m, w, kp, p0, p1, y, np, bias, false);
  else
    kern.matmul[int(t)](x, m, kp, w, kp, p0, p1, y, np, bias, false);
}

// x: [m, k] float32; w: [n, k] float32 or uint16 (bf16 / f16 bits, by wtype). panels: (p0, p1)
// computes the outputs of panels [p0, p1) only (the others stay 0), as a thread's share does.
py::array_t<float> kernel_matmul(const std::string& isa, py::object x_arg, py::object w_arg,
                                 WType t, py::object bias_arg, std::pair<int, int> panels) {
  const Kernels& kern = kernels_select(isa);
  const py::array_t<float> x = float_array(x_arg, 2, "x");
  int n, k;
  std::vector<char> wp;
  pack_weights(w_arg, t, &n, &k, &wp);
  if (x.shape(1) != k || x.shape(0) < 1) throw std::invalid_argument("x and w: shape mismatch");
  const int m = int(x.shape(0)), kp = pad_to(k);
  const py::array_t<float> bias = bindings::bias_array(bias_arg, n, "bias");
  std::vector<float> xp = pad_rows(x.data(), m, k, kp);
  const int np = pad_to(n, kPanel);
  if (panels.second < 0) panels.second = np / kPanel;
  if (panels.first < 0 || panels.first > panels.second || panels.second > np / kPanel)
    throw std::invalid_argument("panels out of range");
  std::vector<float> b;
  if (bias.size()) {
    b.assign(np, 0.f);
    std::copy(bias.data(), bias.data() + n, b.begin());
  }
  std::vector<float> yp(size_t(m) * np);
  {
    py::gil_scoped_release release;
    run_matmul(kern, t, xp.data(), rows_for(t, xp.data(), m, kp), m, kp, wp.data(), np, yp.data(),
               b.empty() ? nullptr : b.data(), panels.first, panels.second);
  }
  py::array_t<float> y({m, n});
  for (int r = 0; r < m; r++)
    std::memcpy(y.mutable_data() + size_t(r) * n, &yp[size_t(r) * np], sizeof(float) * n);
  return y;
}

// Best seconds of one single-threaded matmul call of m rows against an [n, k] matrix of random
// weights (a kernel microbenchmark: weights packed once, activations quantized once, as in a model
// step).
double kernel_matmul_seconds(const std::string& isa, int m, int n, int k, WType t, int repeats) {
  const Kernels& kern = kernels_select(isa);
  if (m < 1 || n < 1 || k < 1 || repeats < 1 || m > 4096 || n > (1 << 20) || k > (1 << 16))
    throw std::invalid_argument("sizes must be positive (m <= 4096, n <= 2^20, k <= 2^16)");
  const int kp = pad_to(k), np = pad_to(n, kPanel);
  uint32_t state = 12345;
  auto rnd = [&] {
    state = state * 1664525u + 1013904223u;
    return float(int(state >> 9) - (1 << 22)) / (1 << 22);
  };
  std::vector<float> xp(size_t(m) * kp + kPad, 0.f), wf(size_t(n) * k);
  for (int r = 0; r < m; r++)
    for (int c = 0; c < k; c++) xp[size_t(r) * kp + c] = rnd();
  for (float& v : wf) v = rnd();
  std::vector<uint16_t> wh;
  std::vector<uint8_t> wq;
  const void* src = wf.data();
  if (wtype_super(t)) {  // random ggml rows, their fp16 scales 2^-10
    if (k % kSuperBlock) throw std::invalid_argument("K formats: k must be a multiple of 256");
    const int bb = ggml_block_bytes(t);
    wq.resize(size_t(n) * (k / kSuperBlock) * bb);
    for (size_t i = 0; i < wq.size(); i++) wq[i] = uint8_t(rnd() * 65536.f);
    for (size_t b = 0; b < wq.size(); b += bb)
      for (int off : t == WType::Q4K ? std::vector<int>{0, 2} : std::vector<int>{208})
        wq[b + off] = 0, wq[b + off + 1] = 0x14;
  } else if (!wtype_quantized(t) && t != WType::F32) {  // bf16 / f16 bits
    wh.resize(wf.size());
    for (size_t i = 0; i < wf.size(); i++) {
      uint32_t u;
      std::memcpy(&u, &wf[i], 4);
      // bf16 truncation; for f16 any bit pattern of small values is fine to time
      wh[i] = uint16_t(u >> 16);
    }
    src = wh.data();
  }
  Buffer wp(panel_bytes(t, n, k), /*huge_pages=*/true);  // as a model's packed weights
  if (wtype_super(t))
    k_from_ggml(t, wq.data(), n, 0, k, wp.as<char>());
  else
    pack_panels(src, t, n, k, wp.as<char>());
  std::vector<float> yp(size_t(m) * np);
  const QuantizedRows qx = rows_for(t, xp.data(), m, kp);
  py::gil_scoped_release release;
  double best = 1e30;
  for (int r = 0; r < repeats; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    run_matmul(kern, t, xp.data(), qx, m, kp, wp.as<char>(), np, yp.data(), nullptr);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// x [m, k] as the quantized kernels see it: each row quantized per block of kQBlock to int8 and
// dequantized.
py::array_t<float> kernel_quantized_activations(py::object x_arg) {
  const py::array_t<float> x = float_array(x_arg, 2, "x");
  const int m = int(x.shape(0)), k = int(x.shape(1)), kp = pad_to(k), nb = kp / kQBlock;
  const QuantizedRows qx(pad_rows(x.data(), m, k, kp).data(), m, kp);
  py::array_t<float> out({m, k});
  for (int r = 0; r < m; r++)
    for (int c = 0; c < k; c++)
      out.mutable_data()[size_t(r) * k + c] =
          float(qx.q[size_t(r) * kp + c]) * qx.d[size_t(r) * nb + c / kQBlock];
  return out;
}

// x [m, k] quantized per super-block, as the K formats' kernels read it: (q [m, kp] int8, d [m,
// kp / 256], sums [m, kp / 32] and sums16 [m, kp / 16] int16). Every ISA uses this quantizer.
py::tuple kernel_quantize_super(py::object x_arg) {
  const py::array_t<float> x = float_array(x_arg, 2, "x");
  const int m = int(x.shape(0)), k = int(x.shape(1)), kp = pad_to(k, kSuperBlock);
  const QuantizedRows qx(pad_rows(x.data(), m, k, kp).data(), m, kp, true);
  py::array_t<int8_t> q({m, kp});
  py::array_t<float> d({m, kp / kSuperBlock});
  py::array_t<int16_t> sums({m, kp / kQBlock}), sums16({m, kp / 16});
  std::copy(qx.q.begin(), qx.q.end(), q.mutable_data());
  std::copy(qx.d.begin(), qx.d.end(), d.mutable_data());
  std::copy(qx.sums.begin(), qx.sums.end(), sums.mutable_data());
  std::copy(qx.sums16.begin(), qx.sums16.end(), sums16.mutable_data());
  return py::make_tuple(q, d, sums, sums16);
}

// x [m, k] quantized per row and block by the ISA's kernel: (q [m, kp] int8, d and dsum [m, kp /
// kQBlock]).
py::tuple kernel_quantize(const std::string& isa, py::object x_arg) {
  const Kernels& kern = kernels_select(isa);
  const py::array_t<float> x = float_array(x_arg, 2, "x");
  const int m = int(x.shape(0)), k = int(x.shape(1)), kp = pad_to(k), nb = kp / kQBlock;
  const std::vector<float> xp = pad_rows(x.data(), m, k, kp);
  py::array_t<int8_t> q({m, kp});
  py::array_t<float> d({m, nb}), dsum({m, nb});
  kern.quantize(xp.data(), m, kp, kp, q.mutable_data(), d.mutable_data(), dsum.mutable_data());
  return py::make_tuple(q, d, dsum);
}

// The weights [n, k] as the kernels see them after packing (and quantizing) to wtype.
py::array_t<float> kernel_weights(py::object w_arg, WType t) {
  int n, k;
  std::vector<char> packed;
  pack_weights(w_arg, t, &n, &k, &packed);
  const int kp = pad_to(k);
  py::array_t<float> out({n, k});
  for (int r = 0; r < n; r++)
    for (int c = 0; c < k; c++)
      out.mutable_data()[size_t(r) * k + c] = panel_value(packed.data(), t, kp, r, c);
  return out;
}

// q: [rows, hd], k, v: [n, hd]. One query token (ends empty: its rows attend to keys first[0]..n-1)
// or len(ends) tokens of rows / len(ends) heads each, token t attending to keys first[t]..ends[t]-1
// (first: one value for all, or one per token). kv_f16: k and v are stored as fp16 first (the
// cache's fp16 type: rounded to nearest even). panels_per_part > 0: the call made by its parts
// (AttendPartFn), the key panels cut every panels_per_part and visited last to first, the rows one
// at a time, the columns kAttendColumns at a time.
py::array_t<float> kernel_attend(const std::string& isa, py::object q_arg, py::object k_arg,
                                 py::object v_arg, float scale, py::object first_arg, bool kv_f16,
                                 std::vector<int> ends, int panels_per_part) {
  const Kernels& kern = kernels_select(isa);
  const py::array_t<float> q = float_array(q_arg, 2, "q"), k = float_array(k_arg, 2, "k"),
                           v = float_array(v_arg, 2, "v");
  std::vector<int> first = py::isinstance<py::int_>(first_arg)
                               ? std::vector<int>{first_arg.cast<int>()}
                               : first_arg.cast<std::vector<int>>();
  const int rows = int(q.shape(0)), n = int(k.shape(0)), hd = int(k.shape(1)), hdp = pad_to(hd);
  if (n < 1 || hd < 1 || hd > 4096)
    throw std::invalid_argument("k must hold 1 or more keys of 1..4096 dims");
  if (ends.empty()) ends.push_back(n);
  const int nt = int(ends.size()), g = rows / nt;
  if (first.size() == 1) first.assign(nt, first[0]);
  if (q.shape(1) != hd || v.shape(0) != n || v.shape(1) != hd || g < 1 || g * nt != rows ||
      g > kMaxAttendHeads || rows > kMaxAttendRows || int(first.size()) != nt)
    throw std::invalid_argument("shape mismatch");
  for (int t = 0; t < nt; t++)
    if (first[t] < 0 || first[t] >= ends[t] || ends[t] > n)
      throw std::invalid_argument("need 0 <= first < end <= n");
  if (panels_per_part < 0) throw std::invalid_argument("panels_per_part must be >= 0");
  std::vector<float> qp = pad_rows(q.data(), rows, hd, hdp), vp = pad_rows(v.data(), n, hd, hdp);
  std::vector<float> kp(size_t(pad_to(n, kPanel)) * hdp, 0.f), scores(size_t(rows) * pad_to(n)),
      out(size_t(rows) * hdp);
  for (int i = 0; i < n; i++)
    for (int d = 0; d < hd; d++) kp[panel_index(i, d, hdp)] = k.data()[size_t(i) * hd + d];
  const size_t q_stride = size_t(g) * hdp;
  auto half = [](const std::vector<float>& f) {
    std::vector<uint16_t> h(f.size());
    kernels_generic().to_f16(f.data(), h.data(), int(f.size()));
    return h;
  };
  const std::vector<uint16_t> kh = kv_f16 ? half(kp) : std::vector<uint16_t>(),
                              vh = kv_f16 ? half(vp) : kh;
  const int type = int(kv_f16 ? KVType::F16 : KVType::F32);
  const void* kd = kv_f16 ? static_cast<const void*>(kh.data()) : kp.data();
  const void* vd = kv_f16 ? static_cast<const void*>(vh.data()) : vp.data();
  if (panels_per_part <= 0) {
    attend_whole(kern.attend_part[type], qp.data(), g, nt, q_stride, kd, vd, first.data(),
                 ends.data(), hdp, scale, scores.data(), out.data());
  } else {
    auto part = [&](AttendPhase phase, int lo, int hi) {
      kern.attend_part[type](phase, lo, hi, qp.data(), g, nt, q_stride, kd, vd, first.data(),
                             ends.data(), hdp, scale, scores.data(), out.data());
    };
    const int panels = pad_to(n, kPanel) / kPanel;
    for (int p = (panels - 1) / panels_per_part * panels_per_part; p >= 0; p -= panels_per_part)
      part(AttendPhase::Scores, p, p + panels_per_part);
    for (int j = rows - 1; j >= 0; j--) part(AttendPhase::Softmax, j, j + 1);
    for (int c = hdp - kAttendColumns; c >= 0; c -= kAttendColumns)
      part(AttendPhase::Values, c, c + kAttendColumns);
  }
  py::array_t<float> r({rows, hd});
  for (int j = 0; j < rows; j++)
    std::memcpy(r.mutable_data() + size_t(j) * hd, &out[size_t(j) * hdp], sizeof(float) * hd);
  return r;
}

// x as fp16 bits, by the ISA's conversion (the one that writes the KV cache)
py::array_t<uint16_t> kernel_to_f16(const std::string& isa, py::object x_arg) {
  const Kernels& kern = kernels_select(isa);
  const py::array_t<float> x = float_array(x_arg, 1, "x");
  py::array_t<uint16_t> out(x.size());
  kern.to_f16(x.data(), out.mutable_data(), int(x.size()));
  return out;
}

py::array_t<float> kernel_glu(const std::string& isa, py::object gate_arg, py::object up_arg,
                              Activation act) {
  const Kernels& kern = kernels_select(isa);
  const py::array_t<float> gate = float_array(gate_arg, 1, "gate"),
                           up = float_array(up_arg, 1, "up");
  const int n = int(gate.size()), np = pad_to(n);
  if (up.size() != n) throw std::invalid_argument("gate and up differ in length");
  std::vector<float> g = pad_rows(gate.data(), 1, n, np), u = pad_rows(up.data(), 1, n, np), o(np);
  kern.glu[int(act)](g.data(), u.data(), o.data(), np);
  py::array_t<float> r(n);
  std::memcpy(r.mutable_data(), o.data(), sizeof(float) * n);
  return r;
}

// fma_exact (canonical.h) element by element: the reference kernels' fma where the C library's is
// not exact (Windows); tested on every system.
py::array_t<float> kernel_fma_exact(py::object a_arg, py::object b_arg, py::object c_arg) {
  const py::array_t<float> a = float_array(a_arg, 1, "a"), b = float_array(b_arg, 1, "b"),
                           c = float_array(c_arg, 1, "c");
  if (b.size() != a.size() || c.size() != a.size())
    throw std::invalid_argument("a, b and c differ in length");
  py::array_t<float> r(a.size());
  for (py::ssize_t i = 0; i < a.size(); i++)
    r.mutable_data()[i] = fma_exact(a.data()[i], b.data()[i], c.data()[i]);
  return r;
}

}  // namespace

void register_kernel_tests(py::module_& m) {
  m.def("kernel_matmul", &kernel_matmul, py::arg("isa"), py::arg("x"), py::arg("w"),
        py::arg("wtype"), py::arg("bias") = py::none(), py::arg("panels") = std::make_pair(0, -1));
  m.def("kernel_matmul_seconds", &kernel_matmul_seconds, py::arg("isa"), py::arg("m"), py::arg("n"),
        py::arg("k"), py::arg("wtype"), py::arg("repeats") = 5);
  m.def("kernel_weights", &kernel_weights, py::arg("w"), py::arg("wtype"));
  m.def(
      "kernel_int4_format",
      [](py::object w_arg) {
        const py::array_t<float> w = float_array(w_arg, 2, "w");
        if (w.shape(0) < 1 || w.shape(0) > kPanel || w.shape(1) % kSuperBlock || !w.shape(1))
          throw std::invalid_argument("w: 1 to 16 rows of a multiple of 256 values");
        return q4_or_q4k(w.data(), int(w.shape(0)), int(w.shape(1)));
      },
      py::arg("w"), "the format int4 packs float rows as (Q4K, or Q4 where it holds them better)");
  m.def("kernel_quantized_activations", &kernel_quantized_activations, py::arg("x"));
  m.def("kernel_quantize", &kernel_quantize, py::arg("isa"), py::arg("x"));
  m.def("kernel_quantize_super", &kernel_quantize_super, py::arg("x"));
  m.def("kernel_attend", &kernel_attend, py::arg("isa"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("scale"), py::arg("first") = 0, py::arg("kv_f16") = false,
        py::arg("ends") = std::vector<int>{}, py::arg("panels_per_part") = 0);
  m.def("kernel_to_f16", &kernel_to_f16, py::arg("isa"), py::arg("x"));
  m.def(
      "kernel_softmax_stats",  // the sampler's entry on one ISA's kernels
      [](const std::string& isa, py::object x, float t, float close) {
        return softmax_stats_on(kernels_select(isa), x, t, close);
      },
      py::arg("isa"), py::arg("x"), py::arg("temperature"), py::arg("close"));
  m.def(
      "kernel_argmax",
      [](const std::string& isa, py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        if (x.ndim() != 1 || x.shape(0) == 0) throw std::invalid_argument("argmax takes a row");
        return kernels_select(isa).argmax(x.data(), int(x.shape(0)));
      },
      py::arg("isa"), py::arg("x"));
  m.def("kernel_glu", &kernel_glu, py::arg("isa"), py::arg("gate"), py::arg("up"),
        py::arg("activation") = Activation::Silu, "act(gate) * up");
  m.def("kernel_fma_exact", &kernel_fma_exact, py::arg("a"), py::arg("b"), py::arg("c"),
        "a * b + c rounded once, by the reference kernels' portable fma");
}

}  // namespace kwker
