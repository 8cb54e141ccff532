// The native core checked without Python, for builds that have no Python to load the module into
// (the Windows cross-build: scripts/cross_build_windows.sh). Every ISA this CPU runs must give the
// portable kernels' bits for the products of every weight format, and a row computed alone must
// equal the same row inside a multi-row call; the products go through the system layer (weights in
// huge-page mappings, scratch on the aligned heap, a two-thread pool). Prints what it checked and
// exits 1 at the first difference.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../src/kernels/canonical.h"
#include "../src/kernels/cpu_features.h"
#include "../src/kernels/kernels.h"
#include "../src/model/buffer.h"
#include "../src/model/threadpool.h"

namespace kwker {
namespace {

constexpr int kRows = 7, kCols = 129, kOut = 37;  // awkward sizes: padding in every direction

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = float(int32_t(seed >> 8) - (1 << 23)) / float(1 << 23);
  }
  return v;
}

// The weights of type t as pack_panels takes them: float32, or bf16 / fp16 bits.
std::vector<uint8_t> weight_source(WType t, const std::vector<float>& w) {
  const bool halves = t == WType::BF16 || t == WType::F16 || t == WType::BF16P;
  std::vector<uint8_t> out(w.size() * (halves ? 2 : 4));
  for (size_t i = 0; i < w.size(); i++) {
    if (!halves) {
      std::memcpy(&out[i * 4], &w[i], 4);
      continue;
    }
    const uint16_t h = t == WType::F16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
    std::memcpy(&out[i * 2], &h, 2);
  }
  return out;
}

// Rows [r0, r0 + m) of x w^T on the kernels of `isa`, each row's kOut outputs.
std::vector<float> product(const std::string& isa, WType t, const std::vector<float>& x, int r0,
                           int m, const std::vector<uint8_t>& w_src, ThreadPool& pool) {
  const Kernels& kern = kernels_select(isa);
  const int kp = pad_to(kCols), np = pad_to(kOut, kPanel);
  Buffer w(panel_bytes(t, kOut, kCols), /*huge_pages=*/true);
  pack_panels(w_src.data(), t, kOut, kCols, w.as<void>());
  Buffer xs(sizeof(float) * (size_t(m) * kp + kPad)), ys(sizeof(float) * size_t(m) * np);
  for (int r = 0; r < m; r++)
    std::memcpy(xs.as<float>() + size_t(r) * kp, &x[size_t(r0 + r) * kCols], 4 * kCols);
  std::vector<int8_t> q(size_t(m) * kp);
  std::vector<float> d(size_t(m) * kp / kQBlock), dsum(d.size());
  if (wtype_quantized(t)) kern.quantize(xs.as<float>(), m, kp, kp, q.data(), d.data(), dsum.data());
  pool.run([&](int tid) {
    auto [p0, p1] = pool.split(np / kPanel, tid);
    if (p0 >= p1) return;
    if (wtype_quantized(t))
      kern.qmatmul[int(t) - int(WType::Q8)](QRows{q.data(), d.data(), dsum.data()}, m, w.as<void>(),
                                            kp, p0, p1, ys.as<float>(), np, nullptr, false);
    else
      kern.matmul[int(t)](xs.as<float>(), m, kp, w.as<void>(), kp, p0, p1, ys.as<float>(), np,
                          nullptr, false);
  });
  std::vector<float> y(size_t(m) * kOut);
  for (int r = 0; r < m; r++)
    std::memcpy(&y[size_t(r) * kOut], ys.as<float>() + size_t(r) * np, 4 * kOut);
  return y;
}

// The CPU's FMA instruction: the oracle for fma_exact, the reference kernels' fma on Windows.
__attribute__((target("fma"))) float fma_cpu(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fma_exact against the instruction: random triples whose products span the float range, with
// addends that cancel the product or are tiny (subnormal results), and triples built to fall just
// short of halfway between two floats, where a product rounded to double first lands on the tie
// (c + ulp(c) / 2 * (1 - k^2 2^-46): a double rounding gives the even neighbour, half the time the
// wrong one). Returns the number of results that differ in any bit.
int fma_mismatches(int n) {
  uint32_t state = 7;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  auto number = [&](int lo, int hi) {  // random sign and mantissa, exponent in [lo, hi]
    const uint32_t r = next(), e = uint32_t(lo + int(next() % uint32_t(hi - lo + 1)) + 127);
    return from_bits((r & 0x80000000u) | (e << 23) | (next() & 0x7fffffu));
  };
  int bad = 0;
  for (int i = 0; i < n; i++) {
    float a = number(-70, 60), b = number(-70, 60), c;
    switch (i % 5) {
      case 0:
        c = number(-70, 60);
        break;
      case 1:
        c = -a * b;
        break;  // leaves the product's rounding error
      case 2:
        c = -a * b * (1.f + from_bits(0x34000000u) * float(next() % 8));
        break;
      case 3:
        c = from_bits(next() & 0x807fffffu);
        break;  // a subnormal
      default: {
        c = number(-60, 60);
        const float k = float(1 + next() % 64) * 0x1p-23f;
        a = 1.f + k;
        b = (1.f - k) * (std::nextafter(std::fabs(c), INFINITY) - std::fabs(c)) * 0.5f;
        if (c < 0) a = -a;
      }
    }
    const float want = fma_cpu(a, b, c), got = fma_exact(a, b, c);
    if (std::memcmp(&want, &got, 4) != 0 && !(std::isnan(want) && std::isnan(got))) bad++;
  }
  return bad;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

}  // namespace
}  // namespace kwker

int main() {
  using namespace kwker;
  const CpuFeatures& cpu = cpu_features();
  std::printf("cpu: avx2 %d fma %d f16c %d avx512 f %d bw %d vl %d dq %d vnni %d bf16 %d\n",
              cpu.avx2, cpu.fma, cpu.f16c, cpu.avx512f, cpu.avx512bw, cpu.avx512vl, cpu.avx512dq,
              cpu.avx512vnni, cpu.avx512bf16);
  std::printf("best isa: %s\n", isa_best().c_str());
  if (cpu.fma) {
    const int n = 1 << 20, bad = fma_mismatches(n);
    std::printf("fma_exact: %d of %d results differ from the FMA instruction's\n", bad, n);
    if (bad) return 1;
  }
  const WType types[] = {WType::F32, WType::BF16, WType::F16, WType::Q8, WType::Q4, WType::BF16P};
  const std::vector<float> x = random_floats(size_t(kRows) * kCols, 1);
  const std::vector<float> w = random_floats(size_t(kOut) * kCols, 2);
  ThreadPool pool(2);
  int checked = 0;
  for (const char* isa : {"generic", "avx2", "avx512", "avx512-emulated"}) {
    if (!isa_supported(isa)) continue;
    for (WType t : types) {
      const std::vector<uint8_t> src = weight_source(t, w);
      const std::vector<float> all = product(isa, t, x, 0, kRows, src, pool);
      if (!same_bits(all, product("generic", t, x, 0, kRows, src, pool))) {
        std::printf("FAIL: %s %s differs from generic\n", isa, format(t).name);
        return 1;
      }
      for (int r = 0; r < kRows; r++) {
        const std::vector<float> row(all.begin() + r * kOut, all.begin() + (r + 1) * kOut);
        if (!same_bits(row, product(isa, t, x, r, 1, src, pool))) {
          std::printf("FAIL: %s %s row %d alone differs from the row in %d\n", isa, format(t).name,
                      r, kRows);
          return 1;
        }
      }
      checked++;
    }
    std::printf("%s: the generic kernels' bits for every format, alone and batched\n", isa);
  }
  std::printf("core check passed: %d products\n", checked);
  return 0;
}
