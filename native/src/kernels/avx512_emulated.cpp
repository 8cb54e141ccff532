// The AVX-512 kernels (avx512.cpp, unchanged) compiled against SIMDe's portable implementations of
// the intrinsics, so that the source an AVX-512 machine runs is tested, result for result, on
// machines without AVX-512. Built only where SIMDe's headers are found (the simde-py build
// requirement); its ISA, "avx512-emulated", is for tests and is never chosen by itself. Intrinsics
// a SIMDe release lacks are defined below, element by element, with the semantics of Intel's
// reference (round to nearest even where the hardware rounds by MXCSR's default).
#define SIMDE_ENABLE_NATIVE_ALIASES
#ifdef __clang__
// clang's own headers declare __mmask64 (unsigned long long), which SIMDe 0.8.2 then declares again
// as uint64_t (unsigned long on Linux): defined as a macro, SIMDe's stays out
#define __mmask64 __mmask64
#endif
#include <simde/x86/avx512.h>

#include <cmath>
#include <cstdint>

#include "canonical.h"
#include "kernels.h"

namespace kwker {
namespace emulated {

// out[i] = f(in[i]) over the 16 lanes of a vector: In and Out are the lane types, VIn and VOut the
// vector types.
template <class In, class Out, class VOut, class VIn, class F>
inline VOut lanes(VIn a, F f) {
  In in[16];
  Out out[16];
  __builtin_memcpy(in, &a, sizeof(in));
  for (int i = 0; i < 16; i++) out[i] = f(in[i]);
  VOut r;
  __builtin_memcpy(&r, out, sizeof(out));
  return r;
}

inline simde__m512 cvtepi32_ps(simde__m512i a) {
  return lanes<int32_t, float, simde__m512>(a, [](int32_t v) { return float(v); });
}
inline simde__m512i cvtps_epi32(simde__m512 a) {
  return lanes<float, int32_t, simde__m512i>(a, [](float v) { return int32_t(std::nearbyint(v)); });
}
inline simde__m512i cvtepu16_epi32(simde__m256i a) {
  return lanes<uint16_t, int32_t, simde__m512i>(a, [](uint16_t v) { return int32_t(v); });
}
inline simde__m512i cvtepu8_epi32(simde__m128i a) {
  return lanes<uint8_t, int32_t, simde__m512i>(a, [](uint8_t v) { return int32_t(v); });
}
inline simde__m512i cvtepi8_epi32(simde__m128i a) {
  return lanes<int8_t, int32_t, simde__m512i>(a, [](int8_t v) { return int32_t(v); });
}
inline simde__m512i cvtepu8_epi16(simde__m256i a) {  // 32 lanes
  uint8_t in[32];
  int16_t out[32];
  __builtin_memcpy(in, &a, sizeof(in));
  for (int i = 0; i < 32; i++) out[i] = int16_t(in[i]);
  simde__m512i r;
  __builtin_memcpy(&r, out, sizeof(out));
  return r;
}
inline simde__m512 cvtph_ps(simde__m256i a) {
  return lanes<uint16_t, float, simde__m512>(a, f16_to_f32);
}
inline simde__m256i cvtps_ph(simde__m512 a,
                             int) {  // the kernels ask for round to nearest even only
  return lanes<float, uint16_t, simde__m256i>(a, f32_to_f16);
}
inline float reduce_max_ps(simde__m512 a) {
  float v[16];
  __builtin_memcpy(v, &a, sizeof(v));
  float m = v[0];
  for (int i = 1; i < 16; i++) m = v[i] > m ? v[i] : m;
  return m;
}

// VDPBF16PS as Intel's SDM defines it, lane by lane: the odd pair first, each step an FMA with
// DAZ on its inputs and FTZ on its result. (SIMDe 0.8.2's adds the even product first, rounds the
// product and the sum apart, and flushes nothing.)
inline float daz(float v) { return std::fabs(v) < 0x1p-126f ? std::copysign(0.f, v) : v; }
inline simde__m512 dpbf16_ps(simde__m512 src, simde__m512i a, simde__m512i b) {
  float acc[16];
  uint16_t x[32], y[32];
  __builtin_memcpy(acc, &src, sizeof(acc));
  __builtin_memcpy(x, &a, sizeof(x));
  __builtin_memcpy(y, &b, sizeof(y));
  for (int i = 0; i < 16; i++)
    for (int e : {1, 0})
      acc[i] = fma_ftz(daz(bf16_to_f32(x[2 * i + e])), daz(bf16_to_f32(y[2 * i + e])), daz(acc[i]));
  simde__m512 r;
  __builtin_memcpy(&r, acc, sizeof(acc));
  return r;
}
// VCVTNE2PS2BF16: lo's 16 values in the low half, hi's in the high half, each as f32_to_bf16_daz.
inline simde__m512i cvtne2ps_pbh(simde__m512 hi, simde__m512 lo) {
  float v[32];
  uint16_t out[32];
  __builtin_memcpy(v, &lo, sizeof(float) * 16);
  __builtin_memcpy(v + 16, &hi, sizeof(float) * 16);
  for (int i = 0; i < 32; i++) out[i] = f32_to_bf16_daz(v[i]);
  simde__m512i r;
  __builtin_memcpy(&r, out, sizeof(out));
  return r;
}

}  // namespace emulated
}  // namespace kwker

#define KWKER_AVX512_DPBF16(acc, a, b) kwker::emulated::dpbf16_ps(acc, a, b)
#define KWKER_AVX512_CVTNE2PS_PBH(hi, lo) kwker::emulated::cvtne2ps_pbh(hi, lo)
#define KWKER_AVX512_HAS_BF16() true  // the emulation is a CPU with AVX512_BF16

#ifdef __clang__  // clang's headers define these as macros over AVX-512 builtins: replace them
#undef _mm512_cvtps_ph
#undef _mm512_mask_srli_epi16
#endif
#ifndef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps kwker::emulated::cvtepi32_ps
#endif
#ifndef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32 kwker::emulated::cvtps_epi32
#endif
#ifndef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 kwker::emulated::cvtepu16_epi32
#endif
#ifndef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 kwker::emulated::cvtepu8_epi32
#endif
#ifndef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 kwker::emulated::cvtepi8_epi32
#endif
#ifndef _mm512_cvtepu8_epi16
#define _mm512_cvtepu8_epi16 kwker::emulated::cvtepu8_epi16
#endif
#ifndef _mm512_cvtph_ps
#define _mm512_cvtph_ps kwker::emulated::cvtph_ps
#endif
#ifndef _mm512_cvtps_ph
#define _mm512_cvtps_ph kwker::emulated::cvtps_ph
#endif
#ifndef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps kwker::emulated::reduce_max_ps
#endif

#ifndef _mm512_mask_srli_epi16  // (Intel's definition: the shifted lanes where k is set, else src)
#define _mm512_mask_srli_epi16(src, k, a, imm) \
  _mm512_mask_mov_epi16(src, k, _mm512_srli_epi16(a, imm))
#endif

#define KWKER_AVX512_ENTRY kernels_avx512_emulated
#define KWKER_AVX512_NAME "avx512-emulated"
#define KWKER_AVX512_PIN(a) \
  asm("" : "+m"(a))  // SIMDe's vectors are structs: in memory, not one register
#include "avx512.cpp"
