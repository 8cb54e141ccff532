// The SIMD kernels, written once over a vector-traits class V and instantiated per ISA (avx2.cpp, avx512.cpp).
//
// V provides: reg, W (floats per register), TB (tokens per register tile in the multi-row matmul), NP_GEMV
// (panels per tile when m == 1), zero/load/store/set1/fma/add/mul/div/sub/min/max/round/pow2i, hsum (a fixed
// reduction tree), exp, load_w<WType> (W weights as floats).
//
// Batch invariance: see kernels.h. The matmul keeps one lane per output element, a chain of FMAs over k in order;
// the attention keeps one register chain per (query, key) dot product and per output column.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels.h"

namespace kwker::simd {

// A register tile: TB tokens x NP panels (NP * kPanel outputs). Per k: the panels' weights are loaded once, each
// token's x[t, k] is broadcast, and every accumulator takes one fused multiply-add (an outer product).
template <class V, WType T, int TB, int NP>
inline void matmul_tile(const float* x, int ldx, const void* w, int kp, int p, float* y, int ldy, const float* bias,
                        bool accumulate) {
  using R = typename V::reg;
  constexpr int RP = kPanel / V::W;  // registers per panel
  R acc[TB][NP * RP];
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
    for (int j = 0; j < NP * RP; j++) acc[t][j] = V::zero();
  for (int k = 0; k < kp; k++) {
    R wv[NP * RP];
#pragma GCC unroll 16
    for (int j = 0; j < NP * RP; j++)
      wv[j] = V::template load_w<T>(w, (size_t(p + j / RP) * kp + k) * kPanel + (j % RP) * V::W);
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) {
      R xb = V::set1(x[size_t(t) * ldx + k]);
#pragma GCC unroll 16
      for (int j = 0; j < NP * RP; j++) acc[t][j] = V::fma(xb, wv[j], acc[t][j]);
    }
  }
  const int n0 = p * kPanel;
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++) {
    float* yr = y + size_t(t) * ldy + n0;
#pragma GCC unroll 16
    for (int j = 0; j < NP * RP; j++) {
      R r = acc[t][j];
      if (bias) r = V::add(r, V::load(bias + n0 + j * V::W));
      if (accumulate) r = V::add(V::load(yr + j * V::W), r);
      V::store(yr + j * V::W, r);
    }
  }
}

// Tokens per cache block in the multi-row path: a block of x rows stays in cache while the panels stream by.
constexpr int kRowBlock = 48;

template <class V, WType T>
void matmul(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1, float* y, int ldy,
            const float* bias, bool accumulate) {
  constexpr int TB = V::TB, NPV = V::NP_GEMV;
  if (m == 1) {
    int p = p0;
    for (; p + NPV <= p1; p += NPV) matmul_tile<V, T, 1, NPV>(x, ldx, w, kp, p, y, ldy, bias, accumulate);
    for (; p < p1; p++) matmul_tile<V, T, 1, 1>(x, ldx, w, kp, p, y, ldy, bias, accumulate);
    return;
  }
  for (int m0 = 0; m0 < m; m0 += kRowBlock) {
    const int mc = std::min(kRowBlock, m - m0);
    const float* xb = x + size_t(m0) * ldx;
    float* yb = y + size_t(m0) * ldy;
    for (int p = p0; p < p1; p++) {
      int t = 0;
      for (; t + TB <= mc; t += TB)
        matmul_tile<V, T, TB, 1>(xb + size_t(t) * ldx, ldx, w, kp, p, yb + size_t(t) * ldy, ldy, bias, accumulate);
      for (; t < mc; t++)
        matmul_tile<V, T, 1, 1>(xb + size_t(t) * ldx, ldx, w, kp, p, yb + size_t(t) * ldy, ldy, bias, accumulate);
    }
  }
}

// One dot product chain per key; KB keys side by side to hide the FMA latency.
template <class V, int KB>
inline void attend_scores(const float* q, const float* k, int i, int hdp, float scale, float* scores) {
  using R = typename V::reg;
  R acc[KB];
#pragma GCC unroll 8
  for (int j = 0; j < KB; j++) acc[j] = V::zero();
  for (int c = 0; c < hdp; c += V::W) {
    R qv = V::load(q + c);
#pragma GCC unroll 8
    for (int j = 0; j < KB; j++) acc[j] = V::fma(qv, V::load(k + size_t(i + j) * hdp + c), acc[j]);
  }
  for (int j = 0; j < KB; j++) scores[i + j] = V::hsum(acc[j]) * scale;
}

template <class V, int CB>
inline void attend_values(const float* p, const float* v, int n, int hdp, int c0, float* out) {
  using R = typename V::reg;
  R acc[CB];
#pragma GCC unroll 8
  for (int j = 0; j < CB; j++) acc[j] = V::zero();
  for (int i = 0; i < n; i++) {
    R pv = V::set1(p[i]);
    const float* vi = v + size_t(i) * hdp + c0;
#pragma GCC unroll 8
    for (int j = 0; j < CB; j++) acc[j] = V::fma(pv, V::load(vi + j * V::W), acc[j]);
  }
  for (int j = 0; j < CB; j++) V::store(out + c0 + j * V::W, acc[j]);
}

template <class V>
void attend(const float* q, const float* k, const float* v, int n, int hdp, float scale, float* scores,
            float* out) {
  int i = 0;
  for (; i + 4 <= n; i += 4) attend_scores<V, 4>(q, k, i, hdp, scale, scores);
  for (; i < n; i++) attend_scores<V, 1>(q, k, i, hdp, scale, scores);
  float mx = scores[0];
  for (i = 1; i < n; i++) mx = std::max(mx, scores[i]);
  const int np = (n + V::W - 1) / V::W * V::W;
  for (i = n; i < np; i++) scores[i] = mx;  // defined values for the vector tail; never summed
  const typename V::reg vmx = V::set1(mx);
  for (i = 0; i < np; i += V::W) V::store(scores + i, V::exp(V::sub(V::load(scores + i), vmx)));
  float sum = 0.f;
  for (i = 0; i < n; i++) sum += scores[i];
  const typename V::reg vsum = V::set1(sum);
  for (i = 0; i < np; i += V::W) V::store(scores + i, V::div(V::load(scores + i), vsum));
  constexpr int CB = 4;
  int c = 0;
  for (; c + CB * V::W <= hdp; c += CB * V::W) attend_values<V, CB>(scores, v, n, hdp, c, out);
  for (; c < hdp; c += V::W) attend_values<V, 1>(scores, v, n, hdp, c, out);
}

// n must be a multiple of V::W (activation rows are padded).
template <class V>
void silu_mul(const float* gate, const float* up, float* out, int n) {
  const typename V::reg one = V::set1(1.f);
  for (int i = 0; i < n; i += V::W) {
    typename V::reg g = V::load(gate + i);
    typename V::reg e = V::exp(V::sub(V::zero(), g));
    V::store(out + i, V::mul(V::div(g, V::add(one, e)), V::load(up + i)));
  }
}

template <class V>
Kernels make_kernels(const char* name) {
  return Kernels{name,
                 {matmul<V, WType::F32>, matmul<V, WType::BF16>, matmul<V, WType::F16>},
                 attend<V>,
                 silu_mul<V>};
}

// exp(x) for a vector, Cephes' polynomial (about 1 ulp on the clamped range). The clamp keeps 2^n normal.
template <class V>
inline typename V::reg exp_poly(typename V::reg x) {
  using R = typename V::reg;
  x = V::min(V::max(x, V::set1(-87.0f)), V::set1(88.0f));
  R fx = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  R r = V::fma(fx, V::set1(-0.693359375f), x);
  r = V::fma(fx, V::set1(2.12194440e-4f), r);
  R y = V::set1(1.9875691500E-4f);
  y = V::fma(y, r, V::set1(1.3981999507E-3f));
  y = V::fma(y, r, V::set1(8.3334519073E-3f));
  y = V::fma(y, r, V::set1(4.1665795894E-2f));
  y = V::fma(y, r, V::set1(1.6666665459E-1f));
  y = V::fma(y, r, V::set1(5.0000001201E-1f));
  y = V::fma(y, V::mul(r, r), V::add(r, V::set1(1.f)));
  return V::mul(y, V::pow2i(fx));
}

}  // namespace kwker::simd
