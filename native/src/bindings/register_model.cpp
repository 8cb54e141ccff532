// kwker._native.Model: built from a config dict and numpy weight arrays; step() runs one decode step.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "../model/model.h"

namespace py = pybind11;

namespace kwker {

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

Config config_from_dict(const py::dict& d) {
  Config c;
  c.n_layer = d["n_layer"].cast<int>();
  c.n_embd = d["n_embd"].cast<int>();
  c.n_head = d["n_head"].cast<int>();
  c.n_kv_head = d["n_kv_head"].cast<int>();
  c.head_dim = d["head_dim"].cast<int>();
  c.n_ff = d["n_ff"].cast<int>();
  c.vocab = d["vocab"].cast<int>();
  c.norm_eps = d["norm_eps"].cast<float>();
  c.attn_scale = d["attn_scale"].cast<float>();
  c.wtype = WType(d["wtype"].cast<int>());
  c.tied_embeddings = d["tied_embeddings"].cast<bool>();
  c.qk_norm = d.contains("qk_norm") && d["qk_norm"].cast<bool>();
  c.post_norms = d.contains("post_norms") && d["post_norms"].cast<bool>();
  if (d.contains("activation")) c.act = Activation(d["activation"].cast<int>());
  if (d.contains("embed_scale")) c.embed_scale = d["embed_scale"].cast<float>();
  if (d.contains("rope_dim")) c.rope_dim = d["rope_dim"].cast<int>();
  if (d.contains("layer_window")) c.layer_window = d["layer_window"].cast<std::vector<int>>();
  if (d.contains("layer_rope")) c.layer_rope = d["layer_rope"].cast<std::vector<int>>();
  if (d.contains("kv_f16")) c.kv_type = d["kv_f16"].cast<bool>() ? KVType::F16 : KVType::F32;
  return c;
}

std::unique_ptr<Model> make_model(const py::dict& config, F32Array rope_cos, F32Array rope_sin, int max_cache_len,
                                  int n_slots, int max_step_tokens, int max_out_rows, int threads,
                                  const std::string& isa) {
  Config c = config_from_dict(config);
  const py::ssize_t half = (c.rope_dim ? c.rope_dim : c.head_dim) / 2;
  const bool one_table = rope_cos.ndim() == 2;  // [max_cache_len, half], or n tables [n, max_cache_len, half]
  for (auto* a : {&rope_cos, &rope_sin})
    if (a->ndim() != rope_cos.ndim() || (a->ndim() != 2 && a->ndim() != 3) || a->shape(0) != rope_cos.shape(0) ||
        a->shape(a->ndim() - 2) != max_cache_len || a->shape(a->ndim() - 1) != half)
      throw std::invalid_argument("rope tables must be [max_cache_len, rope_dim / 2] or [n, max_cache_len, rope_dim / 2]");
  return std::make_unique<Model>(c, one_table ? 1 : int(rope_cos.shape(0)), rope_cos.data(), rope_sin.data(),
                                 max_cache_len, n_slots, max_step_tokens, max_out_rows, threads, isa);
}

void set_matrix(Model& m, const std::string& name, py::array w, int wtype, py::object bias) {
  if (w.ndim() != 2) throw std::invalid_argument("weight " + name + " must be 2-D");
  if (wtype < 0 || wtype >= kWTypes) throw std::invalid_argument("unknown weight type");
  const size_t want = wtype_quantized(WType(wtype)) ? 4 : wtype_size(WType(wtype));  // quantized: from float32
  if (size_t(w.itemsize()) != want)
    throw std::invalid_argument("weight " + name + " element size does not match its type");
  auto wc = py::array::ensure(w, py::array::c_style);
  const float* b = nullptr;
  F32Array ba;
  if (!bias.is_none()) {
    ba = bias.cast<F32Array>();
    if (ba.size() != w.shape(0)) throw std::invalid_argument("bias of " + name + " has the wrong size");
    b = ba.data();
  }
  m.set_matrix(name, wc.data(), WType(wtype), int(w.shape(0)), int(w.shape(1)), b);
}

// tokens, slots, positions: [T]; out_rows: [R]. Returns argmax [R]; logits stay in the model (see logits()).
py::array_t<int32_t> step(Model& m, I32Array tokens, I32Array slots, I32Array positions, I32Array out_rows) {
  const int T = int(tokens.size()), R = int(out_rows.size());
  if (T < 1 || T > m.max_step_tokens())
    throw std::invalid_argument("a step takes 1.." + std::to_string(m.max_step_tokens()) + " tokens, got " +
                                std::to_string(T));
  if (slots.size() != T || positions.size() != T) throw std::invalid_argument("tokens, slots, positions differ in length");
  if (R > T || R > m.max_out_rows())
    throw std::invalid_argument("a step returns at most " + std::to_string(m.max_out_rows()) + " rows of logits");
  const Config& c = m.config();
  for (int t = 0; t < T; t++) {
    if (tokens.data()[t] < 0 || tokens.data()[t] >= c.vocab)
      throw std::invalid_argument("token id " + std::to_string(tokens.data()[t]) + " outside the vocabulary of " +
                                  std::to_string(c.vocab));
    if (slots.data()[t] < 0 || slots.data()[t] >= m.n_slots()) throw std::invalid_argument("slot out of range");
    if (positions.data()[t] < 0 || positions.data()[t] >= m.max_cache_len())
      throw std::invalid_argument("position " + std::to_string(positions.data()[t]) + " outside the cache of " +
                                  std::to_string(m.max_cache_len()));
  }
  for (int r = 0; r < R; r++)
    if (out_rows.data()[r] < 0 || out_rows.data()[r] >= T) throw std::invalid_argument("output row out of range");
  py::array_t<int32_t> argmax(R);
  {
    py::gil_scoped_release release;
    m.step(tokens.data(), slots.data(), positions.data(), T, out_rows.data(), R, argmax.mutable_data());
  }
  return argmax;
}

}  // namespace

void register_model(py::module_& mod) {
  py::class_<Model>(mod, "Model")
      .def(py::init(&make_model), py::arg("config"), py::arg("rope_cos"), py::arg("rope_sin"),
           py::arg("max_cache_len"), py::arg("n_slots"), py::arg("max_step_tokens"), py::arg("max_out_rows"),
           py::arg("threads"), py::arg("isa") = "")
      .def("set_matrix", &set_matrix, py::arg("name"), py::arg("w"), py::arg("wtype"), py::arg("bias") = py::none())
      .def(
          "set_norm",
          [](Model& m, const std::string& name, F32Array w) { m.set_norm(name, w.data(), int(w.size())); },
          py::arg("name"), py::arg("w"))
      .def("check_complete", &Model::check_complete)
      .def("step", &step, py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("out_rows"))
      .def(
          "logits",
          [](py::object self, int rows) {
            Model& m = self.cast<Model&>();
            if (rows < 0 || rows > m.max_out_rows()) throw std::invalid_argument("rows out of range");
            // A view of the model's buffer [rows, vocab]; valid until the next step.
            return py::array_t<float>({rows, m.config().vocab},
                                      {sizeof(float) * m.vocab_stride(), sizeof(float)}, m.logits(), self);
          },
          py::arg("rows"))
      .def_property_readonly("isa", &Model::isa)
      .def_property_readonly("threads", &Model::threads)
      .def_property_readonly("max_cache_len", &Model::max_cache_len)
      .def_property_readonly("n_slots", &Model::n_slots)
      .def_property_readonly("max_step_tokens", &Model::max_step_tokens)
      .def_property_readonly("max_out_rows", &Model::max_out_rows)
      .def_property_readonly("weight_bytes_per_token", &Model::weight_bytes_per_token);
}

}  // namespace kwker
