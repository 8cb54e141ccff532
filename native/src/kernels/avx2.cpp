// AVX2 + FMA + F16C instantiation of the SIMD kernels. Compiled with -mavx2 -mfma -mf16c; called
// only after the CPU has been checked for those features.
#include <immintrin.h>

#include "simd_table.h"

namespace kwker {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int TB = 6;  // tokens per tile: 6 x 2 accumulators + weights + a broadcast
  // panels per GEMV tile: enough independent FMA chains to hide latency
  static constexpr int NP_GEMV = 4;
  static constexpr int FEW_ROWS = 0;  // none: 16 registers hold a TB x 1 tile (perf-notes #15)

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
  static reg round(reg a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static reg pow2i(reg n) {  // 2^n for integral n in [-126, 127]
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(e);
  }
  static reg exp(reg x) { return simd::exp_poly<Avx2>(x); }
  static float hsum(reg a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static unsigned ge_mask(reg a, reg b) {
    return unsigned(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)));
  }
  static float hmax(reg a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static reg load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_f16(uint16_t* p, reg a) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  // Quantized formats: 8 int32 lanes = 8 rows of a panel; a register of weights holds 4 k-steps of
  // 8 rows.
  using ireg = __m256i;
  // tokens per quantized tile. Q8: 5 x 2 dot products + weights, |weights|, x (6 spills). Q4: 6 x 2
  // + weights + x, the nibble mask read from memory. NPQ_GEMV: panels per quantized GEMV tile.
  // Measured: perf-notes #15.
  static constexpr int TBQ = 5, TBQ4 = 6;
  static constexpr int NPQ_GEMV = 4;
  static constexpr bool VNNI = false;  // no vnni_qmatmul: maddubs tiles (qmatmul_tile) throughout
  static void pin(ireg& a) { asm("" : "+v"(a)); }  // keeps a in a register (see qmatmul_tile)
  static ireg izero() { return _mm256_setzero_si256(); }
  static reg cvt(ireg a) { return _mm256_cvtepi32_ps(a); }
  static ireg bcast4(const int8_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  template <WType T>
  static ireg load_qw(const uint8_t* group, int j) {
    if constexpr (T == WType::Q8) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + j * 32));
    } else {  // rows 0-7 in the low nibbles, rows 8-15 in the high ones
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group));
      return _mm256_and_si256(j ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
    }
  }
  static ireg abs8(ireg w) { return _mm256_abs_epi8(w); }
  static void store_qw(uint8_t* p, ireg a) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), a);
  }
  // Activation quantization: |x|, int32 lanes rounded to nearest even, their sum, and 32 of them
  // stored as int8 (in range: the levels are within [-127, 127]).
  static reg abs(reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), a); }
  static ireg cvt_round(reg a) { return _mm256_cvtps_epi32(a); }
  static ireg iadd(ireg a, ireg b) { return _mm256_add_epi32(a, b); }
  static int ihsum(ireg a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
  }
  static void store_q32(int8_t* q, const ireg (&r)[4]) {
    // packs work within 128-bit lanes: the bytes come out as r0lo r1lo r2lo r3lo | r0hi r1hi r2hi
    // r3hi (4 each)
    const __m256i b =
        _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  }
  // |w| * (x with w's sign): u8 x s8 pairs stay below 2 * 127 * 127, so maddubs does not saturate.
  static ireg dot_q8(ireg acc, ireg wa, ireg w, ireg x) {
    const __m256i pairs = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  // Nibbles (0..15) times x: pairs are at most 2 * 15 * 127, so eight groups add up in int16 (<=
  // 30480).
  static ireg dot_q4(ireg acc, ireg w, ireg x) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x));
  }
  static ireg finish_q4(ireg acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
  // The K formats (simd::q4k_tile, q6k_tile). Tiles: 3 rows x 1 panel (2 registers each: 6 dot
  // products + 6 scaled sums + 2 weights + x), or one row x 2 panels. Q4K: dot_q4's int16 pair
  // sums finished by pmaddwd against the row's scale in both halves of its lane (finish_q4 with
  // the scale for 1); the mins as 8 int16 pairs.
  static constexpr int TBK = 3, NPK_GEMV = 2;
  static ireg load_sc(const uint8_t* p) {
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
  }
  static ireg scale_dot(ireg dot, ireg sc) { return _mm256_madd_epi16(dot, sc); }
  static ireg load_mins(const uint8_t* p) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static ireg madd16(ireg a, ireg b) { return _mm256_madd_epi16(a, b); }
  static ireg isub(ireg a, ireg b) { return _mm256_sub_epi32(a, b); }
  static ireg iset1(int32_t v) { return _mm256_set1_epi32(v); }
  // Q6K: rows 8j..8j+7's levels (0..63) at 4 k-steps of group G of a quad (formats.h): the half
  // 32j of its pair's nibble line and of its quad's top-bit line, the top bits shifted to bits 4-5
  // (in 16-bit lanes: what comes from a neighbouring byte is masked off)
  template <int G>
  static ireg load_q6(const uint8_t* ql, const uint8_t* qh, int j) {
    const __m256i n = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * j));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * j));
    const __m256i lo =
        _mm256_and_si256(G % 2 ? _mm256_srli_epi16(n, 4) : n, _mm256_set1_epi8(0x0f));
    const __m256i top = G == 0   ? _mm256_slli_epi16(h, 4)
                        : G == 1 ? _mm256_slli_epi16(h, 2)
                        : G == 2 ? h
                                 : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
  }
  // levels (0..63) times x: pairs are at most 2 * 63 * 127 (no saturation), widened at once
  static ireg dot_q6(ireg acc, ireg w, ireg x) {
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
  static ireg load_sc8(const int8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static ireg mullo(ireg a, ireg b) { return _mm256_mullo_epi32(a, b); }

  // BF16P (simd::matmul_bf16p): two FMAs per pair of k, flushed by MXCSR. Tiles of up to 5 tokens:
  // 5 x 2 sums + weights + a broadcast + the mask; 6 spilled two sums (perf-notes #22).
  static constexpr bool BF16_DOT = false;
  static constexpr int TB_BF16P = 5;
  // 8 rows' bf16 at the even (e = 0) or odd (e = 1) k of a pair, as floats: a 32-bit word holds the
  // even k in its low half, so the odd one is the word with its low half cleared.
  template <int E>
  static reg load_bf16_half(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(E ? _mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u)))
                                 : _mm256_slli_epi32(v, 16));
  }
  // bf16_to_f32(f32_to_bf16_daz(x)) per lane, called under ftz_begin: x * 1 is then x with a
  // subnormal read as zero of its sign (DAZ) and a NaN quiet; + 0x7fff + the lowest kept bit and
  // the low half cleared round to nearest even (a carry into the exponent is the right rounding),
  // except for a NaN, which keeps its upper half. 8 operations where doing DAZ and the NaN's case
  // with integer compares and blends took 14 (the rounding is a pass over each call's activations).
  static reg round_bf16(reg x) {
    reg one = _mm256_set1_ps(1.f);
    asm("" : "+x"(one));  // an opaque 1: the compiler would drop x * 1 as exact
    const reg a = _mm256_mul_ps(x, one);
    const __m256i u = _mm256_castps_si256(a);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    const __m256i inc = _mm256_andnot_si256(nan, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_add_epi32(u, inc), _mm256_set1_epi32(int(0xffff0000u))));
  }
  // MXCSR with FTZ (bit 15) and DAZ (bit 6) set, the previous value returned; and restored. The
  // memory clobbers keep loads after the first and stores before the second (the compiler does not
  // know that MXCSR changes what float operations compute).
  static unsigned ftz_begin() {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    asm volatile("" ::: "memory");
    return csr;
  }
  static void ftz_end(unsigned csr) {
    asm volatile("" ::: "memory");
    _mm_setcsr(csr);
  }
  static void pin_reg(reg& a) { asm volatile("" : "+v"(a)); }

  template <WType T>
  static reg load_w(const void* w, size_t i) {
    if constexpr (T == WType::F32) {
      return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    } else {
      __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
      if constexpr (T == WType::BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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
