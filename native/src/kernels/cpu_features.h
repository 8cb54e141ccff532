// What the CPU and the operating system let the kernels use: read once with CPUID and XGETBV, the
// same way with every compiler (GCC's __builtin_cpu_supports does not exist in MSVC, and clang-cl's
// needs a runtime library that Windows links do not bring).
#pragma once

namespace kwker {

// A feature counts only if the CPU has it AND the operating system saves the registers it uses
// (XCR0): the YMM state for AVX2, FMA and F16C; also the opmask and ZMM states for AVX-512.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
};

// This machine's (computed on first use). Compiled with the baseline flags: safe on any x86-64 CPU.
const CpuFeatures& cpu_features();

}  // namespace kwker
