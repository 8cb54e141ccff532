// perf-notes #22: the BF16P tiles (and BF16 for comparison) kept out of line, for llvm-mca. Copied
// beside avx512.cpp and compiled with its flags (see the note).
#include "avx512.cpp"
namespace kwker {
void* volatile keep512[] = {
    (void*)&simd::bf16p_tile<Avx512, 6, 4>,
    (void*)&simd::bf16p_tile<Avx512, 5, 4>,
    (void*)&simd::bf16p_tile<Avx512, 4, 4>,
    (void*)&simd::bf16p_tile<Avx512, 3, 4>,
    (void*)&simd::bf16p_tile<Avx512, 2, 4>,
    (void*)&simd::bf16p_tile<Avx512, 8, 3>,
    (void*)&simd::bf16p_tile<Avx512, 12, 2>,
    (void*)&simd::bf16p_tile<Avx512, 8, 2>,
    (void*)&simd::bf16p_tile<Avx512, 12, 1>,
    (void*)&simd::bf16p_tile<Avx512, 7, 4>,
    (void*)&simd::bf16p_tile<Avx512, 1, 8>,
    (void*)&simd::bf16p_tile<Avx512, 1, 4>,
    (void*)&simd::matmul_tile<Avx512, WType::BF16, 12, 1>,
    (void*)&simd::matmul_tile<Avx512, WType::BF16, 2, 2>,
    (void*)&simd::matmul_tile<Avx512, WType::BF16, 1, 8>,
};
}
