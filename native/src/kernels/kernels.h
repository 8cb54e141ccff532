// Kernel interface: one table of function pointers per instruction set, chosen once at runtime.
//
// Layout contract (the packing done at load makes it hold):
//   * activation rows are padded with zeros to a multiple of kPad floats, and so is every output
//   row;
//   * weight matrices are packed in panels of kPanel rows (../formats/formats.h);
//   * each output element (float formats; the quantized ones: see QMatmulFn) is one chain of fused
//     multiply-adds over k = 0, 1, ..., kp-1 in order, starting from +0. Tile shapes only decide
//     how many chains run side by side, so a token's result does not depend on how many tokens
//     share the call, nor on the thread, nor even on the ISA (the reference uses a correctly
//     rounded fma, fma_rn, in the same order). This is what makes a token's logits identical, bit
//     for bit, alone, inside a k-token verify step, in a batch or in prefill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../formats/formats.h"

namespace kwker {

// y[t, n] (+)= sum_k x[t, k] * w[n, k] + bias[n]  for t < m and the panels p0 <= p < p1 (n = p *
// kPanel + i), for the float formats (F32, BF16, F16, BF16P).
//
// BF16P is the product of VDPBF16PS (AVX512_BF16): x rounded to bf16 (f32_to_bf16_daz), weights
// bf16, the chain over k taken in pairs, the odd k first, each step an FMA whose result is flushed
// to zero when tiny (fma_ftz, canonical.h):
//   acc = +0; for j = 0 .. kp/2 - 1: acc = fma_ftz(x[2j+1], w[2j+1], acc);
//                                     acc = fma_ftz(x[2j], w[2j], acc)
// then the bias and the accumulation in plain float32, as for the other formats. Intel's SDM
// defines VDPBF16PS so: "srcdest.fp32[i] += make_fp32(src1.bf16[2i+1]) *
// make_fp32(src2.bf16[2i+1]); srcdest.fp32[i] += make_fp32(src1.bf16[2i+0]) * ...", each an FP32
// FMA with DAZ in, FTZ out and RNE, MXCSR neither read nor written. A product of two bf16 values is
// exact in float32, so two FMAs per pair give its bits where the CPU lacks the instruction.
//   x: [m, ldx] float, w: panels [.., kp, kPanel] of the weight type, y: [m, ldy] with ldy >= p1 *
//   kPanel, bias: [p1 * kPanel] (zero padded) or null. accumulate=true adds to y (the residual
//   connection as epilogue).
using MatmulFn = void (*)(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1,
                          float* y, int ldy, const float* bias, bool accumulate);

// Activations for the quantized formats: each row quantized per block of kQBlock values to int8
// with a float scale (d = max|x| / 127, q = round-to-nearest-even(x / d)), and dsum = d * float(sum
// of the block's q) (the factor of a Q4 block's min). Rows of kp values: q [m, kp], d and dsum [m,
// kp / kQBlock]. The quantization of a row depends on that row alone.
//
// Int8Super activations (Q4K, Q6K) take one scale per super-block instead: d = max|x| / 127 over
// its kSuperBlock values, d [m, kp / kSuperBlock], and the integer sums of the levels of each block
// of 32 and of 16, sums [m, kp / 32] and sums16 [m, kp / 16] (int16: at most 32 * 127; pmaddwd
// multiplies the first by a Q4K row's mins). dsum is unused.
struct QRows {
  const int8_t* q;
  const float* d;
  const float* dsum;
  const int16_t* sums = nullptr;
  const int16_t* sums16 = nullptr;
};
void quantize_rows(const float* x, int m, int ldx, int kp, int8_t* q, float* d, float* dsum);
void quantize_rows_super(const float* x, int m, int ldx, int kp, int8_t* q, float* d, int16_t* sums,
                         int16_t* sums16);
// quantize_rows as a kernel: every ISA's gives the same bytes (max, one division, one multiply and
// a round to nearest even per value are exact operations in any order).
using QuantizeFn = void (*)(const float* x, int m, int ldx, int kp, int8_t* q, float* d,
                            float* dsum);

// The same product for Q8 and Q4 weights on quantized activations. Each output is
//   acc = 0; for each block b in order: acc = fma(dw[n, b] * dx[t, b], float(sum_k qw * qx), acc)
//                                       (Q4: then acc = fma(mw[n, b], dsum[t, b], acc))
// where the integer dot product of a block is exact; so, as for the float formats, a row's result
// does not depend on the tile, the thread, the ISA, or the other rows of the call.
// Q4K (on Int8Super activations), per super-block b in order, with integer sums over its sub-blocks
// s (exact in int32: |S1| <= 8 * 63 * 15 * 32 * 127):
//   S1 = sum_s sc[n, s] * (sum_{k in s} qw * qx),  S2 = sum_s mn[n, s] * sums[t, s]
//   acc = fma(d[n, b] * dx[t, b], float(S1), acc); acc = fma(dmin[n, b] * dx[t, b], float(-S2),
//   acc)
// Q6K, per super-block b in order, over its sub-blocks s of 16 (|S| < 2^29):
//   S = sum_s sc[n, s] * (sum_{k in s} qw * qx - 32 * sums16[t, s])
//   acc = fma(d[n, b] * dx[t, b], float(S), acc)
using QMatmulFn = void (*)(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y,
                           int ldy, const float* bias, bool accumulate);

// Causal attention over one KV head for nt query tokens of one sequence, each with the g query
// heads that share that KV head (rows = g * nt <= kMaxAttendRows). Row j is head j % g of token j /
// g, at q + (j / g) * q_stride + (j % g) * hdp; token t attends to keys first[t]..n[t]-1 (first >
// 0: a sliding window):
//   out[j] = sum_i softmax_i(scale * q_j . k_i) v_i
//   k: the head's key panels [.., hdp, kPanel] (key i, dim d at ((i / kPanel) * hdp + d) * kPanel +
//   i % kPanel); v: [max n, hdp]; scores: scratch [rows, pad_to(max n)]; out: [rows, hdp]. Keys and
//   values are float32 or fp16 (the KV cache's element type, KVType), read as float32.
// Each (query, key) score is one FMA chain over d, each output column one FMA chain over the row's
// keys in order, the softmax's exponential and sum the canonical ones (canonical.h): a row's result
// does not depend on which other rows share the call, nor on the ISA.
enum class KVType : int { F32 = 0, F16 = 1 };
constexpr int kKVTypes = 2;

// That attention is made in parts, so that the threads can share one call's work: three phases,
// each begun once the previous one has finished for the whole call (same arguments, scores and out
// shared): Scores computes the scores of the keys in panels [lo, hi); Softmax turns rows [lo, hi)
// of them into probabilities and clears those rows of out; Values adds columns [lo, hi) (multiples
// of kAttendColumns) of every row's output. Every score, probability and output column is computed
// as the whole call computes it, so the parts, however cut, give the whole call's bits.
enum class AttendPhase : int { Scores = 0, Softmax = 1, Values = 2 };
constexpr int kAttendColumns = 16;  // a multiple of every ISA's register width
using AttendPartFn = void (*)(AttendPhase phase, int lo, int hi, const float* q, int g, int nt,
                              size_t q_stride, const void* k, const void* v, const int* first,
                              const int* n, int hdp, float scale, float* scores, float* out);
// The whole call: its three parts over everything.
inline void attend_whole(AttendPartFn part, const float* q, int g, int nt, size_t q_stride,
                         const void* k, const void* v, const int* first, const int* n, int hdp,
                         float scale, float* scores, float* out) {
  part(AttendPhase::Scores, 0, 1 << 30, q, g, nt, q_stride, k, v, first, n, hdp, scale, scores,
       out);
  part(AttendPhase::Softmax, 0, g * nt, q, g, nt, q_stride, k, v, first, n, hdp, scale, scores,
       out);
  part(AttendPhase::Values, 0, hdp, q, g, nt, q_stride, k, v, first, n, hdp, scale, scores, out);
}

// out[i] = fp16 bits of x[i] rounded to nearest even (as f32_to_f16), i < n.
using ToF16Fn = void (*)(const float* x, uint16_t* out, int n);

// The MLP gate's activation. GeluTanh is transformers' gelu_pytorch_tanh: 0.5 x (1 + tanh(u)),
// which equals x sigmoid(2u) with u = sqrt(2 / pi) (x + 0.044715 x^3).
enum class Activation : int { Silu = 0, GeluTanh = 1 };
constexpr int kActivations = 2;

// out[i] = act(gate[i]) * up[i], i < n, with the canonical exponential (canonical.h).
using GluFn = void (*)(const float* gate, const float* up, float* out, int n);

// Softmax statistics of a row of scores for the sampler, at temperature t: with q[i] = x[i] / t
// (float32, as numpy divides), *max = the largest q, *sum = the sum of exp(q[i] - max) (canonical
// float32 sums of blocks of kStatsBlock terms, canonical.h, added in double in block order), and
// the ids of the q[i] >= max - close, ascending, written to ids (room for n); returns how many. n
// >= 1, t > 0.
using SoftmaxStatsFn = int (*)(const float* x, int n, float t, float close, float* max, double* sum,
                               int32_t* ids);
constexpr int kStatsBlock = 256;

// The index of the largest of x[0..n), the lowest among equals (n >= 1): the scan
//   best = 0; for i = 1 .. n - 1: if (x[i] > x[best]) best = i
// (a NaN is never larger: after a NaN at 0 it stays 0, elsewhere it is passed over).
using ArgmaxFn = int (*)(const float* x, int n);

struct Kernels {
  const char* name;
  MatmulFn matmul[kWTypes];            // by WType: F32, BF16, F16, BF16P (null: quantized)
  QMatmulFn qmatmul[kWTypes];          // by WType: Q8, Q4, Q4K, Q6K (null: float formats)
  QuantizeFn quantize;                 // the activations of the quantized matmuls (Int8Blocks)
  AttendPartFn attend_part[kKVTypes];  // by KVType
  GluFn glu[kActivations];             // by Activation
  ToF16Fn to_f16;
  SoftmaxStatsFn softmax_stats;
  ArgmaxFn argmax;
};

const Kernels& kernels_generic();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels&
kernels_avx512_emulated();  // avx512.cpp on SIMDe: only in builds with KWKER_AVX512_EMULATED

bool isa_supported(const std::string& isa);
// The best ISA this CPU runs, or the one KWKER_ISA names (an error if the CPU lacks it).
const Kernels& kernels_select(const std::string& forced);
std::string isa_best();

// Largest number of query heads of one token, and of rows in all, that one attention call takes.
constexpr int kMaxAttendHeads = 4;
constexpr int kMaxAttendRows = 6;

}  // namespace kwker
