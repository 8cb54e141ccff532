// kwker._native.Model: built from a config dict and numpy weight arrays; step() runs one decode
// step.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "../formats/ggml.h"
#include "../model/model.h"
#include "checks.h"

namespace py = pybind11;

namespace kwker {

namespace {

using bindings::float_array;
using bindings::id_vector;

// A positive int entry of the config dict.
int config_int(const py::dict& d, const char* key, bool required = true, int fallback = 0) {
  if (!d.contains(key)) {
    if (required) throw std::invalid_argument(std::string("config has no '") + key + "'");
    return fallback;
  }
  const py::handle v = d[key];
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw py::type_error(std::string("config['") + key + "'] must be an int");
  return v.cast<int>();
}

Config config_from_dict(const py::dict& d) {
  Config c;
  c.n_layer = config_int(d, "n_layer");
  c.n_embd = config_int(d, "n_embd");
  c.n_head = config_int(d, "n_head");
  c.n_kv_head = config_int(d, "n_kv_head");
  c.head_dim = config_int(d, "head_dim");
  c.n_ff = config_int(d, "n_ff");
  c.vocab = config_int(d, "vocab");
  c.norm_eps = d["norm_eps"].cast<float>();
  c.attn_scale = d["attn_scale"].cast<float>();
  c.wtype = d["wtype"].cast<WType>();
  c.tied_embeddings = d["tied_embeddings"].cast<bool>();
  c.qk_norm = d.contains("qk_norm") && d["qk_norm"].cast<bool>();
  c.post_norms = d.contains("post_norms") && d["post_norms"].cast<bool>();
  if (d.contains("activation")) c.act = d["activation"].cast<Activation>();
  if (d.contains("embed_scale")) c.embed_scale = d["embed_scale"].cast<float>();
  c.rope_dim = config_int(d, "rope_dim", false, 0);
  if (d.contains("layer_window")) c.layer_window = d["layer_window"].cast<std::vector<int>>();
  if (d.contains("layer_rope")) c.layer_rope = d["layer_rope"].cast<std::vector<int>>();
  if (d.contains("kv_f16")) c.kv_type = d["kv_f16"].cast<bool>() ? KVType::F16 : KVType::F32;
  if (!std::isfinite(c.norm_eps) || !std::isfinite(c.attn_scale) || !std::isfinite(c.embed_scale))
    throw std::invalid_argument("norm_eps, attn_scale and embed_scale must be finite");
  return c;
}

std::unique_ptr<Model> make_model(const py::dict& config, py::object cos_arg, py::object sin_arg,
                                  int max_cache_len, int n_slots, int max_step_tokens,
                                  int max_out_rows, int threads, const std::string& isa) {
  Config c = config_from_dict(config);
  if (c.head_dim < 2 || c.rope_dim < 0 || c.rope_dim > c.head_dim)
    throw std::invalid_argument("head_dim must be at least 2 and rope_dim at most head_dim");
  const py::ssize_t half = (c.rope_dim ? c.rope_dim : c.head_dim) / 2;
  // [max_cache_len, half], or n tables [n, max_cache_len, half]
  py::array_t<float> rope_cos = float_array(cos_arg, -1, "rope_cos"),
                     rope_sin = float_array(sin_arg, -1, "rope_sin");
  const py::ssize_t nd = rope_cos.ndim();
  bool ok = (nd == 2 || nd == 3) && rope_sin.ndim() == nd;
  for (py::ssize_t i = 0; ok && i < nd; i++) ok = rope_cos.shape(i) == rope_sin.shape(i);
  if (!ok || rope_cos.shape(nd - 2) != max_cache_len || rope_cos.shape(nd - 1) != half ||
      rope_cos.shape(0) < 1)
    throw std::invalid_argument(
        "rope tables must be [max_cache_len, rope_dim / 2] or [n, max_cache_len, rope_dim / 2]");
  return std::make_unique<Model>(c, nd == 2 ? 1 : int(rope_cos.shape(0)), rope_cos.data(),
                                 rope_sin.data(), max_cache_len, n_slots, max_step_tokens,
                                 max_out_rows, threads, isa);
}

void set_matrix(Model& m, const std::string& name, py::object w_arg, WType wtype,
                py::object bias_arg) {
  const py::array w = bindings::weight_array(w_arg, wtype, "weight " + name);
  const py::array_t<float> bias = bindings::bias_array(bias_arg, w.shape(0), "bias of " + name);
  m.set_matrix(name, w.data(), wtype, int(w.shape(0)), int(w.shape(1)),
               bias.size() ? bias.data() : nullptr);
}

// raw: a 1-D uint8 view of the tensor's bytes in the file (n rows of k values of ggml type
// src_type); row_order: None or a permutation of 0..n-1 (row r is read from row row_order[r]).
void set_matrix_ggml(Model& m, const std::string& name, py::object raw_arg, int src_type, int n,
                     int k, WType wtype, py::object bias_arg, py::object row_order_arg) {
  const GgmlTypeInfo* t = ggml_type_info(src_type);
  if (!t)
    throw std::invalid_argument("weight " + name + ": ggml type " + std::to_string(src_type) +
                                " is not supported");
  if (n < 1 || k < 1 || k % t->block)
    throw std::invalid_argument("weight " + name + ": shape [" + std::to_string(n) + ", " +
                                std::to_string(k) + "] is not whole rows of " + t->name +
                                " blocks");
  const py::array raw = bindings::byte_array(raw_arg, "weight " + name);
  const size_t want = size_t(n) * ggml_row_bytes(*t, k);
  if (size_t(raw.size()) != want)
    throw std::invalid_argument("weight " + name + " has " + std::to_string(raw.size()) +
                                " bytes, its shape takes " + std::to_string(want));
  const py::array_t<float> bias = bindings::bias_array(bias_arg, n, "bias of " + name);
  std::vector<int32_t> order;
  if (!row_order_arg.is_none()) {
    order = id_vector(row_order_arg, "row_order of " + name);
    std::vector<bool> seen(size_t(n), false);
    bool ok = int(order.size()) == n;
    for (size_t i = 0; ok && i < order.size(); i++) {
      ok = order[i] >= 0 && order[i] < n && !seen[order[i]];
      if (ok) seen[order[i]] = true;
    }
    if (!ok)
      throw std::invalid_argument("row_order of " + name + " is not a permutation of its rows");
  }
  const uint8_t* data = static_cast<const uint8_t*>(raw.data());
  py::gil_scoped_release release;  // raw and bias stay alive: this frame holds them
  m.set_matrix_ggml(name, data, src_type, n, k, wtype, bias.size() ? bias.data() : nullptr,
                    order.empty() ? nullptr : order.data());
}

// A writable uint8 view of the room for `name`'s packed panels, which the caller fills.
py::array set_matrix_packed(py::object self, const std::string& name, WType wtype, int n, int k,
                            py::object bias_arg) {
  Model& m = self.cast<Model&>();
  if (n < 1 || k < 1) throw std::invalid_argument("weight " + name + ": bad shape");
  const py::array_t<float> bias = bindings::bias_array(bias_arg, n, "bias of " + name);
  void* w = m.set_matrix_packed(name, wtype, n, k, bias.size() ? bias.data() : nullptr);
  return py::array_t<uint8_t>({py::ssize_t(panel_bytes(wtype, n, k))}, {1},
                              static_cast<uint8_t*>(w), self);
}

// A read-only uint8 view of a loaded matrix's packed panels (None if it is not loaded).
py::object packed(py::object self, const std::string& name) {
  const Matrix* mat = self.cast<Model&>().matrix(name);
  if (!mat) return py::none();
  py::array_t<uint8_t> view({py::ssize_t(mat->bytes())}, {1}, static_cast<const uint8_t*>(mat->w),
                            self);
  py::detail::array_proxy(view.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return view;
}

// The format a loaded matrix is packed in (None if it is not loaded): set_matrix_ggml may pack
// another than it was asked for (Q4 for Q4K, see q4_or_q4k).
py::object matrix_format(Model& m, const std::string& name) {
  const Matrix* mat = m.matrix(name);
  return mat ? py::cast(mat->type) : py::none();
}

void set_norm(Model& m, const std::string& name, py::object w_arg) {
  const py::array_t<float> w = float_array(w_arg, 1, "norm " + name);
  m.set_norm(name, w.data(), int(w.shape(0)));
}

// tokens, slots, positions: [T] int32/int64; out_rows: [R]. Returns argmax [R]; the logits stay in
// the model (see logits()). The ids are copied before the GIL is released.
// also: None or [T] (-1, or the slot whose cache also takes token t's K/V: see Model::step).
py::array_t<int32_t> step(Model& m, py::object tokens_arg, py::object slots_arg,
                          py::object positions_arg, py::object out_rows_arg, py::object also_arg) {
  const std::vector<int32_t> tokens = id_vector(tokens_arg, "tokens"),
                             slots = id_vector(slots_arg, "slots"),
                             positions = id_vector(positions_arg, "positions"),
                             out_rows = id_vector(out_rows_arg, "out_rows");
  const int T = int(tokens.size()), R = int(out_rows.size());
  if (T < 1 || T > m.max_step_tokens())
    throw std::invalid_argument("a step takes 1.." + std::to_string(m.max_step_tokens()) +
                                " tokens, got " + std::to_string(T));
  if (int(slots.size()) != T || int(positions.size()) != T)
    throw std::invalid_argument("tokens, slots, positions differ in length");
  if (R > T || R > m.max_out_rows())
    throw std::invalid_argument("a step returns at most " + std::to_string(m.max_out_rows()) +
                                " rows of logits");
  const Config& c = m.config();
  for (int t = 0; t < T; t++) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      throw std::invalid_argument("token id " + std::to_string(tokens[t]) +
                                  " outside the vocabulary of " + std::to_string(c.vocab));
    if (slots[t] < 0 || slots[t] >= m.n_slots())
      throw std::invalid_argument("slot " + std::to_string(slots[t]) + " out of range (" +
                                  std::to_string(m.n_slots()) + " slots)");
    if (positions[t] < 0 || positions[t] >= m.max_cache_len())
      throw std::invalid_argument("position " + std::to_string(positions[t]) +
                                  " outside the cache of " + std::to_string(m.max_cache_len()));
  }
  for (int r = 0; r < R; r++)
    if (out_rows[r] < 0 || out_rows[r] >= T) throw std::invalid_argument("output row out of range");
  std::vector<int32_t> also;
  if (!also_arg.is_none()) {
    also = id_vector(also_arg, "also");
    if (int(also.size()) != T) throw std::invalid_argument("also and tokens differ in length");
    // every (slot, position) a row writes, at most once: two writes would race
    std::set<std::pair<int, int>> written;
    for (int t = 0; t < T; t++) written.insert({slots[t], positions[t]});
    for (int t = 0; t < T; t++) {
      if (also[t] < -1 || also[t] >= m.n_slots() || also[t] == slots[t])
        throw std::invalid_argument("also[" + std::to_string(t) + "] must be -1 or another slot");
      if (also[t] >= 0 && !written.insert({also[t], positions[t]}).second)
        throw std::invalid_argument("two rows write slot " + std::to_string(also[t]) +
                                    " at position " + std::to_string(positions[t]));
    }
  }
  py::array_t<int32_t> argmax(R);
  int32_t* am = argmax.mutable_data();
  {
    py::gil_scoped_release release;
    m.step(tokens.data(), slots.data(), positions.data(), T, out_rows.data(), R, am,
           also.empty() ? nullptr : also.data());
  }
  return argmax;
}

void copy_cache(Model& m, int src, int dst, int start, int n) {
  if (src < 0 || src >= m.n_slots() || dst < 0 || dst >= m.n_slots() || src == dst)
    throw std::invalid_argument("copy_cache takes two different slots of " +
                                std::to_string(m.n_slots()));
  if (start < 0 || n < 0 || int64_t(start) + n > m.max_cache_len())
    throw std::invalid_argument("positions outside the cache of " +
                                std::to_string(m.max_cache_len()));
  py::gil_scoped_release release;
  m.copy_cache(src, dst, start, n);
}

// tokens: [T] the catch-up; returns the proposed tokens [n <= k] (Model::propose).
// With alternatives: (tokens [n], their probabilities [n], the runner-up at each position [n]).
py::object propose(Model& m, py::object tokens_arg, int slot, int start, int k, bool subset,
                   float min_prob, bool alternatives) {
  const std::vector<int32_t> tokens = id_vector(tokens_arg, "tokens");
  const int T = int(tokens.size());
  if (T < 1 || T > m.max_step_tokens())
    throw std::invalid_argument("a step takes 1.." + std::to_string(m.max_step_tokens()) +
                                " tokens, got " + std::to_string(T));
  if (k < 1) throw std::invalid_argument("a proposal has at least 1 token");
  if (slot < 0 || slot >= m.n_slots())
    throw std::invalid_argument("slot " + std::to_string(slot) + " out of range");
  // the last proposed token is not run: positions up to start + T + k - 2
  if (start < 0 || int64_t(start) + T + k - 1 > m.max_cache_len())
    throw std::invalid_argument("a proposal past the cache of " +
                                std::to_string(m.max_cache_len()));
  for (int t = 0; t < T; t++)
    if (tokens[t] < 0 || tokens[t] >= m.config().vocab)
      throw std::invalid_argument("token id " + std::to_string(tokens[t]) +
                                  " outside the vocabulary");
  if (!(min_prob >= 0.f && min_prob <= 1.f))
    throw std::invalid_argument("min_prob must be in [0, 1], got " + std::to_string(min_prob));
  std::vector<int32_t> out(k), second(alternatives ? k : 0);  // [k]
  std::vector<float> probs(alternatives ? k : 0);             // [k]
  int n;
  {
    py::gil_scoped_release release;
    n = m.propose(tokens.data(), T, slot, start, k, subset, min_prob, out.data(),
                  alternatives ? probs.data() : nullptr, alternatives ? second.data() : nullptr);
  }
  py::array_t<int32_t> ids(n, out.data());
  if (!alternatives) return std::move(ids);
  return py::make_tuple(ids, py::array_t<float>(n, probs.data()),
                        py::array_t<int32_t>(n, second.data()));
}

void set_head_subset(Model& m, py::object ids_arg) {
  const std::vector<int32_t> ids = id_vector(ids_arg, "ids");
  py::gil_scoped_release release;
  m.set_head_subset(ids.data(), int(ids.size()));
}

}  // namespace

void register_model(py::module_& mod) {
  py::class_<Model>(mod, "Model")
      .def(py::init(&make_model), py::arg("config"), py::arg("rope_cos"), py::arg("rope_sin"),
           py::arg("max_cache_len"), py::arg("n_slots"), py::arg("max_step_tokens"),
           py::arg("max_out_rows"), py::arg("threads"), py::arg("isa") = "")
      .def("set_matrix", &set_matrix, py::arg("name"), py::arg("w"), py::arg("wtype"),
           py::arg("bias") = py::none())
      .def("set_matrix_ggml", &set_matrix_ggml, py::arg("name"), py::arg("raw"),
           py::arg("src_type"), py::arg("n"), py::arg("k"), py::arg("wtype"),
           py::arg("bias") = py::none(), py::arg("row_order") = py::none())
      .def("set_matrix_packed", &set_matrix_packed, py::arg("name"), py::arg("wtype"), py::arg("n"),
           py::arg("k"), py::arg("bias") = py::none())
      .def("packed", &packed, py::arg("name"))
      .def("matrix_format", &matrix_format, py::arg("name"))
      .def("set_norm", &set_norm, py::arg("name"), py::arg("w"))
      .def("check_complete", &Model::check_complete)
      .def("step", &step, py::arg("tokens"), py::arg("slots"), py::arg("positions"),
           py::arg("out_rows"), py::arg("also") = py::none())
      .def("copy_cache", &copy_cache, py::arg("src"), py::arg("dst"), py::arg("start"),
           py::arg("n"))
      .def("propose", &propose, py::arg("tokens"), py::arg("slot"), py::arg("start"), py::arg("k"),
           py::arg("subset") = false, py::arg("min_prob") = 0.f, py::arg("alternatives") = false)
      .def("set_head_subset", &set_head_subset, py::arg("ids"))
      .def_property_readonly("head_subset_size", &Model::head_subset_size)
      .def(
          "logits",
          [](py::object self, int rows) {
            Model& m = self.cast<Model&>();
            if (rows < 0 || rows > m.max_out_rows())
              throw std::invalid_argument("rows out of range");
            // A view of the model's buffer [rows, vocab]; valid until the next step.
            return py::array_t<float>({rows, m.config().vocab},
                                      {sizeof(float) * m.vocab_stride(), sizeof(float)}, m.logits(),
                                      self);
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
