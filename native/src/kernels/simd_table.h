// One ISA's table of kernels (kernels.h) from the SIMD templates, for avx2.cpp and avx512.cpp.
#pragma once

#include "simd_kernels.h"
#include "simd_kformats.h"

namespace kwker::simd {

template <class V>
Kernels make_kernels(const char* name) {
  return Kernels{name,
                 {matmul<V, WType::F32>, matmul<V, WType::BF16>, matmul<V, WType::F16>, nullptr,
                  nullptr, matmul_bf16p<V>},
                 {nullptr, nullptr, nullptr, qmatmul<V, WType::Q8>, qmatmul<V, WType::Q4>, nullptr,
                  qmatmul_k<V, WType::Q4K>, qmatmul_k<V, WType::Q6K>},
                 quantize<V>,
                 {attend_part<V, float>, attend_part<V, uint16_t>},
                 {glu<V, Activation::Silu>, glu<V, Activation::GeluTanh>},
                 to_f16<V>,
                 softmax_stats<V>,
                 argmax<V>};
}

}  // namespace kwker::simd
