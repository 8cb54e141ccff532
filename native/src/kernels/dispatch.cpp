// Picks the kernel table once: the best ISA the CPU has, or the one KWKER_ISA forces (for tests and
// benches). "avx512-emulated" (the AVX-512 source on SIMDe, any x86-64 CPU) exists only in builds
// that found SIMDe and is only ever forced.
#include <stdexcept>

#include "cpu_features.h"
#include "kernels.h"

namespace kwker {

bool isa_supported(const std::string& isa) {
  const CpuFeatures& cpu = cpu_features();
  if (isa == "generic") return true;
  if (isa == "avx2") return cpu.avx2 && cpu.fma && cpu.f16c;
  if (isa == "avx512")  // AVX512_BF16 is optional: the table has a kernel for CPUs without it
    return isa_supported("avx2") && cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq &&
           cpu.avx512vnni;
#ifdef KWKER_AVX512_EMULATED
  if (isa == "avx512-emulated")
    return isa_supported("avx2");  // SIMDe builds on the AVX2 intrinsics
#endif
  return false;
}

std::string isa_best() {
  for (const char* isa : {"avx512", "avx2"})
    if (isa_supported(isa)) return isa;
  return "generic";
}

const Kernels& kernels_select(const std::string& forced) {
  const std::string isa = forced.empty() ? isa_best() : forced;
  if (isa != "generic" && isa != "avx2" && isa != "avx512" && isa != "avx512-emulated")
    throw std::invalid_argument("unknown ISA '" + isa +
                                "' (KWKER_ISA takes generic, avx2, avx512 or avx512-emulated)");
  if (!isa_supported(isa))
    throw std::runtime_error(isa == "avx512-emulated"
                                 ? "this build has no avx512-emulated kernels (SIMDe not found)"
                                 : "this CPU does not support the ISA '" + isa + "'");
  if (isa == "avx512") return kernels_avx512();
#ifdef KWKER_AVX512_EMULATED
  if (isa == "avx512-emulated") return kernels_avx512_emulated();
#endif
  if (isa == "avx2") return kernels_avx2();
  return kernels_generic();
}

}  // namespace kwker
