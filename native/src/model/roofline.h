// Measurements of this machine's limits for `kwker bench`: read bandwidth and fused multiply-add
// peak, both run on the same thread pool as the decode step.
#pragma once

#include <cstddef>

namespace kwker {

// Best GB/s of reading a buffer of `bytes` (touched first) with n_threads, over `repeats` passes.
double measure_read_bandwidth(size_t bytes, int n_threads, int repeats);
// Best GFLOP/s of float32 FMAs with independent accumulators in registers, n_threads.
double measure_fma_peak(int n_threads);
// Best G multiply-accumulates/s of int8 dot products (u8 x s8) with the best ISA's instruction
// (AVX2 vpmaddubsw, AVX-512 VNNI vpdpbusd), accumulators in registers, n_threads: the ceiling of
// the quantized kernels.
double measure_int8_peak(int n_threads);

}  // namespace kwker
