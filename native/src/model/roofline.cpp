#include "roofline.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "../kernels/kernels.h"
#include "buffer.h"
#include "threadpool.h"

namespace kwker {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The sum of n floats (n a multiple of kReadStreams * 32), read as kReadStreams contiguous parts
// side by side: the hardware prefetcher follows each part, and more streams in flight read faster
// than one, as the GEMV's panel streams do (streaming_tiles; perf-notes #5).
constexpr int kReadStreams = 8;

__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  const size_t part = n / kReadStreams;
  __m256 a[kReadStreams][2];
#pragma GCC unroll 16
  for (int j = 0; j < kReadStreams; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();
  for (size_t i = 0; i < part; i += 16)
#pragma GCC unroll 16
    for (int j = 0; j < kReadStreams; j++) {
      a[j][0] = _mm256_add_ps(a[j][0], _mm256_load_ps(p + j * part + i));
      a[j][1] = _mm256_add_ps(a[j][1], _mm256_load_ps(p + j * part + i + 8));
    }
  __m256 s = _mm256_setzero_ps();
#pragma GCC unroll 16
  for (int j = 0; j < kReadStreams; j++) s = _mm256_add_ps(s, _mm256_add_ps(a[j][0], a[j][1]));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

float sum_scalar(const float* p, size_t n) {
  float s = 0.f;
  for (size_t i = 0; i < n; i += 16) s += p[i];
  return s;
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) {
  __m256 a[12];
  for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps(float(j));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (long i = 0; i < iters; i++)
    for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], b, c);
  float out[8];
  __m256 s = a[0];
  for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, a[j]);
  _mm256_storeu_ps(out, s);
  return out[0];
}

// Integer multiply-accumulates of u8 x s8 as the quantized kernels do them, 12 independent
// accumulators: AVX2 vpmaddubsw + vpaddw (32 MACs per pair, int16 sums), AVX-512 VNNI vpdpbusd (64
// MACs, int32 sums). Eight chains: with more, GCC spills the AVX2 accumulators.
constexpr int kIntChains = 8;

__attribute__((target("avx2"))) int int8_loop_avx2(long iters) {
  __m256i a[kIntChains];
#pragma GCC unroll 16
  for (int j = 0; j < kIntChains; j++) a[j] = _mm256_set1_epi16(short(j));
  __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-1);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int j = 0; j < kIntChains; j++) {
      asm("" : "+x"(x));  // an opaque input: every product is computed (not shared or hoisted)
      a[j] = _mm256_add_epi16(a[j], _mm256_maddubs_epi16(w, x));
      asm("" : "+x"(a[j]));
    }
  }
  __m256i s = a[0];
#pragma GCC unroll 16
  for (int j = 1; j < kIntChains; j++) s = _mm256_add_epi16(s, a[j]);
  return _mm256_extract_epi16(s, 0);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int int8_loop_avx512(long iters) {
  __m512i a[kIntChains];
#pragma GCC unroll 16
  for (int j = 0; j < kIntChains; j++) a[j] = _mm512_set1_epi32(j);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-1);
  for (long i = 0; i < iters; i++) {
    asm("" : "+v"(w), "+v"(x));
#pragma GCC unroll 16
    for (int j = 0; j < kIntChains; j++) a[j] = _mm512_dpbusd_epi32(a[j], w, x);
  }
  __m512i s = a[0];
#pragma GCC unroll 16
  for (int j = 1; j < kIntChains; j++) s = _mm512_add_epi32(s, a[j]);
  return _mm512_reduce_add_epi32(s);
}

}  // namespace

double measure_read_bandwidth(size_t bytes, int n_threads, int repeats) {
  const size_t n = bytes / sizeof(float) / (32 * kReadStreams) * (32 * kReadStreams);
  Buffer buf(n * sizeof(float), true);  // huge pages, as the weights have
  float* p = buf.as<float>();
  for (size_t i = 0; i < n; i++) p[i] = 1.f;
  const bool avx2 = isa_supported("avx2");
  ThreadPool pool(n_threads);
  std::atomic<float> sink{0.f};
  double best = 0;
  for (int r = 0; r < repeats; r++) {
    auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int tid) {
      auto [b, e] = pool.split(int(n / (32 * kReadStreams)), tid);
      const float* q = p + size_t(b) * 32 * kReadStreams;
      const size_t len = size_t(e - b) * 32 * kReadStreams;
      sink.store(avx2 ? sum_avx2(q, len) : sum_scalar(q, len), std::memory_order_relaxed);
    });
    best = std::max(best, n * sizeof(float) / seconds_since(t0) / 1e9);
  }
  return best;
}

namespace {

// Best rate, in G operations per second, of every thread of an n_threads pool running `loop` (which
// does `ops` operations and returns a value kept from the optimizer), over 5 runs: the machine may
// be shared.
template <class Loop>
double best_rate(int n_threads, double ops, const Loop& loop) {
  ThreadPool pool(n_threads);
  std::atomic<float> sink{0.f};
  double best = 0;
  for (int r = 0; r < 5; r++) {
    auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int) { sink.store(float(loop()), std::memory_order_relaxed); });
    best = std::max(best, n_threads * ops / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace

double measure_fma_peak(int n_threads) {
  if (!isa_supported("avx2")) return 0.0;
  const long iters = 20'000'000;
  return best_rate(n_threads, double(iters) * 12 * 8 * 2, [&] { return fma_loop_avx2(iters); });
}

double measure_int8_peak(int n_threads) {
  const bool avx512 = isa_supported("avx512");
  if (!avx512 && !isa_supported("avx2")) return 0.0;
  const long iters = 10'000'000;
  return best_rate(n_threads, double(iters) * kIntChains * (avx512 ? 64 : 32),
                   [&] { return avx512 ? int8_loop_avx512(iters) : int8_loop_avx2(iters); });
}

}  // namespace kwker
