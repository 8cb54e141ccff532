// AVX2 + FMA + F16C instantiation of the SIMD kernels. Compiled with -mavx2 -mfma -mf16c; called only after
// the CPU has been checked for those features.
#include <immintrin.h>

#include "simd_kernels.h"

namespace kwker {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int TB = 6;       // tokens per tile: 6 x 2 accumulators + weights + a broadcast
  static constexpr int NP_GEMV = 4;  // panels per GEMV tile: enough independent FMA chains to hide latency

  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg a) { _mm256_storeu_ps(p, a); }
  static reg set1(float a) { return _mm256_set1_ps(a); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg round(reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {  // 2^n for integral n in [-126, 127]
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(e);
  }
  static reg exp(reg x) { return simd::exp_poly<Avx2>(x); }
  static float hsum(reg a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static reg load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  template <WType T>
  static reg load_q(const uint8_t* payload, int kk, int half) {
    if constexpr (T == WType::Q8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(payload + kk * kPanel + half * 8));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    } else {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(payload + kk * kPanel / 2));
      __m256i v = _mm256_cvtepu8_epi32(b);
      v = half ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0f));
      return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8)));
    }
  }
  template <WType T>
  static reg load_w(const void* w, size_t i) {
    if constexpr (T == WType::F32) {
      return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    } else {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
      if constexpr (T == WType::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      return _mm256_cvtph_ps(h);
    }
  }
};

}  // namespace

const Kernels& kernels_avx2() {
  static const Kernels k = simd::make_kernels<Avx2>("avx2");
  return k;
}

}  // namespace kwker
