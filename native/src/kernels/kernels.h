// Kernel interface: one table of function pointers per instruction set, chosen once at runtime.
//
// Layout contract (the packing done at load makes it hold):
//   * every activation row and every weight row is padded with zeros to a multiple of kPad floats/elements,
//     so kernels never handle a K tail;
//   * each output element is computed by exactly one call, with a reduction order that depends only on K,
//     never on how many rows (tokens) or which thread share the call. This is what makes a token's logits
//     identical, bit for bit, whether it is decoded alone, inside a k-token verify step or in prefill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kwker {

constexpr int kPad = 16;  // floats; one AVX-512 register, two AVX2 registers

inline int pad_to(int n, int m = kPad) { return (n + m - 1) / m * m; }

enum class WType : int { F32 = 0, BF16 = 1, F16 = 2 };

inline size_t wtype_size(WType t) { return t == WType::F32 ? 4 : 2; }

// y[t, n] (+)= sum_k x[t, k] * w[n, k] + bias[n]  for t < m, n0 <= n < n1.
//   x: [m, ldx] float, w: [N, kp] of the weight type, y: [m, ldy], bias: [N] or null.
//   accumulate=true adds the result to y (the residual connection is the epilogue).
using MatmulFn = void (*)(const float* x, int m, int ldx, const void* w, int kp, int n0, int n1, float* y, int ldy,
                          const float* bias, bool accumulate);

// out[hdp] = softmax(scale * q . k_i for i < n) weighted sum of v_i.
//   q: [hdp], k, v: [n, hdp] (rows of one head of the KV cache), scores: scratch [pad_to(n)].
using AttendFn = void (*)(const float* q, const float* k, const float* v, int n, int hdp, float scale,
                          float* scores, float* out);

// out[i] = silu(gate[i]) * up[i], i < n.
using SiluMulFn = void (*)(const float* gate, const float* up, float* out, int n);

struct Kernels {
  const char* name;
  MatmulFn matmul[3];  // indexed by WType
  AttendFn attend;
  SiluMulFn silu_mul;
};

const Kernels& kernels_generic();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();

bool isa_supported(const std::string& isa);
// The best ISA this CPU runs, or the one KWKER_ISA names (an error if the CPU lacks it).
const Kernels& kernels_select(const std::string& forced);
std::string isa_best();

// Portable scalar conversions, shared by the reference kernels and weight packing.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

float f16_to_f32(uint16_t h);

}  // namespace kwker
