// The load-time side of the formats (formats.h): fp16 conversions, the quantizer that chooses each
// block's scale (and min) by least squares, and the packer that lays a matrix out in panels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "formats.h"

namespace kwker {

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7fffff;
  const int exp = (x >> 23) & 0xff;
  if (exp == 255) return uint16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
  const int e = exp - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00);
  if (e <= 0) {  // subnormal half, or zero
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    return uint16_t(sign | h);
  }
  uint32_t h = sign | uint32_t(e) << 10 | mant >> 13;
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++;  // a carry into the exponent is the right rounding
  return uint16_t(h);
}

namespace {

float float_at(const void* data, WType t, size_t i) {
  switch (t) {
    case WType::F32:
      return static_cast<const float*>(data)[i];
    case WType::BF16:
    case WType::BF16P:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
}

// The block holding (row r, column c) of a packed quantized matrix: a panel's blocks follow one
// another along k.
template <class Block>
Block* block_at(const void* packed, int kp, int r, int c) {
  const size_t per_panel = size_t(kp / kQBlock);
  return static_cast<Block*>(const_cast<void*>(packed)) + size_t(r / kPanel) * per_panel +
         c / kQBlock;
}

// round_even(v) clamped to [lo, hi], as a float.
inline float quant_level(float v, int lo, int hi) {
  return float(round_even(v < float(lo) ? float(lo) : (v > float(hi) ? float(hi) : v)));
}

// Squared error of v quantized with step d to integers in [lo, hi].
float quant_error(const float* v, float d, int lo, int hi) {
  const float inv = d != 0.f ? 1.f / d : 0.f;
  float e = 0.f;
  for (int j = 0; j < kQBlock; j++) {
    const float q = quant_level(v[j] * inv, lo, hi);
    e += (v[j] - q * d) * (v[j] - q * d);
  }
  return e;
}

// Whether every value of a block is d times an integer in [lo, hi]: quant_error's zero, stopped at
// the first value off the grid (where most blocks of float weights stop).
bool on_grid(const float* v, float d, int lo, int hi) {
  const float inv = 1.f / d;
  for (int j = 0; j < kQBlock; j++)
    if (quant_level(v[j] * inv, lo, hi) * d != v[j]) return false;
  return true;
}

// The step for a symmetric (Q8) block whose largest magnitude is amax: the plain one (amax to the
// end of the range) or, if better, one of a few nearby steps refined by least squares (d = sum v q
// / sum q q for the integers q it rounds to), whichever has the smallest squared error.
float block_step(const float* v, float amax, int lo, int hi) {
  const float d0 = amax / float(hi);
  if (d0 == 0.f) return 0.f;  // an all-zero block
  float best = d0, best_err = quant_error(v, d0, lo, hi);
  if (best_err == 0.f) return best;  // an exact fit (a Q8_0 file's block): nothing can beat it
  // A block on a grid of at most 32 levels (a Q5_0 or Q4_0 file's: its largest magnitude at level
  // 1..16) is held exactly with that grid's fp16 step (a Q4_K_M file's Q5_0 matrices at int4)
  for (int level = 16; level >= 1; level--) {
    const float d = f16_to_f32(f32_to_f16(amax / float(level)));
    if (on_grid(v, d, lo, hi)) return d;
  }
  for (float f : {0.9f, 0.95f, 1.0f}) {
    const float d = d0 * f, inv = 1.f / d;
    float vq = 0.f, qq = 0.f;
    for (int j = 0; j < kQBlock; j++) {
      const float q = quant_level(v[j] * inv, lo, hi);
      vq += v[j] * q, qq += q * q;
    }
    if (qq == 0.f) continue;
    const float refined = vq / qq, err = quant_error(v, refined, lo, hi);
    if (err < best_err) best = refined, best_err = err;
  }
  return best;
}

// Levels of an asymmetric (Q4) block for fp16 step d and min m: q = round((v - m) / d) in [0, 15];
// returns the squared error of q * d + m.
float levels_q4(const float* v, uint16_t dh, uint16_t mh, float* q) {
  const float d = f16_to_f32(dh), m = f16_to_f32(mh), inv = d != 0.f ? 1.f / d : 0.f;
  float e = 0.f;
  for (int j = 0; j < kQBlock; j++) {
    q[j] = quant_level((v[j] - m) * inv, 0, 15);
    const float r = v[j] - (q[j] * d + m);
    e += r * r;
  }
  return e;
}

// Step and min (fp16) of an asymmetric block: the plain range (min to max in 15 steps), then
// least-squares fits of (d, m) to the levels each candidate rounds to, from the plain and two
// slightly narrower ranges; the candidate with the smallest squared error after fp16 rounding wins.
void block_step_min(const float* v, uint16_t* dh, uint16_t* mh) {
  float lo = v[0], hi = v[0];
  for (int j = 1; j < kQBlock; j++) lo = std::min(lo, v[j]), hi = std::max(hi, v[j]);
  float q[kQBlock];
  *dh = f32_to_f16((hi - lo) / 15.f), *mh = f32_to_f16(lo);
  float best = levels_q4(v, *dh, *mh, q);
  // No candidate beats an exact fit: a block that already lies on a grid of 16 levels (a Q4_0 or
  // Q4_1 file's) keeps its own, at a fraction of the search's cost.
  if (best == 0.f) return;
  for (float f : {1.0f, 0.95f, 0.9f}) {
    uint16_t d1 = f32_to_f16((hi - lo) * f / 15.f),
             m1 = f32_to_f16(lo + (hi - lo) * (1.f - f) / 2.f);
    for (int iter = 0; iter < 2; iter++) {
      levels_q4(v, d1, m1, q);
      double sq = 0, sv = 0, sqq = 0, sqv = 0;
      for (int j = 0; j < kQBlock; j++)
        sq += q[j], sv += v[j], sqq += double(q[j]) * q[j], sqv += double(q[j]) * v[j];
      const double det = kQBlock * sqq - sq * sq;
      if (det <= 0) break;  // every value on one level: the plain candidate already has it
      const double d = (kQBlock * sqv - sq * sv) / det, m = (sv - d * sq) / kQBlock;
      d1 = f32_to_f16(float(d)), m1 = f32_to_f16(float(m));
      const float err = levels_q4(v, d1, m1, q);
      if (err < best) best = err, *dh = d1, *mh = m1;
    }
  }
}

// Quantizes one row block (kQBlock values) of row i of a panel into its block.
void quantize_q4(const float* v, BlockQ4* block, int i) {
  uint16_t dh, mh;
  block_step_min(v, &dh, &mh);
  block->scale[i] = dh, block->min[i] = mh;
  float q[kQBlock];
  levels_q4(v, dh, mh, q);
  for (int j = 0; j < kQBlock; j++) {
    uint8_t& byte = block->q[j / kQGroup][i % 8][j % kQGroup];
    byte = i < 8 ? uint8_t((byte & 0xf0) | int(q[j])) : uint8_t((byte & 0x0f) | int(q[j]) << 4);
  }
}

void quantize_q8(const float* v, BlockQ8* block, int i) {
  float amax = 0.f;
  for (int j = 0; j < kQBlock; j++) amax = std::max(amax, std::fabs(v[j]));
  const uint16_t dh = f32_to_f16(block_step(v, amax, -127, 127));
  block->scale[i] = dh;
  const float d = f16_to_f32(dh), inv = d != 0.f ? 1.f / d : 0.f;
  for (int j = 0; j < kQBlock; j++)
    block->q[j / kQGroup][i][j % kQGroup] = int8_t(quant_level(v[j] * inv, -127, 127));
}

}  // namespace

size_t panel_bytes(WType t, int n, int k) {
  const size_t panels = size_t(pad_to(n, kPanel)) / kPanel;
  if (wtype_quantized(t)) return panels * (pad_to(k) / qblock_values(t)) * qblock_bytes(t);
  return panels * kPanel * pad_to(k) * wtype_size(t);
}

void pack_panels(const void* src, WType t, int n, int k, void* dst) {
  std::memset(dst, 0, panel_bytes(t, n, k));
  pack_panel_range(src, t, n, k, dst, 0, pad_to(n, kPanel) / kPanel);
}

const BlockQ4K* q4k_block(const void* packed, int kp, int r, int c) {
  return static_cast<const BlockQ4K*>(packed) + size_t(r / kPanel) * (kp / kSuperBlock) +
         c / kSuperBlock;
}

namespace {

// Sub-block s's 6-bit scale and min from a Q4_K block's 12 packed bytes (ggml's
// get_scale_min_k4): the first four whole in the low 6 bits of bytes 0-3 and 4-7, the last four
// as a nibble of bytes 8-11 and those bytes' top 2 bits.
void ggml_scale_min(const uint8_t* q, int s, uint8_t* sc, uint8_t* mn) {
  if (s < 4) {
    *sc = q[s] & 63, *mn = q[s + 4] & 63;
  } else {
    *sc = uint8_t((q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4));
    *mn = uint8_t((q[s + 4] >> 4) | ((q[s] >> 6) << 4));
  }
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// f(r, b) for the rows [r0, r0 + rows) and super-blocks [0, nb) of a matrix, a panel at a time and
// in it by super-block: each BlockQ4K / BlockQ6K is written whole while it is in L1 (by rows, a
// panel's blocks of an 8960-wide matrix spilled L2, and loading ran at 0.5 GB/s).
template <class F>
void by_block(int rows, int r0, int nb, const F& f) {
  for (int p0 = r0; p0 < r0 + rows; p0 = (p0 / kPanel + 1) * kPanel) {
    const int p1 = std::min(r0 + rows, (p0 / kPanel + 1) * kPanel);
    for (int b = 0; b < nb; b++)
      for (int r = p0; r < p1; r++) f(r, b);
  }
}

// Row i's 4 nibbles (v: one in the low half of each byte) into the 4 bytes at p, which hold
// rows i % 8 (low nibbles) and i % 8 + 8 (high).
void merge_nibbles(uint8_t* p, uint32_t v, int i) {
  const uint32_t old = load_u32(p);
  store_u32(p, i < 8 ? (old & 0xF0F0F0F0u) | v : (old & 0x0F0F0F0Fu) | v << 4);
}

}  // namespace

// ggml's Q4_K block: d (fp16), dmin (fp16), scales[12], qs[128]; values 64 at a time, the first
// 32 in the low nibbles of 32 bytes of qs and the next 32 in their high nibbles.
void q4k_from_ggml(const uint8_t* src, int rows, int r0, int k, void* dst) {
  const int nb = k / kSuperBlock;
  by_block(rows, r0, nb, [&](int r, int b) {
    const int i = r % kPanel;
    {
      const uint8_t* g = src + (size_t(r - r0) * nb + b) * kGgmlQ4KBytes;
      BlockQ4K& out = *const_cast<BlockQ4K*>(q4k_block(dst, k, r, b * kSuperBlock));
      std::memcpy(&out.d[i], g, 2);
      std::memcpy(&out.dmin[i], g + 2, 2);
      for (int s = 0; s < kSubBlocks; s++)
        ggml_scale_min(g + 4, s, &out.sc[s][i], &out.mn[s / 2][i][s % 2]);
      // 4 k-steps at a time: 4 source bytes' nibbles into the 4 bytes of the group, in row i's
      // half of each (word operations: a load takes about as long as reading the file)
      const uint8_t* qs = g + 16;
      for (int c = 0; c < kSuperBlock; c += kQGroup) {
        const uint32_t v = load_u32(qs + c / 64 * 32 + c % 32) >> (c % 64 < 32 ? 0 : 4);
        merge_nibbles(&out.q[c / kQBlock][c % kQBlock / kQGroup][i % 8][0], v & 0x0F0F0F0Fu, i);
      }
    }
  });
}

void ggml_from_q4k(const void* packed, int r, int k, uint8_t* out) {
  const int i = r % kPanel;
  for (int b = 0; b < k / kSuperBlock; b++) {
    const BlockQ4K& q = *q4k_block(packed, k, r, b * kSuperBlock);
    uint8_t* g = out + size_t(b) * kGgmlQ4KBytes;
    std::memcpy(g, &q.d[i], 2);
    std::memcpy(g + 2, &q.dmin[i], 2);
    uint8_t sc[kSubBlocks], mn[kSubBlocks];
    for (int s = 0; s < kSubBlocks; s++) sc[s] = q.sc[s][i], mn[s] = uint8_t(q4k_min(q, i, s));
    ggml_scales_mins(sc, mn, g + 4);
    uint8_t* qs = g + 16;
    std::memset(qs, 0, 128);
    for (int c = 0; c < kSuperBlock; c++)
      qs[c / 64 * 32 + c % 32] |= uint8_t(q4k_nibble(q, i, c) << (c % 64 < 32 ? 0 : 4));
  }
}

const BlockQ6K* q6k_block(const void* packed, int kp, int r, int c) {
  return static_cast<const BlockQ6K*>(packed) + size_t(r / kPanel) * (kp / kSuperBlock) +
         c / kSuperBlock;
}

// ggml's Q6_K block: ql[128], qh[64], int8 scales[16], fp16 d. Value c = 128 h + 32 s + l (s < 4,
// l < 32): low nibble s / 2 of ql[64 h + 32 (s % 2) + l], high bits 2 s of qh[32 h + l].
void q6k_from_ggml(const uint8_t* src, int rows, int r0, int k, void* dst) {
  const int nb = k / kSuperBlock;
  by_block(rows, r0, nb, [&](int r, int b) {
    const int i = r % kPanel;
    {
      const uint8_t* g = src + (size_t(r - r0) * nb + b) * kGgmlQ6KBytes;
      BlockQ6K& out = *const_cast<BlockQ6K*>(q6k_block(dst, k, r, b * kSuperBlock));
      std::memcpy(&out.d[i], g + 208, 2);
      for (int s = 0; s < kSubBlocks16; s++) out.sc[s][i] = int8_t(g[192 + s]);
      for (int c = 0; c < kSuperBlock; c += kQGroup) {  // 4 k-steps at a time, as Q4K's
        const int h = c / 128, s = c / 32 % 4, l = c % 32, grp = c / kQGroup;
        const uint32_t low = load_u32(g + 64 * h + 32 * (s % 2) + l) >> (4 * (s / 2));
        const uint32_t high = load_u32(g + 128 + 32 * h + l) >> (2 * s) & 0x03030303u;
        // the first group of a pair or quad writes the row's 4 bytes, the others add to them
        BlockQ6K::Sub& sub = out.sub[grp / 4];
        const int g4 = grp % 4;
        uint8_t* lo = &sub.ql[g4 / 2][i][0];
        const uint32_t l4 = (low & 0x0F0F0F0Fu) << (4 * (g4 % 2));
        store_u32(lo, g4 % 2 ? load_u32(lo) | l4 : l4);
        store_u32(&sub.qh[i][0], g4 ? load_u32(&sub.qh[i][0]) | high << (2 * g4) : high);
      }
    }
  });
}

void ggml_from_q6k(const void* packed, int r, int k, uint8_t* out) {
  const int i = r % kPanel;
  for (int b = 0; b < k / kSuperBlock; b++) {
    const BlockQ6K& q = *q6k_block(packed, k, r, b * kSuperBlock);
    uint8_t* g = out + size_t(b) * kGgmlQ6KBytes;
    std::memset(g, 0, 192);
    for (int c = 0; c < kSuperBlock; c++) {
      const int v = q6k_level(q, i, c), h = c / 128, s = c / 32 % 4, l = c % 32;
      g[64 * h + 32 * (s % 2) + l] |= uint8_t((v & 0xF) << (4 * (s / 2)));
      g[128 + 32 * h + l] |= uint8_t((v >> 4) << (2 * s));
    }
    for (int s = 0; s < kSubBlocks16; s++) g[192 + s] = uint8_t(q.sc[s][i]);
    std::memcpy(g + 208, &q.d[i], 2);
  }
}

void k_from_ggml(WType t, const uint8_t* src, int rows, int r0, int k, void* dst) {
  if (t == WType::Q4K)
    q4k_from_ggml(src, rows, r0, k, dst);
  else
    q6k_from_ggml(src, rows, r0, k, dst);
}

void ggml_from_k(WType t, const void* packed, int r, int k, uint8_t* out) {
  if (t == WType::Q4K)
    ggml_from_q4k(packed, r, k, out);
  else
    ggml_from_q6k(packed, r, k, out);
}

void copy_panel_row(const void* src, int rs, void* dst, int rd, WType t, int kp) {
  if (wtype_super(t)) {  // through ggml's row: each row's fields are spread over its block
    std::vector<uint8_t> row(size_t(kp / kSuperBlock) * ggml_block_bytes(t));
    ggml_from_k(t, src, rs, kp, row.data());
    k_from_ggml(t, row.data(), 1, rd, kp, dst);
    return;
  }
  if (t == WType::Q8) {
    for (int c = 0; c < kp; c += kQBlock) {
      const BlockQ8* a = block_at<BlockQ8>(src, kp, rs, c);
      BlockQ8* b = block_at<BlockQ8>(dst, kp, rd, c);
      b->scale[rd % kPanel] = a->scale[rs % kPanel];
      for (int g = 0; g < kQBlock / kQGroup; g++)
        std::memcpy(b->q[g][rd % kPanel], a->q[g][rs % kPanel], kQGroup);
    }
    return;
  }
  if (t == WType::Q4) {
    // a byte holds rows r and r + 8 of a panel (low and high nibble): only this row's nibble moves
    const int sh_a = rs % kPanel / (kPanel / 2) * 4, sh_b = rd % kPanel / (kPanel / 2) * 4;
    for (int c = 0; c < kp; c += kQBlock) {
      const BlockQ4* a = block_at<BlockQ4>(src, kp, rs, c);
      BlockQ4* b = block_at<BlockQ4>(dst, kp, rd, c);
      b->scale[rd % kPanel] = a->scale[rs % kPanel];
      b->min[rd % kPanel] = a->min[rs % kPanel];
      for (int g = 0; g < kQBlock / kQGroup; g++)
        for (int e = 0; e < kQGroup; e++) {
          const uint8_t q = (a->q[g][rs % (kPanel / 2)][e] >> sh_a) & 0xF;
          uint8_t& byte = b->q[g][rd % (kPanel / 2)][e];
          byte = uint8_t((byte & ~(0xF << sh_b)) | (q << sh_b));
        }
    }
    return;
  }
  const size_t size = wtype_size(t);
  for (int c = 0; c < kp; c++)
    std::memcpy(static_cast<char*>(dst) + float_index(t, rd, c, kp) * size,
                static_cast<const char*>(src) + float_index(t, rs, c, kp) * size, size);
}

void pack_panel_range(const void* src, WType t, int n, int k, void* dst, int p0, int p1) {
  const int kp = pad_to(k), r0 = p0 * kPanel, r1 = std::min(n, p1 * kPanel);
  if (t == WType::Q4K) {  // through ggml's Q4_K blocks, row by row
    if (k % kSuperBlock) throw std::invalid_argument("Q4K rows are whole super-blocks of 256");
    std::vector<uint8_t> row(size_t(k / kSuperBlock) * kGgmlQ4KBytes);
    for (int r = r0; r < r1; r++) {
      quantize_q4k_ggml(static_cast<const float*>(src) + size_t(r - r0) * k, k, row.data());
      q4k_from_ggml(row.data(), 1, r, k, dst);
    }
    return;
  }
  if (t == WType::Q6K)  // no quantizer of its own: it holds a GGUF's Q6_K blocks (k_from_ggml)
    throw std::invalid_argument("Q6K packs ggml Q6_K blocks only, not floats");
  if (wtype_quantized(t)) {
    const float* f = static_cast<const float*>(src);
    float v[kQBlock];
    for (int r = r0; r < r1; r++)
      for (int c0 = 0; c0 < kp; c0 += kQBlock) {
        for (int j = 0; j < kQBlock; j++) v[j] = c0 + j < k ? f[size_t(r - r0) * k + c0 + j] : 0.f;
        if (t == WType::Q4)
          quantize_q4(v, block_at<BlockQ4>(dst, kp, r, c0), r % kPanel);
        else
          quantize_q8(v, block_at<BlockQ8>(dst, kp, r, c0), r % kPanel);
      }
    return;
  }
  const size_t es = wtype_size(t);
  if (t == WType::BF16P) {  // subnormals stored as the kernels read them (zero)
    const uint16_t* h = static_cast<const uint16_t*>(src);
    for (int r = r0; r < r1; r++)
      for (int c = 0; c < k; c++)
        static_cast<uint16_t*>(dst)[float_index(t, r, c, kp)] =
            bf16_flush_subnormal(h[size_t(r - r0) * k + c]);
    return;
  }
  for (int r = r0; r < r1; r++)
    for (int c = 0; c < k; c++)
      std::memcpy(static_cast<char*>(dst) + panel_index(r, c, kp) * es,
                  static_cast<const char*>(src) + (size_t(r - r0) * k + c) * es, es);
}

int panel_q(const void* packed, WType t, int kp, int r, int c, float* scale, float* min) {
  const int i = r % kPanel, j = c % kQBlock;
  if (t == WType::Q8) {
    const BlockQ8* b = block_at<BlockQ8>(packed, kp, r, c);
    *scale = f16_to_f32(b->scale[i]), *min = 0.f;
    return b->q[j / kQGroup][i][j % kQGroup];
  }
  const BlockQ4* b = block_at<BlockQ4>(packed, kp, r, c);
  *scale = f16_to_f32(b->scale[i]), *min = f16_to_f32(b->min[i]);
  const uint8_t byte = b->q[j / kQGroup][i % 8][j % kQGroup];
  return i < 8 ? byte & 0x0f : byte >> 4;
}

float panel_value(const void* packed, WType t, int kp, int r, int c) {
  if (!wtype_quantized(t)) return float_at(packed, t, float_index(t, r, c, kp));
  if (t == WType::Q4K) {  // ggml's order: (d * sc) * q - (dmin * mn), each rounded once
    const BlockQ4K& b = *q4k_block(packed, kp, r, c);
    const int i = r % kPanel, s = c % kSuperBlock / kQBlock;
    const float d = f16_to_f32(b.d[i]) * float(b.sc[s][i]);
    const float m = f16_to_f32(b.dmin[i]) * float(q4k_min(b, i, s));
    return d * float(q4k_nibble(b, i, c % kSuperBlock)) - m;
  }
  if (t == WType::Q6K) {  // ggml's order: (d * sc) * (q - 32)
    const BlockQ6K& b = *q6k_block(packed, kp, r, c);
    const int i = r % kPanel;
    return (f16_to_f32(b.d[i]) * float(b.sc[c % kSuperBlock / 16][i])) *
           float(q6k_level(b, i, c % kSuperBlock) - 32);
  }
  float scale, min;
  const int q = panel_q(packed, t, kp, r, c, &scale, &min);
  return float(q) * scale + min;
}

}  // namespace kwker
