// AVX-512 (F, BW, VL, DQ, VNNI; BF16 where the CPU has it) instantiation of the SIMD kernels: the
// same template as AVX2 with 16-float registers and a larger register tile. Called only after the
// CPU has been checked for those features.
#include <immintrin.h>

#include "cpu_features.h"
#include "simd_table.h"

#ifndef KWKER_AVX512_ENTRY  // avx512_emulated.cpp compiles this file again under other names
#define KWKER_AVX512_ENTRY kernels_avx512
#define KWKER_AVX512_NAME "avx512"
#define KWKER_AVX512_PIN(a) asm("" : "+v"(a))
// AVX512_BF16 (this file is compiled with -mavx512bf16; these are its only BF16 instructions, and
// the table uses them only on a CPU that has them, see below)
#define KWKER_AVX512_DPBF16(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define KWKER_AVX512_CVTNE2PS_PBH(hi, lo) ((__m512i)_mm512_cvtne2ps_pbh(hi, lo))
#define KWKER_AVX512_HAS_BF16() cpu_features().avx512bf16
#endif

namespace kwker {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int TB = 12;  // tokens per tile: 12 x 1 accumulators + weights + a broadcast
  // panels per GEMV tile: enough independent FMA chains to hide latency
  static constexpr int NP_GEMV = 8;
  static constexpr int FEW_ROWS = 8;  // rows of the few-row tiles of 2-byte formats (see matmul)

  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg a) { _mm512_storeu_ps(p, a); }
  static reg set1(float a) { return _mm512_set1_ps(a); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg round(reg a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static reg pow2i(reg n) {
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(e);
  }
  static reg exp(reg x) { return simd::exp_poly<Avx512>(x); }
  static float hmax(reg a) { return _mm512_reduce_max_ps(a); }
  static unsigned ge_mask(reg a, reg b) { return unsigned(_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ)); }
  static float hsum(reg a) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_f16(uint16_t* p, reg a) {
    const __m256i h = _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  // Quantized formats: 16 int32 lanes = the 16 rows of a panel; a register of weights holds 4
  // k-steps of each. vpdpbusd (AVX512_VNNI) adds u8 x s8 products of 4 bytes into int32 without
  // intermediate saturation.
  using ireg = __m512i;
  static constexpr int TBQ = 12, TBQ4 = 12;
  static constexpr int NPQ_GEMV = 4;
  static void pin(ireg& a) { KWKER_AVX512_PIN(a); }  // keeps a in a register (see qmatmul_tile)
  static ireg izero() { return _mm512_setzero_si512(); }
  static reg cvt(ireg a) { return _mm512_cvtepi32_ps(a); }
  static ireg bcast4(const int8_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  template <WType T>
  static ireg load_qw(const uint8_t* group, int) {
    if constexpr (T == WType::Q8) {
      return _mm512_loadu_si512(group);
    } else {  // rows 0-7 in the low nibbles, rows 8-15 in the high ones: the 32 bytes in both
              // halves (one load), the upper half shifted down a nibble, then both masked
      const __m512i v =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group)));
      return _mm512_and_si512(_mm512_mask_srli_epi16(v, __mmask32(0xffff0000u), v, 4),
                              _mm512_set1_epi8(0x0f));
    }
  }
  static ireg abs8(ireg w) { return _mm512_abs_epi8(w); }
  static void store_qw(uint8_t* p, ireg a) { _mm512_storeu_si512(p, a); }
  // Activation quantization (see Avx2)
  static reg abs(reg a) { return _mm512_abs_ps(a); }
  static ireg cvt_round(reg a) { return _mm512_cvtps_epi32(a); }
  static ireg iadd(ireg a, ireg b) { return _mm512_add_epi32(a, b); }
  static int ihsum(ireg a) {
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
  }
  static void store_q32(int8_t* q, const ireg (&r)[2]) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(r[0]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(r[1]));
  }
  static ireg dot_q8(ireg acc, ireg wa, ireg w, ireg x) {  // |w| * (x negated where w < 0)
    const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(acc, wa, xs);
  }
  static ireg dot_q4(ireg acc, ireg w, ireg x) { return _mm512_dpbusd_epi32(acc, w, x); }
  static ireg finish_q4(ireg acc) { return acc; }
  // The K formats (simd::q4k_tile, q6k_tile). Tiles: 8 rows x 1 panel (8 dot products + 8 scaled
  // sums), or one row x 4 panels. Q4K's dot products are dot_q4's int32 sums, taken times the 16
  // rows' 6-bit scales (bytes, widened); its mins are 16 int16 pairs for pmaddwd.
  static constexpr int TBK = 8, NPK_GEMV = 4;
  static ireg load_sc(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static ireg scale_dot(ireg dot, ireg sc) { return _mm512_mullo_epi32(dot, sc); }
  static ireg load_mins(const uint8_t* p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static ireg madd16(ireg a, ireg b) { return _mm512_madd_epi16(a, b); }
  // Q6K: the levels q (0..63) of 16 rows at 4 k-steps of group G of a quad (formats.h): its
  // nibbles (the low or high halves of its pair's line) and its top bits (bits 2G of the quad's
  // line) shifted to bits 4-5, merged by a ternary logic op (nib | (top & 0x30)). Shifts are in
  // 16-bit lanes; what they bring from a neighbouring byte is masked off.
  template <int G>
  static ireg load_q6(const uint8_t* ql, const uint8_t* qh, int) {
    const __m512i n = _mm512_loadu_si512(ql), h = _mm512_loadu_si512(qh);
    const __m512i lo =
        _mm512_and_si512(G % 2 ? _mm512_srli_epi16(n, 4) : n, _mm512_set1_epi8(0x0f));
    const __m512i top = G == 0   ? _mm512_slli_epi16(h, 4)
                        : G == 1 ? _mm512_slli_epi16(h, 2)
                        : G == 2 ? h
                                 : _mm512_srli_epi16(h, 2);
    return _mm512_ternarylogic_epi32(lo, top, _mm512_set1_epi8(0x30), 0xF8);  // a | (b & c)
  }
  static ireg dot_q6(ireg acc, ireg w, ireg x) { return _mm512_dpbusd_epi32(acc, w, x); }
  static ireg load_sc8(const int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static ireg mullo(ireg a, ireg b) { return _mm512_mullo_epi32(a, b); }
  // The VNNI GEMM (simd::vnni_qmatmul) for two rows or more: tiles of TBV tokens x NPV panels
  // (TBV x NPV dot products, NPV weight registers, a broadcast, constants: 32 registers).
  static constexpr bool VNNI = true;
  static constexpr int TBV_Q8 = 5, TBV_Q4 = 6, NPV = 4;
  // Up to 8 rows (a batch of 8, a verify step of 7 proposed tokens): one tile of 2 panels, 16
  // chains, instead of two of 4 panels that each load and unpack them. From memory (65536 x 576,
  // one thread) Q4 at 7-8 rows took 5-15% less, Q8 at 6-7 rows 7-15% (perf-notes #48).
  static constexpr int TBV_WIDE = 8, NPV_WIDE = 2;
  // acc + the 4-byte dot products of unsigned u and signed s, per int32 lane
  static ireg dpbusd(ireg acc, ireg u, ireg s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static ireg isub(ireg a, ireg b) { return _mm512_sub_epi32(a, b); }
  static ireg iset1(int32_t v) { return _mm512_set1_epi32(v); }
  // 4 activation bytes to every lane, each plus 128 (as unsigned: x ^ 0x80)
  static ireg bcast4_u8(const int8_t* p, ireg c80) { return _mm512_xor_si512(bcast4(p), c80); }

  // BF16P (simd::matmul_bf16p): one VDPBF16PS per pair of k. Tiles of TBD tokens x NPD panels
  // for two rows or more (TBD x NPD sums, NPD weight registers, a broadcast: perf-notes #22).
  static constexpr bool BF16_DOT = true;
  static constexpr int TBD = 6, NPD = 4;
  // the 16 rows' pairs at one pair of k: 32 bf16, [row][k even, k odd]
  static ireg load_bf16_pairs(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static ireg bcast_bf16_pair(const uint16_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static reg dpbf16(reg acc, ireg w, ireg x) { return KWKER_AVX512_DPBF16(acc, w, x); }
  // 32 activations (lo: the first 16) rounded to bf16 (f32_to_bf16_daz: VCVTNE2PS2BF16's rounding)
  static void store_bf16(uint16_t* out, reg lo, reg hi) {
    _mm512_storeu_si512(out, KWKER_AVX512_CVTNE2PS_PBH(hi, lo));
  }

  template <WType T>
  static reg load_w(const void* w, size_t i) {
    if constexpr (T == WType::F32) {
      return _mm512_loadu_ps(static_cast<const float*>(w) + i);
    } else {
      __m256i h =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
      if constexpr (T == WType::BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      return _mm512_cvtph_ps(h);
    }
  }
};

}  // namespace

const Kernels& KWKER_AVX512_ENTRY() {
  static const Kernels k = [] {
    Kernels table = simd::make_kernels<Avx512>(KWKER_AVX512_NAME);
    // AVX-512 CPUs without AVX512_BF16 (Skylake-X to Ice Lake) take AVX2's BF16P kernel: the same
    // bits without VDPBF16PS.
    if (!KWKER_AVX512_HAS_BF16())
      table.matmul[int(WType::BF16P)] = kernels_avx2().matmul[int(WType::BF16P)];
    return table;
  }();
  return k;
}

}  // namespace kwker
