// Portable reference kernels: plain loops, written independently of the SIMD template so that they are a real
// oracle for it (tests compare every ISA against these with a named tolerance). Also the fallback on CPUs
// without AVX2.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels.h"

namespace kwker {

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float weight_to_f32(const void* data, WType t, size_t i) {
  switch (t) {
    case WType::F32: return static_cast<const float*>(data)[i];
    case WType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case WType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.f;
}

size_t panel_bytes(WType t, int n, int k) { return size_t(pad_to(n, kPanel)) * pad_to(k) * wtype_size(t); }

void pack_panels(const void* src, WType t, int n, int k, void* dst) {
  const size_t es = wtype_size(t);
  const int kp = pad_to(k);
  std::memset(dst, 0, panel_bytes(t, n, k));
  for (int r = 0; r < n; r++)
    for (int c = 0; c < k; c++)
      std::memcpy(static_cast<char*>(dst) + panel_index(r, c, kp) * es,
                  static_cast<const char*>(src) + (size_t(r) * k + c) * es, es);
}

namespace {

// One fused multiply-add chain per output over k in order: the contract every ISA's kernel meets bit for bit.
template <WType T>
void matmul_generic(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1, float* y, int ldy,
                    const float* bias, bool accumulate) {
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      float s = 0.f;
      for (int k = 0; k < kp; k++) s = std::fma(x[size_t(t) * ldx + k], weight_to_f32(w, T, panel_index(n, k, kp)), s);
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

void attend_generic(const float* q, int g, const float* k, const float* v, int n, int hdp, float scale,
                    float* scores, float* out) {
  for (int j = 0; j < g; j++) {
    const float* qj = q + size_t(j) * hdp;
    float* s = scores + size_t(j) * pad_to(n);
    float mx = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; i++) {
      float dot = 0.f;
      for (int d = 0; d < hdp; d++) dot += qj[d] * k[panel_index(i, d, hdp)];
      s[i] = dot * scale;
      mx = std::fmax(mx, s[i]);
    }
    float sum = 0.f;
    for (int i = 0; i < n; i++) {
      s[i] = std::exp(s[i] - mx);
      sum += s[i];
    }
    float* o = out + size_t(j) * hdp;
    for (int c = 0; c < hdp; c++) o[c] = 0.f;
    for (int i = 0; i < n; i++) {
      const float p = s[i] / sum;
      for (int c = 0; c < hdp; c++) o[c] += p * v[size_t(i) * hdp + c];
    }
  }
}

void silu_mul_generic(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; i++) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

}  // namespace

const Kernels& kernels_generic() {
  static const Kernels k{"generic",
                         {matmul_generic<WType::F32>, matmul_generic<WType::BF16>, matmul_generic<WType::F16>},
                         attend_generic,
                         silu_mul_generic};
  return k;
}

}  // namespace kwker
