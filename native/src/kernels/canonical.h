// The two computations whose order every ISA must share for a token to get the same bits on every
// CPU: the exponential and the sum of a row. Both are written once over a vector-traits class V
// (simd_kernels.h) and instantiated for the SIMD registers and, with ScalarOps, for the portable
// reference kernels, so that generic, AVX2 and AVX-512 perform the same float operations in the
// same order whatever their register width.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kwker {

// Sums are taken over kSumLanes lanes: lane l adds s[16 i + l] for i = 0, 1, ... in order, starting
// from +0 (a missing element of the last group counts as +0), and the lanes are then combined by a
// fixed tree: l[i] + l[i + 8], then + [i + 4], + [i + 2], + [i + 1]. An AVX-512 register holds the
// 16 lanes, AVX2 two registers of 8, the reference 16 floats.
constexpr int kSumLanes = 16;

// fma(a, b, c) rounded once, to nearest even, from double arithmetic: a * b is exact in double, so
// is the error e of its sum with c (TwoSum), and that sum rounded to odd (its last bit set when e
// is not zero) rounds to the float that the exact value rounds to (53 >= 2 * 24 + 2 bits). NaN and
// infinite results as double arithmetic gives them. For C libraries whose fmaf rounds twice:
// MinGW-w64's missed on a quarter of random inputs, making the reference kernels disagree with the
// FMA instructions.
inline float fma_exact(float a, float b, float c) {
  const double p = double(a) * double(b), z = c, s = p + z;
  if (!std::isfinite(s)) return float(s);
  const double zs = s - p, e = (p - (s - zs)) + (z - zs);
  uint64_t u;
  std::memcpy(&u, &s, 8);
  if (e != 0 && !(u & 1)) u = (e > 0) == (s > 0) ? u + 1 : u - 1;  // away from s, toward the value
  double r;
  std::memcpy(&r, &u, 8);
  return float(r);
}

// The reference kernels' fused multiply-add: the C library's, except on Windows, where MinGW-w64's
// rounds twice (and the UCRT's was never tested).
inline float fma_rn(float a, float b, float c) {
#if defined(_WIN32)
  return fma_exact(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// One float as a "register" of width 1, with the semantics of the SIMD instructions (max/min as
// MAXPS/MINPS, round to nearest even as ROUNDPS in the default mode, fma fused).
struct ScalarOps {
  using reg = float;
  static constexpr int W = 1;
  static float set1(float a) { return a; }
  static float add(float a, float b) { return a + b; }
  static float sub(float a, float b) { return a - b; }
  static float mul(float a, float b) { return a * b; }
  static float fma(float a, float b, float c) { return fma_rn(a, b, c); }
  static float max(float a, float b) { return a > b ? a : b; }
  static float min(float a, float b) { return a < b ? a : b; }
  static float round(float a) { return std::nearbyint(a); }
  static float pow2i(float n) {  // 2^n for integral n in [-126, 127]
    const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

namespace simd {

// exp(x), Cephes' polynomial (about 1 ulp on the clamped range). The clamp keeps 2^n normal.
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

}  // namespace simd

// fma(a, b, c) with a tiny result flushed to zero of its sign, as x86 flushes under MXCSR.FTZ and
// VDPBF16PS always: the result is tiny when, rounded to 24 bits with an unbounded exponent, it is
// below FLT_MIN (x86 detects tininess after rounding). The gradual-underflow result r of the fma
// says it in all but one case: an exact sum in [FLT_MIN (1 - 2^-24), FLT_MIN (1 - 2^-25)), which
// rounds to FLT_MIN in r but below it with 24 bits, so it is flushed. There the sum is exact in
// double (a tiny result leaves c and a * b within 49 bits of each other), so it is compared so.
inline float fma_ftz(float a, float b, float c) {
  const float r = fma_rn(a, b, c);
  if (r == 0.f || !(std::fabs(r) <= 0x1p-126f)) return r;  // exact zero, normal, inf or NaN
  const double v = double(a) * double(b) + double(c);
  return std::fabs(v) < 0x1p-126 * (1 - 0x1p-25) ? std::copysign(0.f, r) : r;
}

// The reference's exponential: the same polynomial, one value at a time.
inline float exp_canonical(float x) { return simd::exp_poly<ScalarOps>(x); }

// The canonical sum of s[0..n) (kSumLanes, above), one value at a time.
inline float sum_canonical(const float* s, int n) {
  float lane[kSumLanes] = {};
  for (int i = 0; i < n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; l++) lane[l] += i + l < n ? s[i + l] : 0.f;
  for (int half = kSumLanes / 2; half >= 1; half /= 2)
    for (int l = 0; l < half; l++) lane[l] = lane[l] + lane[l + half];
  return lane[0];
}

}  // namespace kwker
