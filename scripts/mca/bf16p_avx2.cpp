// perf-notes #22: the AVX2 BF16P tiles, MXCSR against flushing in code, and BF16 for comparison,
// kept out of line for llvm-mca. Copied beside avx2.cpp and compiled with its flags (see the note).
#include "avx2.cpp"
namespace kwker {
namespace {
// The explicit alternative to MXCSR: every FMA's result flushed in code (and, compare, blend-free
// mask), MXCSR untouched.
struct Avx2Flush : Avx2 {
  static reg fma(reg a, reg b, reg c) {
    const reg r = _mm256_fmadd_ps(a, b, c);
    const reg big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), r),
                                  _mm256_set1_ps(0x1p-126f), _CMP_GE_OQ);
    return _mm256_and_ps(r, big);
  }
  static unsigned ftz_begin() { return 0; }
  static void ftz_end(unsigned) {}
};
}  // namespace
void* volatile keep2[] = {
    (void*)&simd::bf16p_tile<Avx2, 6, 1>,
    (void*)&simd::bf16p_tile<Avx2, 5, 1>,
    (void*)&simd::bf16p_tile<Avx2, 4, 1>,
    (void*)&simd::bf16p_tile<Avx2, 3, 2>,
    (void*)&simd::bf16p_tile<Avx2, 2, 2>,
    (void*)&simd::bf16p_tile<Avx2, 1, 4>,
    (void*)&simd::bf16p_tile<Avx2Flush, 6, 1>,
    (void*)&simd::bf16p_tile<Avx2Flush, 2, 2>,
    (void*)&simd::bf16p_tile<Avx2Flush, 1, 4>,
    (void*)&simd::matmul_tile<Avx2, WType::BF16, 6, 1>,
    (void*)&simd::matmul_tile<Avx2, WType::BF16, 2, 2>,
    (void*)&simd::matmul_tile<Avx2, WType::BF16, 1, 4>,
};
}  // namespace kwker
