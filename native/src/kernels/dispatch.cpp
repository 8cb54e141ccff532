// Picks the kernel table once: the best ISA the CPU has, or the one KWKER_ISA forces (for tests and benches).
#include <stdexcept>

#include "kernels.h"

namespace kwker {

bool isa_supported(const std::string& isa) {
  __builtin_cpu_init();
  if (isa == "generic") return true;
  if (isa == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == "avx512")
    return isa_supported("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  return false;
}

std::string isa_best() {
  for (const char* isa : {"avx512", "avx2"})
    if (isa_supported(isa)) return isa;
  return "generic";
}

const Kernels& kernels_select(const std::string& forced) {
  const std::string isa = forced.empty() ? isa_best() : forced;
  if (isa != "generic" && isa != "avx2" && isa != "avx512")
    throw std::invalid_argument("unknown ISA '" + isa + "' (KWKER_ISA takes generic, avx2 or avx512)");
  if (!isa_supported(isa)) throw std::runtime_error("this CPU does not support the ISA '" + isa + "'");
  if (isa == "avx512") return kernels_avx512();
  if (isa == "avx2") return kernels_avx2();
  return kernels_generic();
}

}  // namespace kwker
