// The decode step of a decoder-only transformer (Llama family and its relatives), run as one native
// call: embedding -> every layer (RMSNorm, Q/K/V, RoPE, KV-cache write, attention, O, gated MLP) ->
// final norm -> lm_head, for T tokens that may belong to several sequences ("slots") at different
// positions. What differs between families is configuration: per-head q/k norms, norms after
// attention and MLP, the MLP's activation, an embedding scale, partial rotary dims, and per layer a
// sliding window and a rope table.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../kernels/kernels.h"
#include "buffer.h"
#include "threadpool.h"

namespace kwker {

constexpr int kMaxHeadDim = 512;

struct Config {
  int n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, head_dim = 0, n_ff = 0, vocab = 0;
  float norm_eps = 1e-6f;
  float attn_scale = 0.f;  // softmax scale; head_dim^-0.5 for Llama
  WType wtype = WType::F32;
  bool tied_embeddings = false;
  bool qk_norm = false;  // RMSNorm of each q and k head before RoPE (Qwen3, Gemma 3)
  // RMSNorm of the attention and MLP outputs before the residual add (Gemma 3)
  bool post_norms = false;
  Activation act = Activation::Silu;  // of the MLP gate
  float embed_scale = 1.f;            // embeddings are multiplied by it (Gemma: sqrt(n_embd))
  int rope_dim = 0;  // leading dims of each head that RoPE rotates (0: all of head_dim)
  std::vector<int> layer_window;  // per layer: attend to the last `window` positions only (0: all)
  std::vector<int> layer_rope;    // per layer: index of its rope table
  // the KV cache's elements (fp16 halves its size and the bytes attention reads)
  KVType kv_type = KVType::F32;
};

// A weight matrix [n, k] packed in panels (kernels.h), k padded to kp; optional bias [n] zero
// padded to a panel.
struct Matrix {
  void* w = nullptr;  // the packed panels, in the model's weight space
  Buffer bias;
  int n = 0, k = 0, kp = 0;
  WType type = WType::F32;
  const float* bias_ptr() const { return bias.size() ? bias.as<float>() : nullptr; }
  size_t bytes() const { return panel_bytes(type, n, k); }
};

struct Layer {
  Buffer attn_norm, mlp_norm;            // [n_embd] float
  Buffer q_norm, k_norm;                 // [head_dim] float, with Config::qk_norm
  Buffer post_attn_norm, post_mlp_norm;  // [n_embd] float, with Config::post_norms
  Matrix wq, wk, wv, wo, wgate, wup, wdown;
};

class Model {
 public:
  // rope_cos/sin: n_rope tables of [max_cache_len, rope_dim / 2], the model's own (scaling types
  // applied).
  Model(const Config& cfg, int n_rope, const float* rope_cos, const float* rope_sin,
        int max_cache_len, int n_slots, int max_step_tokens, int max_out_rows, int n_threads,
        const std::string& isa);

  // name: embed, lm_head, norm,
  //       layers.<i>.<attn_norm|q|k|v|o|mlp_norm|gate|up|down|q_norm|k_norm|post_attn_norm|post_mlp_norm>
  void set_matrix(const std::string& name, const void* data, WType type, int n, int k,
                  const float* bias);
  // The same from a tensor as a GGUF file holds it: n rows of k values of ggml type `src_type`
  // (ggml.h) at `data`, dequantized a panel of rows at a time (never the whole matrix) and packed
  // as `type`. row_order, when given, names for each row r the source row it is read from (a GGUF
  // keeps some matrices with their rows permuted).
  void set_matrix_ggml(const std::string& name, const uint8_t* data, int src_type, int n, int k,
                       WType type, const float* bias, const int32_t* row_order);
  // Room for a matrix already packed as `type` (panel_bytes(type, n, k) bytes), which the caller
  // fills before the next step: a packed-weights cache reads a file straight into it.
  void* set_matrix_packed(const std::string& name, WType type, int n, int k, const float* bias);
  // A loaded matrix (nullptr if `name` is not loaded yet): its packed panels, for writing a cache.
  const Matrix* matrix(const std::string& name);
  void set_norm(const std::string& name, const float* data, int n);
  void
  check_complete();  // throws std::runtime_error naming a missing weight; else the model can step

  // Runs one step over T tokens: token t of sequence slots[t] at position positions[t]. Logits are
  // computed for the R tokens listed in out_rows (indices into the T tokens), argmax written to
  // argmax[R]. Throws std::runtime_error while a weight is missing. Steps and weight loads are
  // serialised (one mutex): calls from several threads never share the scratch; the logits a step
  // leaves are valid until the next step, so a caller that reads them must hold its own lock across
  // the step and the read.
  // also (null: none): [T], -1 or a slot into whose cache token t's K and V also go, at the same
  // position: a branch of a speculation tree (another slot) reads the rows it shares with the
  // main chain as its own, without running them twice. No two rows may write the same slot and
  // position (the caller's contract; the bindings check it).
  void step(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int T,
            const int32_t* out_rows, int R, int32_t* argmax, const int32_t* also = nullptr);
  // Copies the K and V of positions [start, start + n) of every layer from slot src's cache to
  // dst's: the bits a step would have written there (a branch slot catching up with its chain, or
  // an accepted branch's rows going back to the chain's slot).
  void copy_cache(int src, int dst, int start, int n);

  // A greedy proposal of up to k tokens for one slot in one call (a draft's proposal, without k
  // round trips through the caller): a step over the T tokens at positions start.., the argmax of
  // its last row, then one-token steps, each of the previous argmax. With `subset`, each argmax is
  // taken over the head rows set_head_subset chose (fewer rows to read; the caller's fallback is
  // the full head). With min_prob > 0 it stops early, after the first token at which the product
  // of the proposed tokens' probabilities (the softmax of their rows of logits) falls below
  // min_prob: the draft's own estimate that all its tokens so far are kept, which is what a
  // further token's worth is multiplied by. Leaves the K/V of the T tokens and of every proposed
  // token but the last in the cache, as the steps would. out: [k]; returns how many it proposed.
  // probs, second (null: not wanted): [k] each proposed token's softmax probability and the
  // runner-up token at its position (the second-largest logit, the lowest id among equals), for a
  // speculation tree's branch where the draft is least sure.
  int propose(const int32_t* tokens, int T, int slot, int start, int k, bool subset, float min_prob,
              int32_t* out, float* probs = nullptr, int32_t* second = nullptr);
  // The rows of the head a subset proposal reads: ids [n] of the vocabulary (distinct), copied bit
  // for bit from the loaded head, so that each of their logits is the full head's. Called again,
  // it copies only the rows whose id changed at their index (while the new subset fits).
  void set_head_subset(const int32_t* ids, int n);
  int head_subset_size() const { return subset_head_.n; }

  const float* logits() const { return logits_.as<float>(); }  // [R, vocab_stride]
  int vocab_stride() const { return pad_to(cfg_.vocab); }
  const Config& config() const { return cfg_; }
  int max_cache_len() const { return max_cache_; }
  int n_slots() const { return n_slots_; }
  int max_step_tokens() const { return max_step_; }
  int max_out_rows() const { return max_rows_; }
  int threads() const { return pool_.size(); }
  const char* isa() const { return kern_->name; }
  size_t weight_bytes_per_token() const;  // bytes of weights one generated token reads

 private:
  // Columns [c0, c1) of the RMSNorm of one row of the residual stream (n_embd values) with weights
  // w, written to out or, with add, added to it.
  void norm_part(const float* x, const Buffer& w, float* out, int c0, int c1,
                 bool add = false) const;
  // The residual add of a block's output projection: x += in m^T, or with post norms x +=
  // RMSNorm(in m^T) * w. Ends with the rows of x complete (post norms with at least as many tokens
  // as threads: only this thread's share of the rows, as for_pieces deals them).
  void add_residual(const Matrix& m, const float* in, int ldin, const Buffer& post_norm, int T,
                    int tid);
  void rope_and_cache(int layer, const int32_t* slots, const int32_t* also,
                      const int32_t* positions, int T, int tid);
  // This thread's part of the attention of layer l (query heads in qh_, keys and values in the
  // cache) into att_.
  void attention(int l, const int32_t* slots, const int32_t* positions, int blocks, int tid);
  char* cache_head(Buffer& cache, int slot, int layer,
                   int kv_head) const;  // K: panels; V: [pos][hdp]
  size_t kv_bytes() const { return cfg_.kv_type == KVType::F16 ? 2 : 4; }  // per cache element
  // Writes hd floats into the cache at dst (element stride `stride`), in the cache's element type.
  void store_kv(const float* x, char* dst, int stride) const;
  // Quantizes columns [c0, c1) (whole super-blocks, or to the row's end) of row t of x for the
  // matrices `ms`, which read the same rows: into qx_ if one takes Int8Blocks activations, into
  // kx_ if one takes Int8Super (a file whose q is Q4_K and v Q5_0 at int4: both).
  void quantize_part(std::initializer_list<const Matrix*> ms, const float* x, int ldx, int t,
                     int c0, int c1);
  // This thread's part of y = x w^T for `rows` rows (its share of the panels, then what it takes of
  // the others' unfinished shares). A quantized matrix reads the rows quantize_part wrote.
  void matmul_part(const Matrix& m, const float* x, int rows, int ldx, float* y, int ldy,
                   bool accumulate, int tid);

  void check_complete_locked();
  // step's work, with mu_ held: the head's rows give the logits, and head_ids (null: row i is token
  // i) the token of each row; top_prob (null: not computed) [R] the softmax probability of each
  // row's argmax over the head's rows; second (null: not computed) [R] each row's runner-up token;
  // also: as step's
  void step_locked(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int T,
                   const int32_t* out_rows, int R, int32_t* argmax, const Matrix& head,
                   const int32_t* head_ids, float* top_prob = nullptr, int32_t* second = nullptr,
                   const int32_t* also = nullptr);
  // The matrix `name` names and its shape [*want_n, *want_k] (nullptr for no such name).
  Matrix* find_matrix(const std::string& name, int* want_n, int* want_k);
  // The matrix `name` names, after checking that [n, k] is its shape (throws otherwise).
  Matrix& matrix_slot(const std::string& name, int n, int k);
  // Sets m's shape, type and bias and gives it zeroed weight space for its panels.
  void place(Matrix& m, WType type, int n, int k, const float* bias);

  Config cfg_;
  const Kernels* kern_;
  std::mutex mu_;          // held by step, set_matrix, set_norm and check_complete
  bool complete_ = false;  // check_complete passed since the last weight was set
  int max_cache_, n_slots_, max_step_, max_rows_;
  int hdp_, ep_, qp_, kvp_, fp_;  // padded strides: head_dim, n_embd, q_dim, kv_dim, n_ff
  ThreadPool pool_;

  // Zeroed space for packed weights, 64-byte aligned, from chunks of 64 MB or more in transparent
  // huge pages: a step streams every matrix, and with 4 KB pages each of a tile's panel streams
  // crosses a page (a TLB miss) every few KB (perf-notes #7). Space is not reused: loading a matrix
  // again (not done) would leave its old panels behind.
  void* weight_space(size_t bytes);
  std::vector<Buffer> weight_chunks_;
  size_t chunk_used_ = 0;

  Matrix embed_, lm_head_;
  Matrix subset_head_;               // [n, n_embd]: the head rows of subset_ids_, for proposals
  std::vector<int32_t> subset_ids_;  // [n]
  Buffer subset_space_;              // subset_head_'s panels: [subset_rows_, n_embd] packed
  int subset_rows_ = 0;
  Buffer final_norm_;
  std::vector<Layer> layers_;
  int rope_half_;               // rope_dim / 2
  Buffer rope_cos_, rope_sin_;  // [n_rope][max_cache][rope_half]
  Buffer cache_k_,
      cache_v_;  // [slot][layer][kv_head] x (K: [pos/16][hdp][16] panels, V: [pos][hdp]) of kv_type

  // scratch, [max_step, stride]
  Buffer x_, xn_, q_, k_, v_, qh_, att_, gate_, up_;
  Buffer qx_, qd_,
      qdsum_;  // quantized activations: [max_step, max kp] int8, [max_step, max kp / kQBlock] x2
  // Int8Super activations: [max_step, max kp] int8, [max_step, max kp / kSuperBlock + 1] float,
  // [max_step, max kp / 32] and [max_step, max kp / 16] int16
  Buffer kx_, kd_, ksums_, ksums16_;
  Buffer logits_;   // [max_out_rows, vocab_stride]
  Buffer tie_ids_;  // [threads][vocab] int32: softmax_stats' ids of a row's largest logits
  Buffer scores_,
      head_out_;  // two per thread: [kMaxAttendRows][pad(max_cache)], [kMaxAttendRows][hdp]
  std::vector<int> attend_runs_;  // the step's runs of tokens attended together: starts, then T
  // Matmuls hand their panels out in chunks: the i-th matmul of a step has one counter per thread's
  // share (next_panel_[i * threads + share]: panels claimed of that share), and each thread counts
  // the matmuls it has entered (all threads enter the same ones, in the same order). Reset at the
  // start of every step.
  struct alignas(64) Counter {
    std::atomic<int> value{0};
  };
  std::unique_ptr<Counter[]> next_panel_;
  int n_counters_ = 0;
  std::unique_ptr<Counter[]> matmuls_entered_;  // per thread
};

}  // namespace kwker
