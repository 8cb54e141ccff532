// The K formats' matmuls (Q4K, Q6K: ggml's Q4_K and Q6_K held exactly, formats.h), written once
// over simd_kernels.h's vector traits: register tiles of exact integer sums per sub-block and
// FMAs per super-block, whose bits are the generic kernels' (kernels.h gives the sums and order).
#pragma once

#include "simd_kernels.h"

namespace kwker::simd {

// Multi-row K tiles ask for the next panel's super-block (at `ahead` bytes from this one) while
// they compute on this one, a share of its lines at each of its S sub-blocks: as qmatmul_tile, for
// the reason it gives. Without it, an 8-row Q4K tile ran at 55% of its in-cache speed on weights
// streaming from memory. Into L2, not L1: L1 holds the rows' activations, which the next panel's
// lines would evict (perf-notes #47).
template <class B, int S>
inline void prefetch_next(const B* blk, size_t ahead, int sb) {
  constexpr int lines = (sizeof(B) + 63) / 64, per = (lines + S - 1) / S;
  const char* next = reinterpret_cast<const char*>(blk) + ahead;
#pragma GCC unroll 8
  for (int i = sb * per; i < std::min(lines, (sb + 1) * per); i++)
    __builtin_prefetch(next + size_t(i) * 64, 0, 2);
}

// A Q4K register tile (kernels.h): TB tokens x NP panels (p, p + ps, ...). Per sub-block, the exact
// dot products of every (token, row) as Q4's (the nibbles are in Q4's group layout), then each
// taken times the row's 6-bit scale into an int32 sum S1 (scale_dot: AVX-512 multiplies the int32
// sums; AVX2 finishes its int16 pair sums with pmaddwd against the scale); per super-block, the
// mins' sum S2 (pmaddwd of the mins in pairs of sub-blocks against the activations' sums) and two
// FMAs. Integers are exact, the FMAs in kernels.h's order: the generic kernel's bits.
template <class V, int TB, int NP>
__attribute__((noinline)) void q4k_tile(const QRows& x, int kp, const uint8_t* base, int p, int ps,
                                        float* y, int ldy, const float* bias, bool accumulate) {
  using R = typename V::reg;
  using I = typename V::ireg;
  constexpr int RP = kPanel / V::W, J = NP * RP;
  const int nsb = kp / kSuperBlock;
  const size_t panel_stride = size_t(nsb) * sizeof(BlockQ4K);
  alignas(64) float accm[TB][J * V::W];  // in L1 between super-blocks, as in qmatmul_tile
  for (int t = 0; t < TB; t++)
    for (int j = 0; j < J; j++) V::store(&accm[t][j * V::W], V::zero());
  for (int b = 0; b < nsb; b++) {
    const BlockQ4K* blk[NP];
#pragma GCC unroll 16
    for (int q = 0; q < NP; q++)
      blk[q] = reinterpret_cast<const BlockQ4K*>(base + size_t(q) * ps * panel_stride) + b;
    const int8_t* xb = x.q + size_t(b) * kSuperBlock;
    I s1[TB][J];
    fill(s1, V::izero());
#pragma GCC unroll 1
    for (int sb = 0; sb < kSubBlocks; sb++) {
      if constexpr (TB > 1) prefetch_next<BlockQ4K, kSubBlocks>(blk[0], NP * panel_stride, sb);
      I dot[TB][J];
      fill(dot, V::izero());
#pragma GCC unroll 1  // (see qmatmul_tile)
      for (int g = 0; g < kQBlock / kQGroup; g++) {
        I wv[J];
#pragma GCC unroll 16
        for (int j = 0; j < J; j++)
          wv[j] = V::template load_qw<WType::Q4>(&blk[j / RP]->q[sb][g][0][0], j % RP);
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) {
          const I xv = V::bcast4(xb + size_t(t) * kp + sb * kQBlock + g * kQGroup);
#pragma GCC unroll 16
          for (int j = 0; j < J; j++) dot[t][j] = V::dot_q4(dot[t][j], wv[j], xv);
        }
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
          for (int j = 0; j < J; j++) V::pin(dot[t][j]);
      }
#pragma GCC unroll 16
      for (int j = 0; j < J; j++) {
        const I sc = V::load_sc(&blk[j / RP]->sc[sb][(j % RP) * V::W]);
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) s1[t][j] = V::iadd(s1[t][j], V::scale_dot(dot[t][j], sc));
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) {
      const BlockQ4K& h = *blk[j / RP];
      const int r0 = (j % RP) * V::W;
      const R dw = V::load_f16(&h.d[r0]), dm = V::load_f16(&h.dmin[r0]);
      I mn[kSubBlocks / 2];
#pragma GCC unroll 4
      for (int i = 0; i < kSubBlocks / 2; i++) mn[i] = V::load_mins(&h.mn[i][r0][0]);
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const int16_t* xs = x.sums + size_t(t) * (kp / kQBlock) + b * kSubBlocks;
        I s2 = V::izero();  // -S2
#pragma GCC unroll 4
        for (int i = 0; i < kSubBlocks / 2; i++)
          s2 =
              V::isub(s2, V::madd16(mn[i], V::bcast4(reinterpret_cast<const int8_t*>(xs + 2 * i))));
        const R dx = V::set1(x.d[size_t(t) * nsb + b]);
        R a = V::fma(V::mul(dw, dx), V::cvt(s1[t][j]), V::load(&accm[t][j * V::W]));
        V::store(&accm[t][j * V::W], V::fma(V::mul(dm, dx), V::cvt(s2), a));
      }
    }
    asm volatile("" ::: "memory");  // keep accm in memory across super-blocks
  }
  R acc[TB][J];
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) acc[t][j] = V::load(&accm[t][j * V::W]);
  store_tile<V, TB, J>(acc, y, ldy, p, ps, bias, accumulate);
}

// A Q6K register tile (kernels.h): TB tokens x NP panels (p, p + ps, ...). Per sub-block of 16,
// the exact dot products of the 6-bit levels (load_q6: a nibble and the top bits, each from its
// plane) with every token's activations, less 32 times the token's sum of the sub-block,
// times the row's int8 scale into an int32 sum; per super-block one FMA. The generic kernel's bits.
template <class V, int TB, int NP>
__attribute__((noinline)) void q6k_tile(const QRows& x, int kp, const uint8_t* base, int p, int ps,
                                        float* y, int ldy, const float* bias, bool accumulate) {
  using R = typename V::reg;
  using I = typename V::ireg;
  constexpr int RP = kPanel / V::W, J = NP * RP;
  const int nsb = kp / kSuperBlock;
  const size_t panel_stride = size_t(nsb) * sizeof(BlockQ6K);
  alignas(64) float accm[TB][J * V::W];  // in L1 between super-blocks, as in qmatmul_tile
  for (int t = 0; t < TB; t++)
    for (int j = 0; j < J; j++) V::store(&accm[t][j * V::W], V::zero());
  for (int b = 0; b < nsb; b++) {
    const BlockQ6K* blk[NP];
#pragma GCC unroll 16
    for (int q = 0; q < NP; q++)
      blk[q] = reinterpret_cast<const BlockQ6K*>(base + size_t(q) * ps * panel_stride) + b;
    const int8_t* xb = x.q + size_t(b) * kSuperBlock;
    I sum[TB][J];
    fill(sum, V::izero());
#pragma GCC unroll 1
    for (int sb = 0; sb < kSubBlocks16; sb++) {
      if constexpr (TB > 1) prefetch_next<BlockQ6K, kSubBlocks16>(blk[0], NP * panel_stride, sb);
      // each chain starts at -32 times its token's sum of the sub-block: the levels' offset
      I dot[TB][J];
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const int16_t xs = x.sums16[size_t(t) * (kp / 16) + b * kSubBlocks16 + sb];
        const I off = V::iset1(-32 * int32_t(xs));
#pragma GCC unroll 16
        for (int j = 0; j < J; j++) dot[t][j] = off;
      }
      // the sub-block's 4 groups: two lines of nibbles, one of top bits (formats.h)
      auto group = [&](auto gi) {
        constexpr int G = decltype(gi)::value;
        I wv[J];
#pragma GCC unroll 16
        for (int j = 0; j < J; j++)
          wv[j] = V::template load_q6<G>(&blk[j / RP]->sub[sb].ql[G / 2][0][0],
                                         &blk[j / RP]->sub[sb].qh[0][0], j % RP);
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) {
          const I xv = V::bcast4(xb + size_t(t) * kp + (4 * sb + G) * kQGroup);
#pragma GCC unroll 16
          for (int j = 0; j < J; j++) dot[t][j] = V::dot_q6(dot[t][j], wv[j], xv);
        }
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
          for (int j = 0; j < J; j++) V::pin(dot[t][j]);
      };
      group(Int<0>{}), group(Int<1>{}), group(Int<2>{}), group(Int<3>{});
#pragma GCC unroll 16
      for (int j = 0; j < J; j++) {
        const I sc = V::load_sc8(&blk[j / RP]->sc[sb][(j % RP) * V::W]);
#pragma GCC unroll 16
        for (int t = 0; t < TB; t++) sum[t][j] = V::iadd(sum[t][j], V::mullo(dot[t][j], sc));
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) {
      const R dw = V::load_f16(&blk[j / RP]->d[(j % RP) * V::W]);
#pragma GCC unroll 16
      for (int t = 0; t < TB; t++) {
        const R dx = V::set1(x.d[size_t(t) * nsb + b]);
        V::store(&accm[t][j * V::W],
                 V::fma(V::mul(dw, dx), V::cvt(sum[t][j]), V::load(&accm[t][j * V::W])));
      }
    }
    asm volatile("" ::: "memory");  // keep accm in memory across super-blocks
  }
  R acc[TB][J];
#pragma GCC unroll 16
  for (int t = 0; t < TB; t++)
#pragma GCC unroll 16
    for (int j = 0; j < J; j++) acc[t][j] = V::load(&accm[t][j * V::W]);
  store_tile<V, TB, J>(acc, y, ldy, p, ps, bias, accumulate);
}

// The K formats' matmul: the tiles of for_each_tile (one row: NPK_GEMV panels at once; more: tiles
// of up to TBK rows of one panel), on Int8Super activations.
template <class V, WType T>
void qmatmul_k(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y, int ldy,
               const float* bias, bool accumulate) {
  const int nsb = kp / kSuperBlock;
  const size_t panel_stride = size_t(nsb) * qblock_bytes(T);
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  for_each_tile<V::TBK, V::NPK_GEMV, 1>(
      m, p0, p1,
      [&](auto rows, auto np, int t, int p, int ps) {
        constexpr int R = decltype(rows)::value, NP = decltype(np)::value;
        const QRows xt{x.q + size_t(t) * kp, x.d + size_t(t) * nsb, nullptr,
                       x.sums + size_t(t) * (kp / kQBlock), x.sums16 + size_t(t) * (kp / 16)};
        float* yt = y + size_t(t) * ldy;
        const uint8_t* wp = wb + size_t(p) * panel_stride;
        if constexpr (T == WType::Q4K)
          q4k_tile<V, R, NP>(xt, kp, wp, p, ps, yt, ldy, bias, accumulate);
        else
          q6k_tile<V, R, NP>(xt, kp, wp, p, ps, yt, ldy, bias, accumulate);
      },
      [](int, int) {});
}

}  // namespace kwker::simd
