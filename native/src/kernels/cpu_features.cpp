#include "cpu_features.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#define KWKER_X86 1
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#endif

namespace kwker {

namespace {

#ifdef KWKER_X86
struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

uint32_t max_leaf() {
#if defined(_MSC_VER) && !defined(__clang__)
  int r[4];
  __cpuid(r, 0);
  return uint32_t(r[0]);
#else
  return __get_cpuid_max(0, nullptr);
#endif
}

// CPUID leaf `leaf`, sub-leaf `sub` (zeros past the highest leaf).
Regs cpuid(uint32_t leaf, uint32_t sub) {
  Regs r;
  if (leaf > max_leaf()) return r;
#if defined(_MSC_VER) && !defined(__clang__)
  int v[4];
  __cpuidex(v, int(leaf), int(sub));
  r = {uint32_t(v[0]), uint32_t(v[1]), uint32_t(v[2]), uint32_t(v[3])};
#else
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
#endif
  return r;
}

// XCR0: which register states the operating system saves on a context switch. Read with the
// instruction itself (GCC and clang offer _xgetbv only in functions compiled for XSAVE); call only
// when CPUID says OSXSAVE.
uint64_t xcr0() {
#if defined(_MSC_VER) && !defined(__clang__)
  return _xgetbv(0);
#else
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
#endif
}

bool bit(uint32_t reg, int i) { return (reg >> i) & 1; }

CpuFeatures detect() {
  CpuFeatures f;
  const Regs l1 = cpuid(1, 0);
  if (!bit(l1.c, 27)) return f;  // no OSXSAVE: no AVX state is saved, and XGETBV would fault
  const uint64_t x = xcr0();
  const bool ymm = (x & 0x6) == 0x6;     // SSE and AVX state
  const bool zmm = (x & 0xe6) == 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm || !bit(l1.c, 28)) return f;  // AVX itself
  const Regs l7 = cpuid(7, 0);
  f.fma = bit(l1.c, 12);
  f.f16c = bit(l1.c, 29);
  f.avx2 = bit(l7.b, 5);
  if (!zmm) return f;
  f.avx512f = bit(l7.b, 16);
  f.avx512dq = bit(l7.b, 17);
  f.avx512bw = bit(l7.b, 30);
  f.avx512vl = bit(l7.b, 31);
  f.avx512vnni = bit(l7.c, 11);
  f.avx512bf16 = l7.a >= 1 && bit(cpuid(7, 1).a, 5);  // sub-leaf 1 exists when EAX of 0 says so
  return f;
}
#else
CpuFeatures detect() { return {}; }  // not x86: the portable kernels only
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace kwker
