// The SIMD kernels, written once over a vector-traits class V and instantiated per ISA (avx2.cpp,
// avx512.cpp).
//
// V provides:
//   reg, W (floats per register), TB (tokens per register tile in the multi-row matmul), NP_GEMV
//   (panels per tile when m == 1), FEW_ROWS (the most rows of the few-row float tiles, 0: none);
//   zero, load, store, set1, fma, add, mul, div, sub, min, max,
//   round, pow2i, hmax, hsum (a fixed reduction tree), exp; load_w<WType> (W float-format weights
//   as floats), load_f16 (W fp16 values), store_f16 (W floats as fp16, rounded to nearest even);
//   for the quantized formats an integer register ireg of W int32 lanes (one per output row): TBQ,
//   TBQ4 (Q4) and NPQ_GEMV (tile shapes), izero, cvt (int32 -> float), bcast4 (4 activation bytes
//   to every lane), load_qw<WType>(group, j) (the 4 k-steps of W rows of a weight group: Q8 as
//   int8, Q4 as its unsigned nibbles), store_qw (such a register as bytes), abs8, dot_q8(acc, |w|,
//   w, x) and dot_q4(acc, w, x) (exact integer dot products of 4 k-steps into the lane), finish_q4
//   (to int32 lanes); for the K formats (simd_kformats.h) TBK and NPK_GEMV (tile shapes), iadd,
//   isub, iset1, madd16 (pmaddwd), mullo (int32 products), load_sc (a Q4K sub-block's W scales,
//   as scale_dot(dot_q4's sums, scales) takes them), load_mins (W rows' int16 pairs of Q4K mins),
//   load_q6 (a Q6K group's 6-bit levels, as load_qw), dot_q6 (into int32 lanes) and load_sc8 (W
//   int8 scales as int32).
//
// Batch invariance: see kernels.h. The matmul keeps one lane per output element, a chain of FMAs
// over k (float formats) or over blocks (quantized) in order; the attention keeps one register
// chain per (query, key) dot product and per output column.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "canonical.h"
#include "kernels.h"

namespace kwker::simd {

// Every element of a register tile set to v.
template <class R, int A, int B>
inline void fill(R (&a)[A][B], R v) {
#pragma GCC unroll 16
  for (int i = 0; i < A; i++)
#pragma GCC unroll 16
    for (int j = 0; j < B; j++) a[i][j] = v;
}

// y[t, n] (+)= acc[t] + bias: the epilogue of every tile. Register j holds outputs n = (p + (j /
// RP) * ps) * kPanel + (j % RP) * W: its panel's (panels p, p + ps, p + 2 ps, ...) W outputs.
template <class V, int TB, int J>
inline void store_tile(typename V::reg (&acc)[TB][J], float* y, int ldy, int p, int ps,
                       const float* bias, bool accumulate) {
  constexpr int RP = kPanel / V::W;
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++) {
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) {
      const size_t n = size_t(p + j / RP * ps) * kPanel + (j % RP) * V::W;
      float* yr = y + size_t(t) * ldy + n;
      typename V::reg r = acc[t][j];
      if (bias) r = V::add(r, V::load(bias + n));
      if (accumulate) r = V::add(V::load(yr), r);
      V::store(yr, r);
    }
  }
}

// Multi-row float tiles ask for their panels' weights kPrefetchAhead bytes ahead of the line they
// read, one request per cache line: with two rows or more, each line takes long enough to compute
// on that the hardware prefetcher alone leaves a single panel stream well below the core's
// bandwidth, compute and memory taking turns (perf-notes #24; 4 KB ahead measured at least as
// fast as 8 KB on Zen 3 and Zen 4, #26). Into L2, which left the rows' activations in L1: 10%
// faster bf16-dot verify steps on Zen 4 (#47). One-row tiles stream NP_GEMV panels at once and
// lose time with it; the AVX2 quantized tiles ask for the next panel's block.
constexpr size_t kPrefetchAhead = 4096;
inline void prefetch_ahead(const void* at) {
  __builtin_prefetch(static_cast<const char*>(at) + kPrefetchAhead, 0, 2);
}

// A register tile: TB tokens x NP panels (NP * kPanel outputs), the panels p, p + ps, ... Per k:
// the panels' weights are loaded once, each token's x[t, k] is broadcast, and every accumulator
// takes one fused multiply-add (an outer product).
template <class V, WType T, int TB, int NP>
inline void matmul_tile(const float* x, int ldx, const void* w, int kp, int p, int ps, float* y,
                        int ldy, const float* bias, bool accumulate) {
  using R = typename V::reg;
  constexpr int RP = kPanel / V::W;                               // registers per panel
  constexpr size_t k_bytes = kPanel * (T == WType::F32 ? 4 : 2);  // a panel's weights per k
  R acc[TB][NP * RP];
  fill(acc, V::zero());
  for (int k = 0; k < kp; k++) {
    if constexpr (TB > 1) {
      if (k * k_bytes % 64 == 0) {
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
          prefetch_ahead(static_cast<const char*>(w) + (size_t(p + q * ps) * kp + k) * k_bytes);
      }
    }
    R wv[NP * RP];
#pragma GCC unroll 16
    for (int j = 0; j < NP * RP; j++)
      wv[j] =
          V::template load_w<T>(w, (size_t(p + j / RP * ps) * kp + k) * kPanel + (j % RP) * V::W);
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++) {
      R xb = V::set1(x[size_t(t) * ldx + k]);
#pragma GCC unroll 16
      for (int j = 0; j < NP * RP; j++) acc[t][j] = V::fma(xb, wv[j], acc[t][j]);
    }
  }
  store_tile<V, TB, NP * RP>(acc, y, ldy, p, ps, bias, accumulate);
}

// The same tile for quantized weights on quantized activations: per block, exact integer dot
// products of every (token, row) in int32 lanes, then one FMA per output with the product of the
// two scales. Not inlined: inlined into qmatmul, the tiles of 2, 3 and 1 row of a multi-row call
// were compiled with their sums spilled, at half the speed (perf-notes #11). Those are the sizes of
// speculative verify steps.
//
// Unpacked (U): the panels are Q4 unpacked to a byte per weight (unpack_q4_panel), read as Q8's
// groups are.
template <class V, WType T, int TB, int NP, bool U = false>
__attribute__((noinline)) void qmatmul_tile(const QRows& x, int kp, const uint8_t* base, int p,
                                            int ps, float* y, int ldy, const float* bias,
                                            bool accumulate) {
  using R = typename V::reg;
  using I = typename V::ireg;
  constexpr int RP = kPanel / V::W, J = NP * RP;
  constexpr WType LT = U ? WType::Q8 : T;  // the layout of the groups
  constexpr size_t group_bytes = qgroup_bytes(LT),
                   block_bytes = qheader_bytes(T) + group_bytes * kQBlock / kQGroup;
  const int nb = kp / kQBlock;
  const size_t panel_stride = size_t(nb) * block_bytes;
  // The float accumulators live in L1 between blocks (one load and store per block): held in
  // registers, they crowd out the integer dot products of the hot loop, which the compiler then
  // spills on every group.
  alignas(64) float accm[TB][J * V::W];
  for (int t = 0; t < TB; t++)
    for (int j = 0; j < J; j++) V::store(&accm[t][j * V::W], V::zero());
  for (int b = 0; b < nb; b++) {
    const uint8_t* blk[NP];
#pragma GCC unroll 16
    for (int q = 0; q < NP; q++)
      blk[q] = base + size_t(q) * ps * panel_stride + size_t(b) * block_bytes;
    I dot[TB][J];
    fill(dot, V::izero());
    const int8_t* xb = x.q + size_t(b) * kQBlock;
    // Multi-row tiles are compute-heavy enough that the hardware prefetcher alone leaves the next
    // panel's fetch to start when it is needed, so memory and compute take turns: ask for the next
    // panel's block now (perf-notes #12; no gain for one row, or for floats).
    if constexpr (TB > 1 && !U) {
      const uint8_t* next = base + NP * panel_stride + size_t(b) * block_bytes;
#pragma GCC unroll 8
      for (size_t o = 0; o < block_bytes; o += 64) __builtin_prefetch(next + o);
    }
#pragma GCC \
    unroll 1  // unrolled, GCC reassociates the integer sums into a tree and spills every product
    for (int g = 0; g < kQBlock / kQGroup; g++) {
      I wv[J], wa[J];
#pragma GCC unroll 16
      for (int j = 0; j < J; j++) {
        wv[j] = V::template load_qw<LT>(blk[j / RP] + qheader_bytes(T) + g * group_bytes, j % RP);
        if constexpr (T == WType::Q8) wa[j] = V::abs8(wv[j]);
      }
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const I xv = V::bcast4(xb + size_t(t) * kp + g * kQGroup);
#pragma GCC unroll 16
        for (int j = 0; j < J; j++) {
          if constexpr (T == WType::Q8)
            dot[t][j] = V::dot_q8(dot[t][j], wa[j], wv[j], xv);
          else
            dot[t][j] = V::dot_q4(dot[t][j], wv[j], xv);
        }
      }
      // Pin the sums to registers once per group: without it GCC copies each through spare
      // registers (or the stack) on every group (perf-notes #13).
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
        for (int j = 0; j < J; j++) V::pin(dot[t][j]);
    }
    // Per row register: its scales (and mins) meet every token's sums (loaded here, not all at
    // once: held across the tile they would be spilled).
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) {
      const uint16_t* header = reinterpret_cast<const uint16_t*>(blk[j / RP]) + (j % RP) * V::W;
      const R dw = V::load_f16(header);
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const size_t xi = size_t(t) * nb + b;
        I d = dot[t][j];
        if constexpr (T == WType::Q4) d = V::finish_q4(d);
        R a = V::fma(V::mul(dw, V::set1(x.d[xi])), V::cvt(d), V::load(&accm[t][j * V::W]));
        if constexpr (T == WType::Q4)  // the min's term
          a = V::fma(V::load_f16(header + kPanel), V::set1(x.dsum[xi]), a);
        V::store(&accm[t][j * V::W], a);
      }
    }
    asm volatile("" ::: "memory");  // keep accm in memory across blocks
  }
  R acc[TB][J];
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) acc[t][j] = V::load(&accm[t][j * V::W]);
  store_tile<V, TB, J>(acc, y, ldy, p, ps, bias, accumulate);
}

// The VNNI GEMM tile (V::VNNI, AVX-512), for two rows or more: TB tokens x NP consecutive panels
// (one register per panel). Per group, each panel's weights are loaded once and meet every token's
// broadcast: TB x NP independent vpdpbusd chains, the loads and the Q4 unpacking shared by TB
// tokens, the broadcast by NP panels, where qmatmul_tile's AVX-512 tiles of 12 x 1 paid a broadcast
// per vpdpbusd (perf-notes #21). Its outputs are qmatmul_tile's, bit for bit: the same exact
// integer dot product per (token, row, block), then the same FMAs per block, in block order. Q8's
// signed weights meet the activations plus 128 (x ^ 0x80) as the unsigned operand, and 128 times
// the weights' sum (one vpdpbusd per weight register, shared by the tile's tokens) is taken off
// the integer sum before it is converted: the same integer, without a sign fix per product.
template <class V, WType T, int TB, int NP>
__attribute__((noinline)) void vnni_tile(const QRows& x, int kp, const uint8_t* base,
                                         size_t panel_stride, int p, float* y, int ldy,
                                         const float* bias, bool accumulate) {
  using R = typename V::reg;
  using I = typename V::ireg;
  static_assert(kPanel == V::W, "one register per panel");
  constexpr size_t hb = qheader_bytes(T), gb = qgroup_bytes(T), block_bytes = qblock_bytes(T);
  const int nb = kp / kQBlock;
  // The float accumulators live in L1 between blocks, as in qmatmul_tile.
  alignas(64) float accm[TB][NP * V::W];
  for (int t = 0; t < TB; t++)
    for (int j = 0; j < NP; j++) V::store(&accm[t][j * V::W], V::zero());
  const I c80 = V::iset1(int32_t(0x80808080u));
  for (int b = 0; b < nb; b++) {
    const uint8_t* blk = base + size_t(b) * block_bytes;  // panel j's: + j * panel_stride
    // The next tile's panels' block, into L2 (perf-notes #47; into L1, as qmatmul_tile does, it
    // made 2-6 row steps 5-14% slower on Zen 4, #26)
#pragma GCC unroll 4
    for (int j = NP; j < 2 * NP; j++)
#pragma GCC unroll 8
      for (size_t o = 0; o < block_bytes; o += 64)
        __builtin_prefetch(blk + j * panel_stride + o, 0, 2);
    const int8_t* xb = x.q + size_t(b) * kQBlock;
    I dot[TB][NP], wsum[NP];
    fill(dot, V::izero());
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++) wsum[j] = V::izero();
#pragma GCC unroll 1  // (see qmatmul_tile)
    for (int g = 0; g < kQBlock / kQGroup; g++) {
      I wv[NP];
#pragma GCC unroll 4
      for (int j = 0; j < NP; j++) {
        wv[j] = V::template load_qw<T>(blk + j * panel_stride + hb + g * gb, 0);
        if constexpr (T == WType::Q8) wsum[j] = V::dpbusd(wsum[j], c80, wv[j]);
      }
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const int8_t* xg = xb + size_t(t) * kp + g * kQGroup;
        if constexpr (T == WType::Q8) {
          const I xv = V::bcast4_u8(xg, c80);
#pragma GCC unroll 4
          for (int j = 0; j < NP; j++) dot[t][j] = V::dpbusd(dot[t][j], xv, wv[j]);
        } else {
          const I xv = V::bcast4(xg);
#pragma GCC unroll 4
          for (int j = 0; j < NP; j++) dot[t][j] = V::dpbusd(dot[t][j], wv[j], xv);
        }
      }
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++) V::pin(dot[t][j]);
      if constexpr (T == WType::Q8) {
#pragma GCC unroll 4
        for (int j = 0; j < NP; j++) V::pin(wsum[j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++) {
      const uint16_t* header = reinterpret_cast<const uint16_t*>(blk + j * panel_stride);
      const R dw = V::load_f16(header);
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const size_t xi = size_t(t) * nb + b;
        I d = dot[t][j];
        if constexpr (T == WType::Q8) d = V::isub(d, wsum[j]);
        R a = V::fma(V::mul(dw, V::set1(x.d[xi])), V::cvt(d), V::load(&accm[t][j * V::W]));
        if constexpr (T == WType::Q4)  // the min's term
          a = V::fma(V::load_f16(header + kPanel), V::set1(x.dsum[xi]), a);
        V::store(&accm[t][j * V::W], a);
      }
    }
    asm volatile("" ::: "memory");  // keep accm in memory across blocks
  }
  R acc[TB][NP];
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++)
#pragma GCC unroll 4
    for (int j = 0; j < NP; j++) acc[t][j] = V::load(&accm[t][j * V::W]);
  store_tile<V, TB, NP>(acc, y, ldy, p, 1, bias, accumulate);
}

template <int N>
using Int = std::integral_constant<int, N>;

// Calls f(Int<ROWS>{}) for the runtime value rows (1 <= rows <= TB), so that a tile of exactly
// `rows` tokens keeps as many independent chains as it has tokens (short steps: speculative verify,
// prefill tails).
template <int TB, class F>
inline void with_rows(int rows, const F& f) {
  if constexpr (TB > 0) {
    if (rows == TB) return f(Int<TB>{});
    with_rows<TB - 1>(rows, f);
  }
}

// Tokens per cache block in the multi-row path: a block of x rows stays in cache while the panels
// stream by.
constexpr int kRowBlock = 48;

// Tiles of R rows and NP panels for panels [p0, p1) when the weights stream by once (one or two
// rows): a tile takes panels s apart (s = (p1 - p0) / NP), so each of its NP panel streams runs
// through a contiguous NP-th of the range instead of one panel. The hardware prefetcher then
// follows NP long streams (perf-notes #14); the panels left over take tiles of one.
template <int R, int NP, class Tile>
inline void streaming_tiles(int p0, int p1, const Tile& tile) {
  const int s = (p1 - p0) / NP;
  for (int i = 0; i < s; i++) tile(Int<R>{}, Int<NP>{}, 0, p0 + i, s);
  for (int p = p0 + s * NP; p < p1; p++) tile(Int<R>{}, Int<1>{}, 0, p, 1);
}

// The tiling shared by the float and quantized matmuls: tile(Int<ROWS>, Int<NP>, t, p, ps) computes
// rows [t, t + ROWS) against panels p, p + ps, ..., p + (NP - 1) ps. One row: NPV panels per tile
// (enough chains to hide latency); two rows: NP2 (1: the general case). More rows: blocks of
// kRowBlock rows, each split into balanced tiles of at most TB rows (8 rows: 4 + 4, not 6 + 2, so
// the weights a tile loads serve more rows), for every panel. panel(p, tiles) is called before the
// tiles of each panel of a row block.
template <int TB, int NPV, int NP2, class Tile, class Panel>
inline void for_each_tile(int m, int p0, int p1, const Tile& tile, const Panel& panel) {
  if (m == 1) return streaming_tiles<1, NPV>(p0, p1, tile);
  if constexpr (NP2 > 1) {
    if (m == 2) return streaming_tiles<2, NP2>(p0, p1, tile);
  }
  for (int m0 = 0; m0 < m; m0 += kRowBlock) {
    const int mc = std::min(kRowBlock, m - m0);
    const int tiles = (mc + TB - 1) / TB;
    for (int p = p0; p < p1; p++) {
      panel(p, tiles);
      for (int i = 0, t = m0; i < tiles; i++) {
        const int rows = mc / tiles + (i < mc % tiles ? 1 : 0);
        with_rows<TB>(rows, [&](auto r) { tile(r, Int<1>{}, t, p, 1); });
        t += rows;
      }
    }
  }
}

template <class V, WType T>
void matmul(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1, float* y,
            int ldy, const float* bias, bool accumulate) {
  auto tile = [&](auto rows, auto np, int t, int p, int ps) {
    matmul_tile<V, T, decltype(rows)::value, decltype(np)::value>(
        x + size_t(t) * ldx, ldx, w, kp, p, ps, y + size_t(t) * ldy, ldy, bias, accumulate);
  };
  // 3 to FEW_ROWS rows of a 2-byte format (speculative verify steps): one tile of all the rows x
  // up to 4 consecutive panels (at most 24 accumulators). A tile of a few rows x 1 panel has few
  // FMA chains; here each row's broadcast also serves several panels. Not for F32: its steps of a
  // few rows are bound by its 4 bytes a weight; its 1-panel tiles measured faster (perf-notes #31).
  if constexpr (V::FEW_ROWS > 0 && T != WType::F32) {
    if (m >= 3 && m <= V::FEW_ROWS) {
      return with_rows<V::FEW_ROWS>(m, [&](auto rows) {
        constexpr int NP = std::min(4, 24 / decltype(rows)::value);
        int p = p0;
        for (; p + NP <= p1; p += NP) tile(rows, Int<NP>{}, 0, p, 1);
        for (; p < p1; p++) tile(rows, Int<1>{}, 0, p, 1);
      });
    }
  }
  // two rows (a verify step of one proposed token): 2 panels per tile (perf-notes #15)
  for_each_tile<V::TB, V::NP_GEMV, 2>(m, p0, p1, tile, [](int, int) {});
}

// BF16P (kernels.h): the activations rounded to bf16, the chain over k in pairs, odd k first. V
// provides BF16_DOT: with it (AVX512_BF16) a pair is one VDPBF16PS, dpbf16(acc, w, x) on the
// rounded pairs that store_bf16 writes; without it (AVX2) two FMAs on bf16 values widened to float
// (load_bf16_half, round_bf16), under MXCSR's FTZ and DAZ (ftz_begin / ftz_end), which flush as
// VDPBF16PS does: MXCSR set and restored once per tile, where flushing in code would cost two or
// three operations per FMA (perf-notes #22).

// The rounded activations as the tiles broadcast them: VDPBF16PS takes bf16 bits (a pair of k per
// 32-bit word), the FMA tiles floats (each a bf16 value).
template <class V>
using Bf16Act = std::conditional_t<V::BF16_DOT, uint16_t, float>;

// Rows [0, rows) of x rounded to bf16 (f32_to_bf16_daz), [rows, kp], in a buffer of the calling
// thread: once per call and row block, so that every panel's tiles reuse them.
template <class V>
const Bf16Act<V>* round_rows_bf16(const float* x, int rows, int ldx, int kp) {
  thread_local std::vector<Bf16Act<V>> buffer;
  if (buffer.size() < size_t(rows) * kp) buffer.resize(size_t(rows) * kp);
  for (int t = 0; t < rows; t++) {
    const float* xt = x + size_t(t) * ldx;
    Bf16Act<V>* out = buffer.data() + size_t(t) * kp;
    if constexpr (V::BF16_DOT) {
      for (int k = 0; k < kp; k += 2 * V::W)
        V::store_bf16(out + k, V::load(xt + k), V::load(xt + k + V::W));
    } else {
      const unsigned csr = V::ftz_begin();  // (round_bf16 reads subnormals as zero)
      for (int k = 0; k < kp; k += V::W) V::store(out + k, V::round_bf16(V::load(xt + k)));
      V::ftz_end(csr);
    }
  }
  return buffer.data();
}

// A BF16P register tile: TB tokens x NP panels (p, p + ps, ...), x the rounded rows [TB, kp]. Per
// pair of k, each panel's weights are loaded once and meet every token's broadcast.
template <class V, int TB, int NP>
__attribute__((noinline)) void bf16p_tile(const Bf16Act<V>* x, const uint16_t* w, int kp, int p,
                                          int ps, float* y, int ldy, const float* bias,
                                          bool accumulate) {
  using R = typename V::reg;
  constexpr int RP = kPanel / V::W, J = NP * RP;
  R acc[TB][J];
  fill(acc, V::zero());
  const uint16_t* wp[NP];  // panel q: [kp / 2][kPanel][2]
#pragma GCC unroll 8
  for (int q = 0; q < NP; q++) wp[q] = w + size_t(p + q * ps) * kp * kPanel;
  // a pair of k is 64 bytes of a panel: one line each (prefetch_ahead)
  auto prefetch = [&](int k) {
    if constexpr (TB > 1) {
#pragma GCC unroll 8
      for (int q = 0; q < NP; q++) prefetch_ahead(wp[q] + size_t(k) * kPanel);
    }
  };
  if constexpr (V::BF16_DOT) {
    for (int k = 0; k < kp; k += 2) {
      prefetch(k);
      typename V::ireg wv[J];
#pragma GCC unroll 8
      for (int j = 0; j < J; j++)
        wv[j] = V::load_bf16_pairs(wp[j / RP] + size_t(k) * kPanel + (j % RP) * 2 * V::W);
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const typename V::ireg xb = V::bcast_bf16_pair(x + size_t(t) * kp + k);
#pragma GCC unroll 8
        for (int j = 0; j < J; j++) acc[t][j] = V::dpbf16(acc[t][j], wv[j], xb);
      }
    }
  } else {
    const unsigned csr = V::ftz_begin();
    for (int k = 0; k < kp; k += 2) {
      prefetch(k);
      auto step = [&](auto e) {  // k + e of every row
        R wv[J];
#pragma GCC unroll 8
        for (int j = 0; j < J; j++)
          wv[j] = V::template load_bf16_half<decltype(e)::value>(wp[j / RP] + size_t(k) * kPanel +
                                                                 (j % RP) * 2 * V::W);
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) {
          const R xb = V::set1(x[size_t(t) * kp + k + decltype(e)::value]);
#pragma GCC unroll 8
          for (int j = 0; j < J; j++) acc[t][j] = V::fma(xb, wv[j], acc[t][j]);
        }
      };
      step(Int<1>{});  // the odd k first, as VDPBF16PS
      step(Int<0>{});
    }
    // The sums pass through an empty asm on each side of the MXCSR restore, so that no FMA is moved
    // past it and no epilogue add before it (the epilogue is plain float32).
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++)
#pragma GCC unroll 8
      for (int j = 0; j < J; j++) V::pin_reg(acc[t][j]);
    V::ftz_end(csr);
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++)
#pragma GCC unroll 8
      for (int j = 0; j < J; j++) V::pin_reg(acc[t][j]);
  }
  store_tile<V, TB, J>(acc, y, ldy, p, ps, bias, accumulate);
}

// The BF16P matmul: per block of kRowBlock rows, the rows rounded once, then the tiles. One row:
// streaming GEMV tiles of NP_GEMV panels. More, with VDPBF16PS: the panels NPD at a time (the
// model's multi-row calls take chunks of 4), each group against balanced tiles of at most TBD rows
// (8 rows: 4 + 4), as vnni_qmatmul. Without it: the float formats' tiling (for_each_tile), in tiles
// of at most TB_BF16P rows.
template <class V>
void matmul_bf16p(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1, float* y,
                  int ldy, const float* bias, bool accumulate) {
  const uint16_t* wb = static_cast<const uint16_t*>(w);
  for (int m0 = 0; m0 < m; m0 += kRowBlock) {
    const int mc = std::min(kRowBlock, m - m0);
    const Bf16Act<V>* xr = round_rows_bf16<V>(x + size_t(m0) * ldx, mc, ldx, kp);
    float* yb = y + size_t(m0) * ldy;
    auto tile = [&](auto rows, auto np, int t, int p, int ps) {
      bf16p_tile<V, decltype(rows)::value, decltype(np)::value>(
          xr + size_t(t) * kp, wb, kp, p, ps, yb + size_t(t) * ldy, ldy, bias, accumulate);
    };
    if constexpr (V::BF16_DOT) {
      if (mc == 1) {
        streaming_tiles<1, V::NP_GEMV>(p0, p1, tile);
        continue;
      }
      constexpr int TB = V::TBD, NP = V::NPD;
      const int tiles = (mc + TB - 1) / TB;
      for (int p = p0; p < p1; p += NP) {
        const int np = std::min(NP, p1 - p);
        for (int i = 0, t = 0; i < tiles; i++) {
          const int rows = mc / tiles + (i < mc % tiles ? 1 : 0);
          with_rows<TB>(rows,
                        [&](auto r) { with_rows<NP>(np, [&](auto n) { tile(r, n, t, p, 1); }); });
          t += rows;
        }
      }
    } else {
      for_each_tile<V::TB_BF16P, V::NP_GEMV, 2>(mc, p0, p1, tile, [](int, int) {});
    }
  }
}

// A Q4 panel with its nibbles unpacked to a byte each, in Q8's group layout (the headers as they
// are), in a buffer of the calling thread. The tiles of a row block then share one unpacking (3
// operations per group) instead of each repeating it. The next panel is prefetched meanwhile, as
// qmatmul_tile does for packed panels.
template <class V>
const uint8_t* unpack_q4_panel(const uint8_t* panel, int nb, size_t panel_stride) {
  constexpr int RP = kPanel / V::W;
  constexpr size_t hb = qheader_bytes(WType::Q4), gin = qgroup_bytes(WType::Q4),
                   gout = qgroup_bytes(WType::Q8);
  constexpr size_t in_block = qblock_bytes(WType::Q4), out_block = hb + gout * (kQBlock / kQGroup);
  thread_local std::vector<uint8_t> buffer;
  const size_t bytes = size_t(nb) * out_block + 64;
  if (buffer.size() < bytes) buffer.resize(bytes);
  // 64-byte aligned
  uint8_t* out = buffer.data() + (-reinterpret_cast<uintptr_t>(buffer.data()) & 63);
  for (int b = 0; b < nb; b++) {
    const uint8_t* src = panel + size_t(b) * in_block;
    uint8_t* dst = out + size_t(b) * out_block;
#pragma GCC unroll 8
    for (size_t o = 0; o < in_block; o += 64) __builtin_prefetch(src + panel_stride + o);
    std::memcpy(dst, src, hb);
#pragma GCC unroll 8
    for (int g = 0; g < kQBlock / kQGroup; g++)
#pragma GCC unroll 2
      for (int j = 0; j < RP; j++)
        V::store_qw(dst + hb + g * gout + j * (gout / RP),
                    V::template load_qw<WType::Q4>(src + hb + g * gin, j));
  }
  return out;
}

// Two rows or more on VNNI: blocks of kRowBlock rows; in each, the panels NPV at a time (the
// model's multi-row calls take chunks of 4 panels, model.cpp matmul_part), each group of panels
// against balanced tiles of at most TBV rows (12 rows: 6 + 6), or up to TBV_WIDE rows in one tile
// of NPV_WIDE panels (8 rows). A tile's panels stay in L1 or L2 for the row block's next tiles.
template <class V, WType T>
void vnni_qmatmul(const QRows& x, int m, const uint8_t* w, int kp, int p0, int p1, float* y,
                  int ldy, const float* bias, bool accumulate) {
  constexpr int TB = T == WType::Q8 ? V::TBV_Q8 : V::TBV_Q4, NP = V::NPV;
  const int nb = kp / kQBlock;
  const size_t panel_stride = size_t(nb) * qblock_bytes(T);
  for (int m0 = 0; m0 < m; m0 += kRowBlock) {
    const int mc = std::min(kRowBlock, m - m0);
    // A few rows more than TB (up to TBV_WIDE): one tile of them all x NPV_WIDE panels, so that
    // each panel is loaded and unpacked once, not once per tile (perf-notes #48)
    const bool wide = mc > TB && mc <= V::TBV_WIDE;
    const int tiles = wide ? 1 : (mc + TB - 1) / TB, panels = wide ? V::NPV_WIDE : NP;
    for (int p = p0; p < p1; p += panels) {
      const int np = std::min(panels, p1 - p);
      for (int i = 0, t = m0; i < tiles; i++) {
        const int rows = mc / tiles + (i < mc % tiles ? 1 : 0);
        const QRows xt{x.q + size_t(t) * kp, x.d + size_t(t) * nb, x.dsum + size_t(t) * nb};
        // tiles of up to R rows x N panels (only the shapes that run are instantiated)
        auto tile = [&](auto max_rows, auto max_panels) {
          with_rows<decltype(max_rows)::value>(rows, [&](auto r) {
            with_rows<decltype(max_panels)::value>(np, [&](auto n) {
              vnni_tile<V, T, decltype(r)::value, decltype(n)::value>(
                  xt, kp, w + size_t(p) * panel_stride, panel_stride, p, y + size_t(t) * ldy, ldy,
                  bias, accumulate);
            });
          });
        };
        if (wide)
          tile(Int<V::TBV_WIDE>{}, Int<V::NPV_WIDE>{});
        else
          tile(Int<TB>{}, Int<NP>{});
        t += rows;
      }
    }
  }
}

template <class V, WType T>
void qmatmul(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y, int ldy,
             const float* bias, bool accumulate) {
  const int nb = kp / kQBlock;
  const size_t panel_stride = size_t(nb) * qblock_bytes(T);
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  if constexpr (V::VNNI) {
    if (m > 1) return vnni_qmatmul<V, T>(x, m, wb, kp, p0, p1, y, ldy, bias, accumulate);
  }
  // Q4: the current panel unpacked, when 3 tiles or more share it (perf-notes #16)
  const uint8_t* unpacked = nullptr;
  for_each_tile<T == WType::Q4 ? V::TBQ4 : V::TBQ, V::NPQ_GEMV, 1>(
      m, p0, p1,
      [&](auto rows, auto np, int t, int p, int ps) {
        constexpr int R = decltype(rows)::value, NP = decltype(np)::value;
        const QRows xt{x.q + size_t(t) * kp, x.d + size_t(t) * nb, x.dsum + size_t(t) * nb};
        float* yt = y + size_t(t) * ldy;
        if constexpr (T == WType::Q4 && NP == 1) {
          if (unpacked)
            return qmatmul_tile<V, T, R, NP, true>(xt, kp, unpacked, p, 1, yt, ldy, bias,
                                                   accumulate);
        }
        qmatmul_tile<V, T, R, NP>(xt, kp, wb + size_t(p) * panel_stride, p, ps, yt, ldy, bias,
                                  accumulate);
      },
      [&](int p, int tiles) {
        if constexpr (T == WType::Q4)
          unpacked = tiles > 2 ? unpack_q4_panel<V>(wb + size_t(p) * panel_stride, nb, panel_stride)
                               : nullptr;
      });
}

// quantize_rows (generic.cpp) in registers: a block's 32 values are loaded once for its max and its
// levels.
template <class V>
void quantize(const float* x, int m, int ldx, int kp, int8_t* q, float* d, float* dsum) {
  using R = typename V::reg;
  using I = typename V::ireg;
  constexpr int N = kQBlock / V::W;
  const int nb = kp / kQBlock;
  for (int t = 0; t < m; t++) {
    for (int b = 0; b < nb; b++) {
      const float* v = x + size_t(t) * ldx + b * kQBlock;
      R a[N], amax = V::zero();
#pragma GCC unroll 4
      for (int r = 0; r < N; r++) a[r] = V::load(v + r * V::W), amax = V::max(amax, V::abs(a[r]));
      const float mx = V::hmax(amax), db = mx / 127.f, inv = mx > 0.f ? 1.f / db : 0.f;
      I qi[N], sum = V::izero();
#pragma GCC unroll 4
      for (int r = 0; r < N; r++)
        qi[r] = V::cvt_round(V::mul(a[r], V::set1(inv))), sum = V::iadd(sum, qi[r]);
      V::store_q32(q + size_t(t) * kp + b * kQBlock, qi);
      d[size_t(t) * nb + b] = db;
      dsum[size_t(t) * nb + b] = db * float(V::ihsum(sum));
    }
  }
}

// W keys or values from the cache, as floats.
template <class V, class KV>
inline typename V::reg load_kv(const KV* p) {
  if constexpr (std::is_same_v<KV, float>)
    return V::load(p);
  else
    return V::load_f16(p);
}

// Scores of G query rows against the keys of panels [pi, pi + PB): one chain per (query, key) over
// d. v is the values, whose lines for these keys it asks into L2 for the values pass.
template <class V, class KV, int G, int PB>
inline void attend_scores(const float* const (&q)[G], int hdp, const KV* k, const KV* v, int pi,
                          float scale, float* scores, int ns) {
  using R = typename V::reg;
  constexpr int RP = kPanel / V::W;
  R acc[G][PB * RP];
  fill(acc, V::zero());
  const KV* kb = k + size_t(pi) * hdp * kPanel;
  // the PB panels' values are kPanel * PB rows of hdp, one block: a dim's share is kStep bytes
  const char* vb = reinterpret_cast<const char*>(v + size_t(pi) * kPanel * hdp);
  constexpr size_t kStep = size_t(kPanel) * PB * sizeof(KV);
  for (int d = 0; d < hdp; d++) {
    // The keys come from memory (a layer's weights have streamed through the cache since they
    // were written): ask for the same line PB + 1 panels on, a line per dim's 16 keys or pair of
    // dims (perf-notes #25).
    if (d % (4 / sizeof(KV)) == 0) __builtin_prefetch(kb + (size_t(PB + 1) * hdp + d) * kPanel);
    // The values of these panels' keys, which the values pass reads after the softmax: into L2
    // while the keys stream, the lines that start in this dim's share (perf-notes #50).
    for (size_t b = (d * kStep + 63) / 64 * 64; b < (d + 1) * kStep; b += 64)
      __builtin_prefetch(vb + b, 0, 2);
    R kv[PB * RP];
#pragma GCC unroll 16
    for (int r = 0; r < PB * RP; r++)
      kv[r] = load_kv<V>(kb + (size_t(r / RP) * hdp + d) * kPanel + (r % RP) * V::W);
#pragma GCC unroll 16
    for (int j = 0; j < G; j++) {
      R qb = V::set1(q[j][d]);
#pragma GCC unroll 16
      for (int r = 0; r < PB * RP; r++) acc[j][r] = V::fma(qb, kv[r], acc[j][r]);
    }
  }
  const R vs = V::set1(scale);
#pragma GCC unroll 16
  for (int j = 0; j < G; j++)
#pragma GCC unroll 16
    for (int r = 0; r < PB * RP; r++)
      V::store(scores + size_t(j) * ns + (pi + r / RP) * kPanel + (r % RP) * V::W,
               V::mul(acc[j][r], vs));
}

// out[j, c0 .. c0 + CB * W) += sum_{i0 <= i < i1} p[j, i] v[i, ...] for G rows (p and out rows ns
// and hdp apart): each (row, column) continues its chain over i, in order, from the value in out.
template <class V, class KV, int G, int CB>
inline void attend_values(const float* p, int ns, const KV* v, int i0, int i1, int hdp, int c0,
                          float* out) {
  using R = typename V::reg;
  R acc[G][CB];
#pragma GCC unroll 16
  for (int j = 0; j < G; j++)
#pragma GCC unroll 16
    for (int c = 0; c < CB; c++) acc[j][c] = V::load(out + size_t(j) * hdp + c0 + c * V::W);
  for (int i = i0; i < i1; i++) {
    __builtin_prefetch(v + size_t(i + 16) * hdp + c0);  // the value 16 keys on (as the keys)
    R vv[CB];
#pragma GCC unroll 16
    for (int c = 0; c < CB; c++) vv[c] = load_kv<V>(v + size_t(i) * hdp + c0 + c * V::W);
#pragma GCC unroll 16
    for (int j = 0; j < G; j++) {
      R pb = V::set1(p[size_t(j) * ns + i]);
#pragma GCC unroll 16
      for (int c = 0; c < CB; c++) acc[j][c] = V::fma(pb, vv[c], acc[j][c]);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < G; j++)
#pragma GCC unroll 16
    for (int c = 0; c < CB; c++) V::store(out + size_t(j) * hdp + c0 + c * V::W, acc[j][c]);
}

// The values pass over keys [i0, i1) for G rows, columns [c0, c1) (multiples of W).
template <class V, class KV, int G>
inline void attend_values_rows(const float* p, int ns, const KV* v, int i0, int i1, int hdp, int c0,
                               int c1, float* out) {
  if (i0 >= i1) return;
  constexpr int CB = G == 1 ? 8 : (G == 2 ? 4 : 2);  // enough chains to hide the FMA latency
  int c = c0;
  for (; c + CB * V::W <= c1; c += CB * V::W)
    attend_values<V, KV, G, CB>(p, ns, v, i0, i1, hdp, c, out);
  for (; c < c1; c += V::W) attend_values<V, KV, G, 1>(p, ns, v, i0, i1, hdp, c, out);
}

// max of s[f..e), e > f.
template <class V>
inline float row_max(const float* s, int f, int e) {
  int i = f;
  float mx = s[i];
  if (e - f >= V::W) {
    typename V::reg m = V::load(s + f);
    for (i = f + V::W; i + V::W <= e; i += V::W) m = V::max(m, V::load(s + i));
    mx = V::hmax(m);
  }
  for (; i < e; i++) mx = std::max(mx, s[i]);
  return mx;
}

// The canonical sum (canonical.h) of the kSumLanes lanes held in kSumLanes / W registers: AVX2's
// two registers are added first (the tree's first level, l[i] + l[i + 8]); hsum's fixed tree does
// the rest.
template <class V>
inline float sum_lanes(const typename V::reg (&acc)[kSumLanes / V::W]) {
  if constexpr (kSumLanes / V::W == 2)
    return V::hsum(V::add(acc[0], acc[1]));
  else
    return V::hsum(acc[0]);
}

// The canonical sum of s[0..n): whole groups of kSumLanes, then a zero-padded copy of the last
// partial group.
template <class V>
inline float row_sum(const float* s, int n) {
  constexpr int R = kSumLanes / V::W;
  typename V::reg acc[R];
  for (int r = 0; r < R; r++) acc[r] = V::zero();
  int i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int r = 0; r < R; r++) acc[r] = V::add(acc[r], V::load(s + i + r * V::W));
  if (i < n) {
    alignas(64) float tail[kSumLanes] = {};
    std::memcpy(tail, s + i, sizeof(float) * (n - i));
    for (int r = 0; r < R; r++) acc[r] = V::add(acc[r], V::load(tail + r * V::W));
  }
  return sum_lanes<V>(acc);
}

// G = g * nt rows: the g heads of nt query tokens (see kernels.h), one phase of the call
// (AttendPartFn). One pass over the keys every row needs serves them all (each key and value is
// loaded once per call); a row's own chains, and so its result, are those it has alone: scores of
// keys outside its range are computed but never read, and its values chain runs over its keys in
// order (its own first keys, the keys all rows share, then its own last keys).
template <class V, class KV, int G>
void attend_rows(AttendPhase phase, int lo, int hi, const float* q, int g, size_t q_stride,
                 const KV* k, const KV* v, const int* first, const int* n, int hdp, float scale,
                 float* scores, float* out) {
  int shared_lo = 0, shared_hi = 1 << 30, fmin = 1 << 30, nmax = 0;
  for (int j = 0; j < G; j++) {
    const int t = j / g;
    shared_lo = std::max(shared_lo, first[t]), shared_hi = std::min(shared_hi, n[t]);
    fmin = std::min(fmin, first[t]), nmax = std::max(nmax, n[t]);
  }
  // Scores are indexed by key position; the first panel may start before a row's first key (lanes
  // never used).
  const int ns = pad_to(nmax);
  if (phase == AttendPhase::Scores) {
    const float* qr[G];
    for (int j = 0; j < G; j++) qr[j] = q + (j / g) * q_stride + size_t(j % g) * hdp;
    const int np = std::min(hi, pad_to(nmax, kPanel) / kPanel);
    constexpr int PB = G == 1 ? 3 : (G == 2 ? 2 : 1);  // enough chains to hide the FMA latency
    int pi = std::max(lo, fmin / kPanel);
    for (; pi + PB <= np; pi += PB)
      attend_scores<V, KV, G, PB>(qr, hdp, k, v, pi, scale, scores, ns);
    for (; pi < np; pi++) attend_scores<V, KV, G, 1>(qr, hdp, k, v, pi, scale, scores, ns);
  } else if (phase == AttendPhase::Softmax) {
    for (int j = lo; j < std::min(hi, G);
         j++) {  // over the row's keys (other lanes of their panels are never used)
      const int f = first[j / g], e = n[j / g];
      float* s = scores + size_t(j) * ns;
      const typename V::reg vmx = V::set1(row_max<V>(s, f, e));
      for (int i = f / kPanel * kPanel; i < pad_to(e); i += V::W)
        V::store(s + i, V::exp(V::sub(V::load(s + i), vmx)));
      const typename V::reg vsum = V::set1(row_sum<V>(s + f, e - f));
      for (int i = f / kPanel * kPanel; i < pad_to(e); i += V::W)
        V::store(s + i, V::div(V::load(s + i), vsum));
      for (int c = 0; c < hdp; c += V::W) V::store(out + size_t(j) * hdp + c, V::zero());
    }
  } else {
    const int c0 = lo, c1 = std::min(hi, hdp);
    if (shared_lo < shared_hi) {
      for (int j = 0; j < G; j++)
        attend_values_rows<V, KV, 1>(scores + size_t(j) * ns, ns, v, first[j / g], shared_lo, hdp,
                                     c0, c1, out + size_t(j) * hdp);
      attend_values_rows<V, KV, G>(scores, ns, v, shared_lo, shared_hi, hdp, c0, c1, out);
      for (int j = 0; j < G; j++)
        attend_values_rows<V, KV, 1>(scores + size_t(j) * ns, ns, v, shared_hi, n[j / g], hdp, c0,
                                     c1, out + size_t(j) * hdp);
    } else {  // no key that every row attends to (sliding windows far apart)
      for (int j = 0; j < G; j++)
        attend_values_rows<V, KV, 1>(scores + size_t(j) * ns, ns, v, first[j / g], n[j / g], hdp,
                                     c0, c1, out + size_t(j) * hdp);
    }
  }
}

// attend_rows<V, KV, G> for G = 1 .. kMaxAttendRows, indexed by G - 1.
template <class V, class KV, int... I>
constexpr auto attend_rows_table(std::integer_sequence<int, I...>) {
  return std::array{&attend_rows<V, KV, I + 1>...};
}

template <class V, class KV>
void attend_part(AttendPhase phase, int lo, int hi, const float* q, int g, int nt, size_t q_stride,
                 const void* kp, const void* vp, const int* first, const int* n, int hdp,
                 float scale, float* scores, float* out) {
  static constexpr auto rows =
      attend_rows_table<V, KV>(std::make_integer_sequence<int, kMaxAttendRows>{});
  rows[g * nt - 1](phase, lo, hi, q, g, q_stride, static_cast<const KV*>(kp),
                   static_cast<const KV*>(vp), first, n, hdp, scale, scores, out);
}

// fp16 bits of x, rounded to nearest even: W at a time, the tail one by one (the same rounding).
template <class V>
void to_f16(const float* x, uint16_t* out, int n) {
  int i = 0;
  for (; i + V::W <= n; i += V::W) V::store_f16(out + i, V::load(x + i));
  for (; i < n; i++) out[i] = f32_to_f16(x[i]);
}

// out = x sigmoid(x) * up (Silu) or x sigmoid(2u) * up with u = sqrt(2 / pi) (x + 0.044715 x^3)
// (GeluTanh). n must be a multiple of V::W (activation rows are padded).
template <class V, Activation A>
void glu(const float* gate, const float* up, float* out, int n) {
  const typename V::reg one = V::set1(1.f);
  for (int i = 0; i < n; i += V::W) {
    typename V::reg g = V::load(gate + i), z = g;
    if constexpr (A == Activation::GeluTanh) {
      const typename V::reg g3 = V::mul(V::mul(g, g), g);
      z = V::mul(V::set1(2.f * 0.7978845608028654f), V::fma(V::set1(0.044715f), g3, g));
    }
    typename V::reg e = V::exp(V::sub(V::zero(), z));
    V::store(out + i, V::mul(V::div(g, V::add(one, e)), V::load(up + i)));
  }
}

// ArgmaxFn in two passes, the max then its first index. V::max(a, b) returns b where either is NaN
// (maxps), so a NaN lane of x leaves the running max as it was, as the scan passes it over.
template <class V>
int argmax(const float* x, int n) {
  if (!(x[0] == x[0])) return 0;  // a NaN first: nothing is larger
  typename V::reg m = V::set1(x[0]);
  int i = 0;
  for (; i + V::W <= n; i += V::W) m = V::max(V::load(x + i), m);
  float mx = V::hmax(m);
  for (; i < n; i++)
    if (x[i] > mx) mx = x[i];
  const typename V::reg vm = V::set1(mx);
  for (i = 0; i + V::W <= n; i += V::W)  // x >= mx is x == mx (ordered: NaN lanes are not)
    if (const auto bits = V::ge_mask(V::load(x + i), vm)) return i + __builtin_ctzll(bits);
  while (x[i] != mx) i++;
  return i;
}

// Each block's sum of exponentials is the canonical sum of its values (the last group of the row
// zero-padded), added in double in block order: the same bits as the reference.
template <class V>
int softmax_stats(const float* x, int n, float t, float close, float* max_out, double* sum_out,
                  int32_t* ids) {
  using R = typename V::reg;
  constexpr int RL = kSumLanes / V::W;
  static_assert(kStatsBlock % kSumLanes == 0, "a block holds whole groups of lanes");
  // max(x) / t is the largest quotient: rounding is monotonic
  const float mq = row_max<V>(x, 0, n) / t, lo = mq - close;
  const R vt = V::set1(t), vm = V::set1(mq), vlo = V::set1(lo);
  double sum = 0;
  int count = 0;
  for (int b = 0; b < n; b += kStatsBlock) {
    const int e = std::min(n, b + kStatsBlock);
    R acc[RL];
    for (int r = 0; r < RL; r++) acc[r] = V::zero();
    int j = b;
    for (; j + kSumLanes <= e; j += kSumLanes) {
      for (int r = 0; r < RL; r++) {
        const int o = j + r * V::W;
        const R q = V::div(V::load(x + o), vt);
        acc[r] = V::add(acc[r], V::exp(V::sub(q, vm)));
        for (auto bits = V::ge_mask(q, vlo); bits; bits &= bits - 1)
          ids[count++] = o + __builtin_ctzll(bits);
      }
    }
    if (j < e) {  // the last group: exponentials of a zero-padded copy, the lanes past the row then
                  // cleared
      alignas(64) float in[kSumLanes] = {}, ex[kSumLanes];
      std::memcpy(in, x + j, sizeof(float) * (e - j));
      for (int r = 0; r < RL; r++)
        V::store(ex + r * V::W, V::exp(V::sub(V::div(V::load(in + r * V::W), vt), vm)));
      for (int l = e - j; l < kSumLanes; l++) ex[l] = 0.f;
      for (int r = 0; r < RL; r++) acc[r] = V::add(acc[r], V::load(ex + r * V::W));
      for (; j < e; j++)
        if (x[j] / t >= lo) ids[count++] = j;
    }
    sum += double(sum_lanes<V>(acc));
  }
  *max_out = mq, *sum_out = sum;
  return count;
}

}  // namespace kwker::simd
