#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "../formats/ggml.h"

namespace kwker {

namespace {

// Limits on a model's shape and its buffers, checked before anything is sized by them: far above
// any model this runs (Llama-3.1-405B: 126 layers, width 16384, vocabulary 128256), low enough that
// no buffer size overflows.
constexpr int kMaxLayers = 1024, kMaxWidth = 1 << 17, kMaxHeads = 1024, kMaxVocab = 1 << 24;
constexpr int kMaxCacheLen = 1 << 24, kMaxSlots = 1024, kMaxStepTokens = 1 << 16;
constexpr size_t kMaxKvCacheBytes = size_t(1) << 40;

// cfg, after checking it and the sizes the model is built for (std::invalid_argument naming what is
// wrong).
const Config& checked(const Config& cfg, int max_cache_len, int n_slots, int max_step_tokens,
                      int max_out_rows) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("invalid model configuration: " + what);
  };
  need(cfg.n_layer >= 1 && cfg.n_layer <= kMaxLayers,
       "n_layer must be 1.." + std::to_string(kMaxLayers));
  need(cfg.n_embd >= 1 && cfg.n_embd <= kMaxWidth && cfg.n_ff >= 1 && cfg.n_ff <= kMaxWidth,
       "n_embd and n_ff must be 1.." + std::to_string(kMaxWidth));
  need(cfg.n_head >= 1 && cfg.n_head <= kMaxHeads && cfg.n_kv_head >= 1 &&
           cfg.n_head % cfg.n_kv_head == 0,
       "n_head must be 1.." + std::to_string(kMaxHeads) + " and a multiple of n_kv_head");
  need(cfg.head_dim >= 2 && cfg.head_dim % 2 == 0 && cfg.head_dim <= kMaxHeadDim,
       "head_dim must be even, 2.." + std::to_string(kMaxHeadDim));
  need(size_t(cfg.n_head) * cfg.head_dim <= size_t(kMaxWidth), "n_head * head_dim is too large");
  need(cfg.vocab >= 1 && cfg.vocab <= kMaxVocab, "vocab must be 1.." + std::to_string(kMaxVocab));
  need(max_cache_len >= 1 && max_cache_len <= kMaxCacheLen,
       "max_cache_len must be 1.." + std::to_string(kMaxCacheLen));
  need(n_slots >= 1 && n_slots <= kMaxSlots, "n_slots must be 1.." + std::to_string(kMaxSlots));
  need(max_step_tokens >= 1 && max_step_tokens <= kMaxStepTokens && max_out_rows >= 1,
       "max_step_tokens must be 1.." + std::to_string(kMaxStepTokens) +
           " and max_out_rows positive");
  const size_t kv = size_t(n_slots) * cfg.n_layer * cfg.n_kv_head * pad_to(max_cache_len, kPanel) *
                    pad_to(cfg.head_dim) * 4;
  need(kv <= kMaxKvCacheBytes, "the KV cache would take " + std::to_string(kv >> 30) + " GB");
  return cfg;
}

}  // namespace

Model::Model(const Config& cfg, int n_rope, const float* rope_cos, const float* rope_sin,
             int max_cache_len, int n_slots, int max_step_tokens, int max_out_rows, int n_threads,
             const std::string& isa)
    : cfg_(checked(cfg, max_cache_len, n_slots, max_step_tokens, max_out_rows)),
      kern_(&kernels_select(isa)),
      max_cache_(max_cache_len),
      n_slots_(n_slots),
      max_step_(max_step_tokens),
      max_rows_(std::min(max_out_rows, max_step_tokens)),
      hdp_(pad_to(cfg.head_dim)),
      ep_(pad_to(cfg.n_embd)),
      qp_(pad_to(cfg.n_head * cfg.head_dim)),
      kvp_(pad_to(cfg.n_kv_head * cfg.head_dim)),
      fp_(pad_to(cfg.n_ff)),
      pool_(n_threads),
      layers_(cfg.n_layer) {
  if (cfg_.rope_dim == 0) cfg_.rope_dim = cfg.head_dim;
  if (cfg_.rope_dim < 2 || cfg_.rope_dim % 2 || cfg_.rope_dim > cfg.head_dim)
    throw std::invalid_argument("rope_dim must be even and at most head_dim");
  if (cfg_.layer_window.empty()) cfg_.layer_window.assign(cfg.n_layer, 0);
  if (cfg_.layer_rope.empty()) cfg_.layer_rope.assign(cfg.n_layer, 0);
  if (int(cfg_.layer_window.size()) != cfg.n_layer || int(cfg_.layer_rope.size()) != cfg.n_layer)
    throw std::invalid_argument("layer_window and layer_rope need one entry per layer");
  for (int l = 0; l < cfg.n_layer; l++)
    if (cfg_.layer_window[l] < 0 || cfg_.layer_rope[l] < 0 || cfg_.layer_rope[l] >= n_rope)
      throw std::invalid_argument("layer " + std::to_string(l) +
                                  " has a negative window or no such rope table");
  if (int(cfg_.act) < 0 || int(cfg_.act) >= kActivations)
    throw std::invalid_argument("unknown activation");
  rope_half_ = cfg_.rope_dim / 2;
  const size_t rope_floats = size_t(n_rope) * max_cache_len * rope_half_;
  rope_cos_ = Buffer(sizeof(float) * rope_floats);
  rope_sin_ = Buffer(sizeof(float) * rope_floats);
  std::memcpy(rope_cos_.as<float>(), rope_cos, sizeof(float) * rope_floats);
  std::memcpy(rope_sin_.as<float>(), rope_sin, sizeof(float) * rope_floats);

  const size_t cache_floats =
      size_t(n_slots) * cfg.n_layer * cfg.n_kv_head * pad_to(max_cache_len, kPanel) * hdp_;
  if (int(cfg_.kv_type) < 0 || int(cfg_.kv_type) >= kKVTypes)
    throw std::invalid_argument("unknown KV cache type");
  cache_k_ = Buffer(kv_bytes() * cache_floats);
  cache_v_ = Buffer(kv_bytes() * cache_floats);

  const size_t S = max_step_tokens;
  x_ = Buffer(sizeof(float) * S * ep_);
  xn_ = Buffer(sizeof(float) * S * ep_);
  q_ = Buffer(sizeof(float) * S * qp_);
  k_ = Buffer(sizeof(float) * S * kvp_);
  v_ = Buffer(sizeof(float) * S * kvp_);
  qh_ = Buffer(sizeof(float) * S * cfg.n_head * hdp_);
  att_ = Buffer(sizeof(float) * S * qp_);
  gate_ = Buffer(sizeof(float) * S * fp_);
  up_ = Buffer(sizeof(float) * S * fp_);
  const size_t maxp = std::max({ep_, qp_, fp_});
  qx_ = Buffer(S * maxp);
  qd_ = Buffer(sizeof(float) * S * maxp / kQBlock);
  qdsum_ = Buffer(sizeof(float) * S * maxp / kQBlock);
  kx_ = Buffer(S * maxp);
  kd_ = Buffer(sizeof(float) * S * (maxp / kSuperBlock + 1));
  ksums_ = Buffer(sizeof(int16_t) * S * maxp / kQBlock);
  ksums16_ = Buffer(sizeof(int16_t) * S * maxp / 16);
  logits_ = Buffer(sizeof(float) * max_rows_ * pad_to(cfg.vocab));
  tie_ids_ = Buffer(sizeof(int32_t) * pool_.size() * size_t(cfg.vocab));
  scores_ = Buffer(sizeof(float) * 2 * pool_.size() * kMaxAttendRows * pad_to(max_cache_len));
  head_out_ = Buffer(sizeof(float) * 2 * pool_.size() * kMaxAttendRows * hdp_);
  n_counters_ = 8 * cfg.n_layer + 8;  // 7 matmuls per layer and the head; beyond: static shares
  next_panel_ = std::make_unique<Counter[]>(size_t(n_counters_) * pool_.size());
  matmuls_entered_ = std::make_unique<Counter[]>(pool_.size());
  attend_runs_.reserve(max_step_tokens + 1);
}

Matrix* Model::find_matrix(const std::string& name, int* want_n, int* want_k) {
  const int qd = cfg_.n_head * cfg_.head_dim, kvd = cfg_.n_kv_head * cfg_.head_dim;
  const auto found = [&](Matrix& m, int n, int k) { return *want_n = n, *want_k = k, &m; };
  if (name == "embed") return found(embed_, cfg_.vocab, cfg_.n_embd);
  if (name == "lm_head") return found(lm_head_, cfg_.vocab, cfg_.n_embd);
  if (name.rfind("layers.", 0) != 0) return nullptr;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return nullptr;
  const int li = std::stoi(name.substr(7, dot - 7));
  if (li < 0 || li >= cfg_.n_layer) throw std::invalid_argument("bad weight " + name);
  Layer& L = layers_[li];
  const std::string part = name.substr(dot + 1);
  if (part == "q") return found(L.wq, qd, cfg_.n_embd);
  if (part == "k") return found(L.wk, kvd, cfg_.n_embd);
  if (part == "v") return found(L.wv, kvd, cfg_.n_embd);
  if (part == "o") return found(L.wo, cfg_.n_embd, qd);
  if (part == "gate") return found(L.wgate, cfg_.n_ff, cfg_.n_embd);
  if (part == "up") return found(L.wup, cfg_.n_ff, cfg_.n_embd);
  if (part == "down") return found(L.wdown, cfg_.n_embd, cfg_.n_ff);
  return nullptr;
}

Matrix& Model::matrix_slot(const std::string& name, int n, int k) {
  int want_n = 0, want_k = 0;
  Matrix* m = find_matrix(name, &want_n, &want_k);
  if (!m) throw std::invalid_argument("unknown weight " + name);
  if (n != want_n || k != want_k)
    throw std::invalid_argument("weight " + name + " has shape [" + std::to_string(n) + ", " +
                                std::to_string(k) + "], expected [" + std::to_string(want_n) +
                                ", " + std::to_string(want_k) + "]");
  return *m;
}

void Model::place(Matrix& m, WType type, int n, int k, const float* bias) {
  m.n = n, m.k = k, m.kp = pad_to(k), m.type = type;
  m.w = weight_space(m.bytes());  // zeroed
  m.bias = Buffer();
  if (bias) {
    m.bias = Buffer(sizeof(float) * pad_to(n, kPanel));
    std::memcpy(m.bias.as<float>(), bias, sizeof(float) * n);
  }
}

void Model::set_matrix(const std::string& name, const void* data, WType type, int n, int k,
                       const float* bias) {
  std::lock_guard<std::mutex> lock(mu_);
  complete_ = false;
  Matrix& m = matrix_slot(name, n, k);
  place(m, type, n, k, bias);
  const size_t row_bytes = (wtype_quantized(type) ? sizeof(float) : wtype_size(type)) * k;
  // quantizing is the slow part of loading: every thread takes a share of the panels
  pool_.run([&](int tid) {
    auto [p0, p1] = pool_.split(pad_to(n, kPanel) / kPanel, tid);
    if (p0 < p1)
      pack_panel_range(static_cast<const char*>(data) + row_bytes * p0 * kPanel, type, n, k, m.w,
                       p0, p1);
  });
}

void Model::set_matrix_ggml(const std::string& name, const uint8_t* data, int src_type, int n,
                            int k, WType type, const float* bias, const int32_t* row_order) {
  const GgmlTypeInfo* src = ggml_type_info(src_type);
  if (!src) throw std::invalid_argument("weight " + name + ": unknown ggml type");
  if (k % src->block)
    throw std::invalid_argument("weight " + name + ": rows of " + std::to_string(k) +
                                " values are not whole " + src->name + " blocks");
  std::lock_guard<std::mutex> lock(mu_);
  complete_ = false;
  Matrix& m = matrix_slot(name, n, k);
  // A K format takes its own ggml type's blocks as they are; Q4K also quantizes other types
  // (through floats, below). Either way its rows are whole super-blocks.
  const bool held = (type == WType::Q4K && src->type == GgmlType::Q4_K) ||
                    (type == WType::Q6K && src->type == GgmlType::Q6_K);
  if (wtype_super(type) && ((!held && type == WType::Q6K) || k % kSuperBlock))
    throw std::invalid_argument("weight " + name + ": " + format(type).name + " holds rows of " +
                                "whole 256-value super-blocks" +
                                (type == WType::Q6K ? " of Q6_K" : "") + ", not " +
                                std::to_string(k) + " " + src->name + " values");
  const size_t src_row = ggml_row_bytes(*src, k);
  if (type == WType::Q4K && !held) {  // Q4 where the first panel's rows show it holds them better
    const int nr = std::min(n, kPanel);
    std::vector<float> rows(size_t(nr) * k);
    for (int i = 0; i < nr; i++)
      ggml_dequantize_row(*src, data + size_t(row_order ? row_order[i] : i) * src_row, k,
                          rows.data() + size_t(i) * k);
    type = q4_or_q4k(rows.data(), nr, k);
  }
  place(m, type, n, k, bias);
  if (held) {  // the file's blocks, rearranged into panels
    pool_.run([&](int tid) {
      auto [p0, p1] = pool_.split(pad_to(n, kPanel) / kPanel, tid);
      const int r0 = p0 * kPanel, r1 = std::min(n, p1 * kPanel);
      if (!row_order && r0 < r1)  // the share's rows are consecutive in the file
        k_from_ggml(type, data + size_t(r0) * src_row, r1 - r0, r0, k, m.w);
      for (int r = r0; row_order && r < r1; r++)
        k_from_ggml(type, data + size_t(row_order[r]) * src_row, 1, r, k, m.w);
    });
    return;
  }
  pool_.run([&](int tid) {
    auto [p0, p1] = pool_.split(pad_to(n, kPanel) / kPanel, tid);
    // [kPanel, k]: one panel's rows in float32, then in the packed element type
    std::vector<float> rows(size_t(kPanel) * k);
    const bool bf16 = type == WType::BF16 || type == WType::BF16P;
    std::vector<uint16_t> halves(bf16 || type == WType::F16 ? rows.size() : 0);
    for (int p = p0; p < p1; p++) {
      const int r0 = p * kPanel, nr = std::min(kPanel, n - r0);
      for (int i = 0; i < nr; i++) {
        const size_t r = row_order ? size_t(row_order[r0 + i]) : size_t(r0 + i);
        ggml_dequantize_row(*src, data + r * src_row, k, rows.data() + size_t(i) * k);
      }
      const void* panel = rows.data();
      if (!halves.empty()) {
        for (size_t i = 0; i < size_t(nr) * k; i++)
          halves[i] = bf16 ? f32_to_bf16(rows[i]) : f32_to_f16(rows[i]);
        panel = halves.data();
      }
      pack_panel_range(panel, type, n, k, m.w, p, p + 1);
    }
  });
}

void* Model::set_matrix_packed(const std::string& name, WType type, int n, int k,
                               const float* bias) {
  std::lock_guard<std::mutex> lock(mu_);
  complete_ = false;
  Matrix& m = matrix_slot(name, n, k);
  place(m, type, n, k, bias);
  return m.w;
}

const Matrix* Model::matrix(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0, k = 0;
  const Matrix* m = find_matrix(name, &n, &k);
  if (!m) throw std::invalid_argument("unknown weight " + name);
  return m->n > 0 ? m : nullptr;
}

void* Model::weight_space(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  if (weight_chunks_.empty() || chunk_used_ + bytes > weight_chunks_.back().size()) {
    weight_chunks_.emplace_back(std::max(bytes, size_t(64) << 20), true);
    chunk_used_ = 0;
  }
  void* p = weight_chunks_.back().as<char>() + chunk_used_;
  chunk_used_ += bytes;
  return p;
}

void Model::set_norm(const std::string& name, const float* data, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  complete_ = false;
  const bool per_head = name.size() > 7 && (name.compare(name.size() - 7, 7, ".q_norm") == 0 ||
                                            name.compare(name.size() - 7, 7, ".k_norm") == 0);
  if (n != (per_head ? cfg_.head_dim : cfg_.n_embd))
    throw std::invalid_argument("norm " + name + " has the wrong size");
  Buffer* b = nullptr;
  if (name == "norm") {
    b = &final_norm_;
  } else if (name.rfind("layers.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    const int li = std::stoi(name.substr(7, dot - 7));
    if (li < 0 || li >= cfg_.n_layer || dot == std::string::npos)
      throw std::invalid_argument("bad norm " + name);
    const std::string part = name.substr(dot + 1);
    if (part == "attn_norm")
      b = &layers_[li].attn_norm;
    else if (part == "mlp_norm")
      b = &layers_[li].mlp_norm;
    else if (part == "q_norm")
      b = &layers_[li].q_norm;
    else if (part == "k_norm")
      b = &layers_[li].k_norm;
    else if (part == "post_attn_norm")
      b = &layers_[li].post_attn_norm;
    else if (part == "post_mlp_norm")
      b = &layers_[li].post_mlp_norm;
  }
  if (!b) throw std::invalid_argument("unknown norm " + name);
  *b = Buffer(sizeof(float) * n);
  std::memcpy(b->as<float>(), data, sizeof(float) * n);
}

void Model::check_complete() {
  std::lock_guard<std::mutex> lock(mu_);
  check_complete_locked();
}

void Model::check_complete_locked() {
  if (complete_) return;
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("weight not loaded: " + what);
  };
  need(embed_.n > 0, "embed");
  need(cfg_.tied_embeddings || lm_head_.n > 0, "lm_head");
  need(final_norm_.size() > 0, "norm");
  for (int i = 0; i < cfg_.n_layer; i++) {
    const Layer& L = layers_[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    need(L.attn_norm.size() > 0, p + "attn_norm");
    need(L.mlp_norm.size() > 0, p + "mlp_norm");
    if (cfg_.qk_norm) {
      need(L.q_norm.size() > 0, p + "q_norm");
      need(L.k_norm.size() > 0, p + "k_norm");
    }
    if (cfg_.post_norms) {
      need(L.post_attn_norm.size() > 0, p + "post_attn_norm");
      need(L.post_mlp_norm.size() > 0, p + "post_mlp_norm");
    }
    for (auto [m, nm] : {std::pair{&L.wq, "q"},
                         {&L.wk, "k"},
                         {&L.wv, "v"},
                         {&L.wo, "o"},
                         {&L.wgate, "gate"},
                         {&L.wup, "up"},
                         {&L.wdown, "down"}})
      need(m->n > 0, p + nm);
  }
  complete_ = true;
}

size_t Model::weight_bytes_per_token() const {
  size_t b = (cfg_.tied_embeddings ? embed_ : lm_head_).bytes();
  for (const Layer& L : layers_)
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.wgate.bytes() +
         L.wup.bytes() + L.wdown.bytes();
  return b;
}

char* Model::cache_head(Buffer& cache, int slot, int layer, int kv_head) const {
  const size_t head = (size_t(slot) * cfg_.n_layer + layer) * cfg_.n_kv_head + kv_head;
  return cache.as<char>() + head * pad_to(max_cache_, kPanel) * hdp_ * kv_bytes();
}

void Model::store_kv(const float* x, char* dst, int stride) const {
  const int hd = cfg_.head_dim;
  if (cfg_.kv_type == KVType::F32) {
    for (int i = 0; i < hd; i++) reinterpret_cast<float*>(dst)[size_t(i) * stride] = x[i];
    return;
  }
  uint16_t h[kMaxHeadDim];
  kern_->to_f16(x, h, hd);
  for (int i = 0; i < hd; i++) reinterpret_cast<uint16_t*>(dst)[size_t(i) * stride] = h[i];
}

namespace {

// 1 / sqrt(mean(x^2) + eps) over n values, as transformers' RMSNorm computes it in float32 (here
// summed in double: four chains, a fixed order).
float rms_inverse(const float* x, int n, float eps) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; j++) s[j] += double(x[i + j]) * x[i + j];
  for (; i < n; i++) s[0] += double(x[i]) * x[i];
  return 1.0f / std::sqrt(float(((s[0] + s[1]) + (s[2] + s[3])) / n) + eps);
}

// out = x * rms_inverse(x) * w over n values (out may be x): the rows of the residual stream and,
// with q/k norms, each attention head.
void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  const float inv = rms_inverse(x, n, eps);
  for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

// Per-token work on rows of `cols` padded values (norms, activation quantization, GLU), shared out
// in pieces f(t, c0, c1): with at least as many tokens as threads, each thread takes its share of
// the tokens whole; with fewer, each token's columns are cut in parts at multiples of kQBlock, one
// per thread, so that no thread waits while another does a lone token's work (the 1-token step). A
// piece computes the same values whoever runs it.
template <class F>
void for_pieces(const ThreadPool& pool, int T, int cols, int tid, const F& f) {
  const int n = pool.size();
  if (T >= n || T == 0) {
    const auto [t0, t1] = pool.split(T, tid);
    for (int t = t0; t < t1; t++) f(t, 0, cols);
    return;
  }
  const int parts = n / T;
  for (int item = tid; item < T * parts; item += n) {
    const int t = item / parts, part = item % parts;
    // whole super-blocks (Int8Super activations are quantized per super-block), the last part
    // to the end
    const int b = (cols + kSuperBlock - 1) / kSuperBlock;
    const int c0 = std::min(cols, b * part / parts * kSuperBlock),
              c1 = part == parts - 1 ? cols : std::min(cols, b * (part + 1) / parts * kSuperBlock);
    if (c0 < c1) f(t, c0, c1);
  }
}

}  // namespace

void Model::norm_part(const float* x, const Buffer& w, float* out, int c0, int c1, bool add) const {
  const float inv = rms_inverse(x, cfg_.n_embd, cfg_.norm_eps);
  const float* wv = w.as<float>();
  for (int i = c0; i < std::min(c1, cfg_.n_embd); i++) {
    const float v = wv[i] * (x[i] * inv);
    out[i] = add ? out[i] + v : v;
  }
}

void Model::add_residual(const Matrix& m, const float* in, int ldin, const Buffer& post_norm, int T,
                         int tid) {
  float* x = x_.as<float>();
  if (!cfg_.post_norms) {  // accumulated straight into the residual stream by the matmul's epilogue
    matmul_part(m, in, T, ldin, x, ep_, true, tid);
    pool_.barrier();
    return;
  }
  float* y = xn_.as<float>();  // free here: the layer's normalized input has been consumed
  matmul_part(m, in, T, ldin, y, ep_, false, tid);
  pool_.barrier();
  for_pieces(pool_, T, ep_, tid, [&](int t, int c0, int c1) {
    norm_part(y + size_t(t) * ep_, post_norm, x + size_t(t) * ep_, c0, c1, /*add=*/true);
  });
  if (T < pool_.size()) pool_.barrier();  // rows were cut in parts: the next norm reads whole rows
}

// Rotates q and k (transformers' rotate_half convention over the first rope_dim dims of a head, the
// rest pass through), lays q out per head with padding, and writes k and v into the sequence's
// cache row at its position. Threads take contiguous shares of the step's (token, head) pairs, a
// token's heads in the order KV head 0, its query heads, KV head 1, ...: a KV head (its key rotated
// and written with its value into the cache) costs more than a query head, and so the shares of a
// lone token are even (SmolLM2: 2 KV + 4 query heads and 1 + 5, not 6 query heads and 3 + 3).
void Model::rope_and_cache(int layer, const int32_t* slots, const int32_t* also,
                           const int32_t* positions, int T, int tid) {
  const int hd = cfg_.head_dim, half = rope_half_, heads = cfg_.n_head + cfg_.n_kv_head;
  const int group = cfg_.n_head / cfg_.n_kv_head;
  const float* table_cos =
      rope_cos_.as<float>() + size_t(cfg_.layer_rope[layer]) * max_cache_ * half;
  const float* table_sin =
      rope_sin_.as<float>() + size_t(cfg_.layer_rope[layer]) * max_cache_ * half;
  const auto [i0, i1] = pool_.split(T * heads, tid);
  for (int i = i0; i < i1; i++) {
    const int t = i / heads, r = i % heads % (group + 1), kvh = i % heads / (group + 1),
              pos = positions[t];
    const float* c = table_cos + size_t(pos) * half;
    const float* s = table_sin + size_t(pos) * half;
    // out[i * stride] for i < head_dim: the rotated vector (stride kPanel writes a key into its
    // panel column), after the head's own RMSNorm when the model has one (norm: [head_dim] or null)
    float normed[kMaxHeadDim];
    auto rotate = [&](const float* in, float* out, int stride, const Buffer& norm) {
      if (norm.size()) {
        rmsnorm(in, norm.as<float>(), normed, hd, cfg_.norm_eps);
        in = normed;
      }
      for (int j = 0; j < half; j++) {
        const float a = in[j], b = in[j + half];
        out[size_t(j) * stride] = a * c[j] - b * s[j];
        out[size_t(j + half) * stride] = b * c[j] + a * s[j];
      }
      for (int j = 2 * half; j < hd; j++) out[size_t(j) * stride] = in[j];
    };
    if (r > 0) {  // query head h
      const int h = kvh * group + r - 1;
      rotate(q_.as<float>() + size_t(t) * qp_ + h * hd,
             qh_.as<float>() + (size_t(t) * cfg_.n_head + h) * hdp_, 1, layers_[layer].q_norm);
      continue;
    }
    float key[kMaxHeadDim];  // key i's dim d sits at panel_index(i, d): stride kPanel
    rotate(k_.as<float>() + size_t(t) * kvp_ + kvh * hd, key, 1, layers_[layer].k_norm);
    for (int slot : {slots[t], also ? also[t] : -1}) {
      if (slot < 0) continue;
      store_kv(key, cache_head(cache_k_, slot, layer, kvh) + panel_index(pos, 0, hdp_) * kv_bytes(),
               kPanel);
      store_kv(v_.as<float>() + size_t(t) * kvp_ + kvh * hd,
               cache_head(cache_v_, slot, layer, kvh) + size_t(pos) * hdp_ * kv_bytes(), 1);
    }
  }
}

void Model::quantize_part(std::initializer_list<const Matrix*> ms, const float* x, int ldx, int t,
                          int c0, int c1) {
  bool blocks = false, supers = false;
  int kp = 0;
  for (const Matrix* m : ms) {
    blocks |= wtype_quantized(m->type) && !wtype_super(m->type);
    supers |= wtype_super(m->type);
    kp = m->kp;  // the matrices of a group read the same rows
  }
  const size_t nb = kp / kQBlock;
  if (blocks)
    kern_->quantize(x + size_t(t) * ldx + c0, 1, ldx, c1 - c0,
                    qx_.as<int8_t>() + size_t(t) * kp + c0, qd_.as<float>() + t * nb + c0 / kQBlock,
                    qdsum_.as<float>() + t * nb + c0 / kQBlock);
  if (supers)
    quantize_rows_super(x + size_t(t) * ldx + c0, 1, ldx, c1 - c0,
                        kx_.as<int8_t>() + size_t(t) * kp + c0,
                        kd_.as<float>() + t * (kp / kSuperBlock) + c0 / kSuperBlock,
                        ksums_.as<int16_t>() + t * nb + c0 / kQBlock,
                        ksums16_.as<int16_t>() + t * (kp / 16) + c0 / 16);
}

void Model::matmul_part(const Matrix& m, const float* x, int rows, int ldx, float* y, int ldy,
                        bool accumulate, int tid) {
  auto run = [&](int p0, int p1) {
    if (wtype_super(m.type)) {
      const QRows q{kx_.as<int8_t>(), kd_.as<float>(), nullptr, ksums_.as<int16_t>(),
                    ksums16_.as<int16_t>()};
      kern_->qmatmul[int(m.type)](q, rows, m.w, m.kp, p0, p1, y, ldy, m.bias_ptr(), accumulate);
    } else if (wtype_quantized(m.type)) {
      const QRows q{qx_.as<int8_t>(), qd_.as<float>(), qdsum_.as<float>()};
      kern_->qmatmul[int(m.type)](q, rows, m.w, m.kp, p0, p1, y, ldy, m.bias_ptr(), accumulate);
    } else {
      kern_->matmul[int(m.type)](x, rows, ldx, m.w, m.kp, p0, p1, y, ldy, m.bias_ptr(), accumulate);
    }
  };
  const int panels = pad_to(m.n, kPanel) / kPanel;
  const int call = matmuls_entered_[tid].value.fetch_add(1, std::memory_order_relaxed);
  // One row (a generated token): static shares, each one call, so that the kernel streams the share
  // in NPV long panel streams (streaming_tiles; perf-notes #8).
  if (call >= n_counters_ ||
      rows == 1) {  // (more calls than counters: not expected, 7 matmuls per layer)
    auto [p0, p1] = pool_.split(panels, tid);
    if (p0 < p1) run(p0, p1);
    return;
  }
  // Each thread takes chunks of its own share first (from its own counter: no contention), then
  // helps the others finish theirs (the same counters: a chunk is claimed once; perf-notes #9).
  // Counters count the panels claimed of a share. Which thread computes a panel does not change its
  // bits.
  const int n = pool_.size(), chunk = 4;  // 4 panels: a GEMV tile
  Counter* claimed = &next_panel_[size_t(call) * n];
  for (int i = 0; i < n; i++) {
    const int u = (tid + i) % n;
    const auto [begin, end] = pool_.split(panels, u);
    for (int p0; (p0 = begin + claimed[u].value.fetch_add(chunk, std::memory_order_relaxed)) < end;)
      run(p0, std::min(end, p0 + chunk));
  }
}

// Attention calls: (run, KV head, block of the query heads sharing it). With at least two calls per
// thread each thread makes whole calls, dealt round robin (a prefill's later tokens attend to more
// keys), a KV head's blocks together (perf-notes #25). With fewer (one token, few KV heads: 3 calls
// for 2 threads in SmolLM2) and long enough contexts, the calls are made in parts (AttendPartFn):
// the threads share out key panels, then rows, then output columns, with a barrier between, so each
// reads an even share of the cache; the parts give the whole call's bits. Parts pay from 128 keys
// on (perf-notes #10).
constexpr int kSplitAttentionKeys = 128;

void Model::attention(int l, const int32_t* slots, const int32_t* positions, int blocks, int tid) {
  const Config& c = cfg_;
  const int group = c.n_head / c.n_kv_head, window = c.layer_window[l];
  const int calls = (int(attend_runs_.size()) - 1) * c.n_kv_head * blocks;
  struct Call {
    const float* q;
    int nt, g, t0, h0;
    const void *k, *v;
    int first[kMaxAttendRows], n[kMaxAttendRows];
    int p0, p1;  // the key panels the call reads
  };
  auto describe = [&](int call) {
    Call a;
    const int run = call / (c.n_kv_head * blocks), kvh = call / blocks % c.n_kv_head,
              b = call % blocks;
    a.t0 = attend_runs_[run], a.nt = attend_runs_[run + 1] - a.t0;
    a.h0 = kvh * group + b * group / blocks, a.g = kvh * group + (b + 1) * group / blocks - a.h0;
    a.q = qh_.as<float>() + (size_t(a.t0) * c.n_head + a.h0) * hdp_;
    a.k = cache_head(cache_k_, slots[a.t0], l, kvh),
    a.v = cache_head(cache_v_, slots[a.t0], l, kvh);
    a.p0 = 1 << 30, a.p1 = 0;
    for (int i = 0; i < a.nt; i++) {
      a.n[i] = positions[a.t0 + i] + 1;
      a.first[i] = window ? std::max(0, a.n[i] - window) : 0;
      a.p0 = std::min(a.p0, a.first[i] / kPanel),
      a.p1 = std::max(a.p1, (a.n[i] + kPanel - 1) / kPanel);
    }
    return a;
  };
  // columns [c0, c1) of the call's output rows (hout) into att_
  auto gather = [&](const Call& a, const float* hout, int c0, int c1) {
    if (c0 >= std::min(c1, c.head_dim)) return;
    for (int j = 0; j < a.g * a.nt; j++)
      std::memcpy(
          att_.as<float>() + size_t(a.t0 + j / a.g) * qp_ + (a.h0 + j % a.g) * c.head_dim + c0,
          hout + size_t(j) * hdp_ + c0, sizeof(float) * (std::min(c1, c.head_dim) - c0));
  };
  const size_t scores_stride = size_t(kMaxAttendRows) * pad_to(max_cache_);
  const AttendPartFn part = kern_->attend_part[int(c.kv_type)];
  auto longest = [&] {  // keys of the longest call (the last token of a run has the most)
    int keys = 0;
    for (size_t r = 1; r < attend_runs_.size(); r++)
      keys = std::max(keys, positions[attend_runs_[r] - 1] + 1);
    return keys;
  };
  if (calls >= 2 * pool_.size() || longest() < kSplitAttentionKeys) {
    float* scores = scores_.as<float>() + tid * scores_stride;
    float* hout = head_out_.as<float>() + size_t(tid) * kMaxAttendRows * hdp_;
    // A KV head's blocks go to one thread when there are enough (run, KV head) pairs to go round:
    // its keys and values are then read from memory once, not by every thread.
    const int per = calls / blocks >= pool_.size() ? blocks : 1;  // calls dealt together
    for (int first = tid * per; first < calls; first += pool_.size() * per)
      for (int call = first; call < first + per; call++) {
        const Call a = describe(call);
        attend_whole(part, a.q, a.g, a.nt, size_t(c.n_head) * hdp_, a.k, a.v, a.first, a.n, hdp_,
                     c.attn_scale, scores, hout);
        gather(a, hout, 0, c.head_dim);
      }
    return;
  }
  // In parts: call i uses the i-th of the scores and output buffers (there are two per thread).
  auto run_phase = [&](AttendPhase phase, auto&& units_of, int per_unit) {
    int total = 0;
    for (int i = 0; i < calls; i++) total += (units_of(describe(i)) + per_unit - 1) / per_unit;
    const auto [u0, u1] = pool_.split(total, tid);
    for (int i = 0, base = 0; i < calls && base < u1; i++) {
      const Call a = describe(i);
      const int units = units_of(a), count = (units + per_unit - 1) / per_unit;
      for (int u = std::max(u0, base); u < std::min(u1, base + count); u++) {
        const int lo = (u - base) * per_unit, hi = std::min(units, lo + per_unit);
        float* scores = scores_.as<float>() + i * scores_stride;
        float* hout = head_out_.as<float>() + size_t(i) * kMaxAttendRows * hdp_;
        const int shift = phase == AttendPhase::Scores ? a.p0 : 0;
        part(phase, lo + shift, hi + shift, a.q, a.g, a.nt, size_t(c.n_head) * hdp_, a.k, a.v,
             a.first, a.n, hdp_, c.attn_scale, scores, hout);
        if (phase == AttendPhase::Values) gather(a, hout, lo, hi);
      }
      base += count;
    }
  };
  run_phase(AttendPhase::Scores, [](const Call& a) { return a.p1 - a.p0; }, 4);  // 64 keys a share
  pool_.barrier();
  run_phase(AttendPhase::Softmax, [](const Call& a) { return a.g * a.nt; }, 1);
  pool_.barrier();
  run_phase(AttendPhase::Values, [&](const Call&) { return hdp_; }, kAttendColumns);
}

void Model::step(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int T,
                 const int32_t* out_rows, int R, int32_t* argmax, const int32_t* also) {
  std::lock_guard<std::mutex> lock(mu_);
  check_complete_locked();
  step_locked(tokens, slots, positions, T, out_rows, R, argmax,
              cfg_.tied_embeddings ? embed_ : lm_head_, nullptr, nullptr, nullptr, also);
}

void Model::copy_cache(int src, int dst, int start, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t e = kv_bytes();
  for (int l = 0; l < cfg_.n_layer; l++)
    for (int h = 0; h < cfg_.n_kv_head; h++) {
      // V: [pos][hdp] rows, one run
      std::memcpy(cache_head(cache_v_, dst, l, h) + size_t(start) * hdp_ * e,
                  cache_head(cache_v_, src, l, h) + size_t(start) * hdp_ * e, size_t(n) * hdp_ * e);
      // K: panels of kPanel positions, [hdp][kPanel] each: per panel and dim, a run of positions
      const char* from = cache_head(cache_k_, src, l, h);
      char* to = cache_head(cache_k_, dst, l, h);
      for (int p = start; p < start + n;) {
        const int run = std::min(start + n, (p / kPanel + 1) * kPanel) - p;
        for (int d = 0; d < hdp_; d++) {
          const size_t at = panel_index(p, d, hdp_) * e;
          std::memcpy(to + at, from + at, size_t(run) * e);
        }
        p += run;
      }
    }
}

int Model::propose(const int32_t* tokens, int T, int slot, int start, int k, bool subset,
                   float min_prob, int32_t* out, float* probs, int32_t* second) {
  std::lock_guard<std::mutex> lock(mu_);
  check_complete_locked();
  if (subset && subset_head_.n == 0) throw std::runtime_error("no head subset was set");
  const Matrix& head = subset ? subset_head_ : (cfg_.tied_embeddings ? embed_ : lm_head_);
  const int32_t* ids = subset ? subset_ids_.data() : nullptr;
  std::vector<int32_t> slots(T, slot), positions(T);  // [T]
  for (int t = 0; t < T; t++) positions[t] = start + t;
  const int32_t last = T - 1;
  float p = 1.f, kept = 1.f;  // the latest token's probability; the product of all of them
  float* prob = min_prob > 0.f || probs ? &p : nullptr;
  step_locked(tokens, slots.data(), positions.data(), T, &last, 1, out, head, ids, prob, second);
  int n = 1;
  for (; n < k; n++) {
    if (probs) probs[n - 1] = p;
    kept *= p;
    if (kept < min_prob) break;
    const int32_t zero = 0, pos = start + T + n - 1;
    step_locked(out + n - 1, &slot, &pos, 1, &zero, 1, out + n, head, ids, prob,
                second ? second + n : nullptr);
  }
  if (probs) probs[n - 1] = p;
  return n;
}

void Model::set_head_subset(const int32_t* ids, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  check_complete_locked();
  const Matrix& head = cfg_.tied_embeddings ? embed_ : lm_head_;
  if (n < 1 || n > cfg_.vocab)
    throw std::invalid_argument("a head subset takes 1.." + std::to_string(cfg_.vocab) + " ids");
  std::vector<char> seen(cfg_.vocab, 0);
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= cfg_.vocab || seen[ids[i]])
      throw std::invalid_argument("head subset ids must be distinct tokens of the vocabulary");
    seen[ids[i]] = 1;
  }
  // The rows live in a buffer of their own, kept while a new subset fits in it: a draft resets its
  // subset for each text (the text's own tokens join the frequent ones), and a row already at its
  // place is not copied again, so a reset costs the rows that changed.
  const bool fits = subset_head_.n > 0 && n <= subset_rows_;
  if (!fits) {
    subset_rows_ = pad_to(n + n / 8, kPanel);  // room for a few more tokens of the next text
    subset_space_ = Buffer(panel_bytes(head.type, subset_rows_, head.k), true);
  }
  const int before = fits ? subset_head_.n : 0;
  subset_head_.n = n, subset_head_.k = head.k, subset_head_.kp = head.kp;
  subset_head_.type = head.type;
  subset_head_.w = subset_space_.as<void>();
  subset_head_.bias = Buffer();
  if (head.bias_ptr()) {
    subset_head_.bias = Buffer(sizeof(float) * pad_to(n, kPanel));
    for (int i = 0; i < n; i++) subset_head_.bias.as<float>()[i] = head.bias_ptr()[ids[i]];
  }
  for (int i = 0; i < n; i++)
    if (i >= before || subset_ids_[i] != ids[i])
      copy_panel_row(head.w, ids[i], subset_head_.w, i, head.type, head.kp);
  subset_ids_.assign(ids, ids + n);
}

void Model::step_locked(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                        int T, const int32_t* out_rows, int R, int32_t* argmax, const Matrix& head,
                        const int32_t* head_ids, float* top_prob, int32_t* second,
                        const int32_t* also) {
  const Config& c = cfg_;
  const int group = c.n_head / c.n_kv_head;
  float* x = x_.as<float>();
  float* xn = xn_.as<float>();
  // Attention takes a KV head's query heads in blocks of at most kMaxAttendHeads (balanced: 6 -> 3
  // + 3) and, per call, a run of consecutive tokens of one sequence (prefill, a verify step), as
  // many as make kMaxAttendRows rows: each key and value is loaded once for all of them.
  const int blocks = (group + kMaxAttendHeads - 1) / kMaxAttendHeads;
  const int run_max = std::max(1, kMaxAttendRows / ((group + blocks - 1) / blocks));
  attend_runs_.assign(1, 0);
  for (int t = 1; t <= T; t++)
    if (t == T || slots[t] != slots[t - 1] || t - attend_runs_.back() == run_max)
      attend_runs_.push_back(t);

  for (int i = 0; i < n_counters_ * pool_.size(); i++)
    next_panel_[i].value.store(0, std::memory_order_relaxed);
  for (int i = 0; i < pool_.size(); i++)
    matmuls_entered_[i].value.store(0, std::memory_order_relaxed);
  pool_.run([&](int tid) {
    for_pieces(pool_, T, ep_, tid, [&](int t, int c0, int c1) {
      float* row = x + size_t(t) * ep_;
      for (int i = c0; i < std::min(c1, c.n_embd); i++)
        row[i] = panel_value(embed_.w, embed_.type, embed_.kp, tokens[t], i) * c.embed_scale;
    });
    pool_.barrier();

    for (int l = 0; l < c.n_layer; l++) {
      Layer& L = layers_[l];
      for_pieces(pool_, T, ep_, tid, [&](int t, int c0, int c1) {
        norm_part(x + size_t(t) * ep_, L.attn_norm, xn + size_t(t) * ep_, c0, c1);
        quantize_part({&L.wq, &L.wk, &L.wv}, xn, ep_, t, c0, c1);  // one quantization each
      });
      pool_.barrier();
      matmul_part(L.wq, xn, T, ep_, q_.as<float>(), qp_, false, tid);
      matmul_part(L.wk, xn, T, ep_, k_.as<float>(), kvp_, false, tid);
      matmul_part(L.wv, xn, T, ep_, v_.as<float>(), kvp_, false, tid);
      pool_.barrier();
      rope_and_cache(l, slots, also, positions, T, tid);
      pool_.barrier();

      attention(l, slots, positions, blocks, tid);
      pool_.barrier();
      if (wtype_quantized(L.wo.type)) {
        for_pieces(pool_, T, qp_, tid, [&](int t, int c0, int c1) {
          quantize_part({&L.wo}, att_.as<float>(), qp_, t, c0, c1);
        });
        pool_.barrier();
      }
      add_residual(L.wo, att_.as<float>(), qp_, L.post_attn_norm, T, tid);

      for_pieces(pool_, T, ep_, tid, [&](int t, int c0, int c1) {
        norm_part(x + size_t(t) * ep_, L.mlp_norm, xn + size_t(t) * ep_, c0, c1);
        quantize_part({&L.wgate, &L.wup}, xn, ep_, t, c0, c1);  // shared rows
      });
      pool_.barrier();
      matmul_part(L.wgate, xn, T, ep_, gate_.as<float>(), fp_, false, tid);
      matmul_part(L.wup, xn, T, ep_, up_.as<float>(), fp_, false, tid);
      pool_.barrier();
      for_pieces(pool_, T, fp_, tid, [&](int t, int c0, int c1) {
        float* g = gate_.as<float>() + size_t(t) * fp_;
        kern_->glu[int(c.act)](g + c0, up_.as<float>() + size_t(t) * fp_ + c0, g + c0, c1 - c0);
        quantize_part({&L.wdown}, gate_.as<float>(), fp_, t, c0, c1);
      });
      pool_.barrier();
      add_residual(L.wdown, gate_.as<float>(), fp_, L.post_mlp_norm, T, tid);
    }
    if (c.post_norms && T >= pool_.size())
      pool_.barrier();  // the last layer's rows were finished per thread

    // Final norm of the requested rows into the front of xn, then lm_head and argmax.
    for_pieces(pool_, R, ep_, tid, [&](int r, int c0, int c1) {
      norm_part(x + size_t(out_rows[r]) * ep_, final_norm_, xn + size_t(r) * ep_, c0, c1);
      quantize_part({&head}, xn, ep_, r, c0, c1);
    });
    pool_.barrier();
    matmul_part(head, xn, R, ep_, logits_.as<float>(), vocab_stride(), false, tid);
    pool_.barrier();
    const auto [r0, r1] = pool_.split(R, tid);
    for (int r = r0; r < r1; r++) {
      const float* lr = logits_.as<float>() + size_t(r) * vocab_stride();
      const int best = kern_->argmax(lr, head.n);
      argmax[r] = head_ids ? head_ids[best] : best;
      if (second && head.n > 1) {  // the largest logit but best's, the lowest id among equals
        int next = best == 0 ? 1 : 0;
        for (int i = next + 1; i < head.n; i++)
          if (i != best && lr[i] > lr[next]) next = i;
        second[r] = head_ids ? head_ids[next] : next;
      }
      if (top_prob) {  // exp(0) / the sum of exp(logit - max)
        float mx;
        double sum;
        kern_->softmax_stats(lr, head.n, 1.f, 0.f, &mx, &sum,
                             tie_ids_.as<int32_t>() + size_t(tid) * cfg_.vocab);
        top_prob[r] = float(1.0 / sum);
      }
    }
  });
}

}  // namespace kwker
