// Portable reference kernels: plain loops, written independently of the SIMD template so that they are a real
// oracle for it. They share only the definitions of the exponential and of a sum's order (canonical.h), so every
// ISA must return their bits exactly (tests/native). Also the fallback on CPUs without AVX2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "canonical.h"
#include "kernels.h"

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
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // a carry into the exponent is the right rounding
  return uint16_t(h);
}

namespace {

float float_at(const void* data, WType t, size_t i) {
  switch (t) {
    case WType::F32: return static_cast<const float*>(data)[i];
    case WType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
}

const uint8_t* qblock(const void* packed, WType t, int kp, int r, int c) {
  const size_t per_panel = size_t(kp / kQBlock) * qblock_bytes(t);
  return static_cast<const uint8_t*>(packed) + size_t(r / kPanel) * per_panel + size_t(c / kQBlock) * qblock_bytes(t);
}

// Offset of (row i of the panel, column j of the block) in a block's payload; Q4: which byte (the nibble is
// low for i < 8).
size_t qoffset(WType t, int i, int j) {
  const size_t group = size_t(j / kQGroup) * qgroup_bytes(t), e = j % kQGroup;
  return t == WType::Q8 ? group + size_t(i) * kQGroup + e : group + size_t(i % 8) * kQGroup + e;
}

// Rounding to the nearest integer, ties to even, with plain float adds (exact for |v| < 2^22): the same bits on
// every ISA and vectorizable, unlike a libm call.
inline int round_even(float v) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  float r = v + kMagic;
  int32_t bits, magic_bits;
  std::memcpy(&bits, &r, 4);
  std::memcpy(&magic_bits, &kMagic, 4);
  return bits - magic_bits;
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

// The step for a symmetric (Q8) block: the plain one (largest magnitude to the end of the range) or, if better,
// one of a few nearby steps refined by least squares (d = sum v q / sum q q for the integers q it rounds to),
// whichever has the smallest squared error.
float block_step(const float* v, float d0, int lo, int hi) {
  if (d0 == 0.f) return 0.f;  // an all-zero block
  float best = d0, best_err = quant_error(v, d0, lo, hi);
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

// Levels of an asymmetric (Q4) block for fp16 step d and min m: q = round((v - m) / d) in [0, 15]; returns the
// squared error of q * d + m.
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

// Step and min (fp16) of an asymmetric block: the plain range (min to max in 15 steps), then least-squares fits
// of (d, m) to the levels each candidate rounds to, from the plain and two slightly narrower ranges; the
// candidate with the smallest squared error after fp16 rounding wins.
void block_step_min(const float* v, uint16_t* dh, uint16_t* mh) {
  float lo = v[0], hi = v[0];
  for (int j = 1; j < kQBlock; j++) lo = std::min(lo, v[j]), hi = std::max(hi, v[j]);
  float q[kQBlock];
  *dh = f32_to_f16((hi - lo) / 15.f), *mh = f32_to_f16(lo);
  float best = levels_q4(v, *dh, *mh, q);
  for (float f : {1.0f, 0.95f, 0.9f}) {
    uint16_t d1 = f32_to_f16((hi - lo) * f / 15.f), m1 = f32_to_f16(lo + (hi - lo) * (1.f - f) / 2.f);
    for (int iter = 0; iter < 2; iter++) {
      levels_q4(v, d1, m1, q);
      double sq = 0, sv = 0, sqq = 0, sqv = 0;
      for (int j = 0; j < kQBlock; j++) sq += q[j], sv += v[j], sqq += double(q[j]) * q[j], sqv += double(q[j]) * v[j];
      const double det = kQBlock * sqq - sq * sq;
      if (det <= 0) break;  // every value on one level: the plain candidate already has it
      const double d = (kQBlock * sqv - sq * sv) / det, m = (sv - d * sq) / kQBlock;
      d1 = f32_to_f16(float(d)), m1 = f32_to_f16(float(m));
      const float err = levels_q4(v, d1, m1, q);
      if (err < best) best = err, *dh = d1, *mh = m1;
    }
  }
}

// Quantizes one row block (kQBlock values) into a packed block at row i of its panel.
void quantize_block(const float* v, WType t, uint8_t* block, int i) {
  uint8_t* payload = block + qheader_bytes(t);
  if (t == WType::Q4) {
    uint16_t dh, mh;
    block_step_min(v, &dh, &mh);
    std::memcpy(block + i * 2, &dh, 2);
    std::memcpy(block + kPanel * 2 + i * 2, &mh, 2);  // the mins follow the scales
    float q[kQBlock];
    levels_q4(v, dh, mh, q);
    for (int j = 0; j < kQBlock; j++) {
      uint8_t& byte = payload[qoffset(t, i, j)];
      byte = i < 8 ? uint8_t((byte & 0xf0) | int(q[j])) : uint8_t((byte & 0x0f) | int(q[j]) << 4);
    }
    return;
  }
  float amax = 0.f;
  for (int j = 0; j < kQBlock; j++) amax = std::max(amax, std::fabs(v[j]));
  const uint16_t dh = f32_to_f16(block_step(v, amax / 127.f, -127, 127));
  std::memcpy(block + i * 2, &dh, 2);
  const float d = f16_to_f32(dh), inv = d != 0.f ? 1.f / d : 0.f;
  for (int j = 0; j < kQBlock; j++) payload[qoffset(t, i, j)] = uint8_t(int8_t(quant_level(v[j] * inv, -127, 127)));
}

}  // namespace

size_t panel_bytes(WType t, int n, int k) {
  const size_t panels = size_t(pad_to(n, kPanel)) / kPanel;
  if (wtype_quantized(t)) return panels * (pad_to(k) / kQBlock) * qblock_bytes(t);
  return panels * kPanel * pad_to(k) * wtype_size(t);
}

void pack_panels(const void* src, WType t, int n, int k, void* dst) {
  std::memset(dst, 0, panel_bytes(t, n, k));
  pack_panel_range(src, t, n, k, dst, 0, pad_to(n, kPanel) / kPanel);
}

void pack_panel_range(const void* src, WType t, int n, int k, void* dst, int p0, int p1) {
  const int kp = pad_to(k), r0 = p0 * kPanel, r1 = std::min(n, p1 * kPanel);
  if (wtype_quantized(t)) {
    const float* f = static_cast<const float*>(src);
    float v[kQBlock];
    for (int r = r0; r < r1; r++)
      for (int c0 = 0; c0 < kp; c0 += kQBlock) {
        for (int j = 0; j < kQBlock; j++) v[j] = c0 + j < k ? f[size_t(r) * k + c0 + j] : 0.f;
        quantize_block(v, t, const_cast<uint8_t*>(qblock(dst, t, kp, r, c0)), r % kPanel);
      }
    return;
  }
  const size_t es = wtype_size(t);
  for (int r = r0; r < r1; r++)
    for (int c = 0; c < k; c++)
      std::memcpy(static_cast<char*>(dst) + panel_index(r, c, kp) * es,
                  static_cast<const char*>(src) + (size_t(r) * k + c) * es, es);
}

int panel_q(const void* packed, WType t, int kp, int r, int c, float* scale, float* min) {
  const uint8_t* block = qblock(packed, t, kp, r, c);
  const int i = r % kPanel;
  uint16_t dh, mh = 0;
  std::memcpy(&dh, block + i * 2, 2);
  if (t == WType::Q4) std::memcpy(&mh, block + kPanel * 2 + i * 2, 2);
  *scale = f16_to_f32(dh), *min = f16_to_f32(mh);
  const uint8_t byte = block[qheader_bytes(t) + qoffset(t, i, c % kQBlock)];
  if (t == WType::Q8) return int8_t(byte);
  return i < 8 ? byte & 0x0f : byte >> 4;
}

float panel_value(const void* packed, WType t, int kp, int r, int c) {
  if (!wtype_quantized(t)) return float_at(packed, t, panel_index(r, c, kp));
  float scale, min;
  const int q = panel_q(packed, t, kp, r, c, &scale, &min);
  return float(q) * scale + min;
}

void quantize_rows(const float* x, int m, int ldx, int kp, int8_t* q, float* d, float* dsum) {
  const int nb = kp / kQBlock;
  for (int t = 0; t < m; t++) {
    for (int b = 0; b < nb; b++) {
      const float* v = x + size_t(t) * ldx + b * kQBlock;
      float amax = 0.f;
      for (int j = 0; j < kQBlock; j++) {
        const float a = std::fabs(v[j]);
        amax = a > amax ? a : amax;
      }
      const float db = amax / 127.f, inv = amax > 0.f ? 1.f / db : 0.f;
      int8_t* qb = q + size_t(t) * kp + b * kQBlock;
      int s = 0;
      for (int j = 0; j < kQBlock; j++) {
        const float p = v[j] * inv;
        qb[j] = int8_t(round_even(p));
        s += qb[j];
      }
      d[size_t(t) * nb + b] = db;
      dsum[size_t(t) * nb + b] = db * float(s);
    }
  }
}

namespace {

// One fused multiply-add chain per output over k in order: the contract every ISA's kernel meets bit for bit.
template <WType T>
void matmul_generic(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1, float* y, int ldy,
                    const float* bias, bool accumulate) {
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      float s = 0.f;
      for (int k = 0; k < kp; k++) s = std::fma(x[size_t(t) * ldx + k], panel_value(w, T, kp, n, k), s);
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <WType T>
void qmatmul_generic(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y, int ldy,
                     const float* bias, bool accumulate) {
  const int nb = kp / kQBlock;
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      float s = 0.f;
      for (int b = 0; b < nb; b++) {
        int dot = 0;
        float dw = 0.f, mw = 0.f;
        for (int j = 0; j < kQBlock; j++)
          dot += panel_q(w, T, kp, n, b * kQBlock + j, &dw, &mw) * x.q[size_t(t) * kp + b * kQBlock + j];
        const float dx = x.d[size_t(t) * nb + b];
        s = std::fma(dw * dx, float(dot), s);
        if (T == WType::Q4) s = std::fma(mw, x.dsum[size_t(t) * nb + b], s);
      }
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <class KV>
float kv_value(const void* p, size_t i) {
  if constexpr (std::is_same_v<KV, float>) return static_cast<const float*>(p)[i];
  else return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

template <class KV>
void attend_part_generic(AttendPhase phase, int lo, int hi, const float* q, int g, int nt, size_t q_stride,
                         const void* k, const void* v, const int* first, const int* n, int hdp, float scale,
                         float* scores, float* out) {
  int nmax = 0;
  for (int t = 0; t < nt; t++) nmax = std::max(nmax, n[t]);
  const int ns = pad_to(nmax);
  for (int j = 0; j < g * nt; j++) {
    const int t = j / g, f = first[t], e = n[t];
    float* s = scores + size_t(j) * ns;
    if (phase == AttendPhase::Scores) {
      const float* qj = q + t * q_stride + size_t(j % g) * hdp;
      const int i1 = int(std::min<int64_t>(e, int64_t(hi) * kPanel));  // hi may be 1 << 30
      for (int i = std::max(f, lo * kPanel); i < i1; i++) {
        float dot = 0.f;
        for (int d = 0; d < hdp; d++) dot = std::fma(qj[d], kv_value<KV>(k, panel_index(i, d, hdp)), dot);
        s[i] = dot * scale;
      }
    } else if (phase == AttendPhase::Softmax) {
      if (j < lo || j >= hi) continue;
      float mx = -std::numeric_limits<float>::infinity();
      for (int i = f; i < e; i++) mx = std::fmax(mx, s[i]);
      for (int i = f; i < e; i++) s[i] = exp_canonical(s[i] - mx);
      const float sum = sum_canonical(s + f, e - f);
      for (int i = f; i < e; i++) s[i] = s[i] / sum;
      for (int c = 0; c < hdp; c++) out[size_t(j) * hdp + c] = 0.f;
    } else {
      float* o = out + size_t(j) * hdp;
      for (int i = f; i < e; i++)
        for (int c = lo; c < std::min(hi, hdp); c++) o[c] = std::fma(s[i], kv_value<KV>(v, size_t(i) * hdp + c), o[c]);
    }
  }
}

int softmax_stats_generic(const float* x, int n, float t, float close, float* max_out, double* sum_out,
                          int32_t* ids) {
  float xmax = x[0];
  for (int i = 1; i < n; i++) xmax = std::max(xmax, x[i]);
  const float mq = xmax / t, lo = mq - close;
  double sum = 0;
  int count = 0;
  float ex[kStatsBlock];
  for (int b = 0; b < n; b += kStatsBlock) {
    const int e = std::min(n, b + kStatsBlock);
    for (int j = b; j < e; j++) {
      const float q = x[j] / t;
      ex[j - b] = exp_canonical(q - mq);
      if (q >= lo) ids[count++] = j;
    }
    sum += double(sum_canonical(ex, e - b));
  }
  *max_out = mq, *sum_out = sum;
  return count;
}

void to_f16_generic(const float* x, uint16_t* out, int n) {
  for (int i = 0; i < n; i++) out[i] = f32_to_f16(x[i]);
}

template <Activation A>
void glu_generic(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; i++) {
    const float x = gate[i];
    const float z = A == Activation::GeluTanh ? 2.f * 0.7978845608028654f * std::fma(0.044715f, x * x * x, x) : x;
    out[i] = x / (1.f + exp_canonical(0.f - z)) * up[i];
  }
}

}  // namespace

const Kernels& kernels_generic() {
  static const Kernels k{"generic",
                         {matmul_generic<WType::F32>, matmul_generic<WType::BF16>, matmul_generic<WType::F16>},
                         {qmatmul_generic<WType::Q8>, qmatmul_generic<WType::Q4>},
                         quantize_rows,
                         {attend_part_generic<float>, attend_part_generic<uint16_t>},
                         {glu_generic<Activation::Silu>, glu_generic<Activation::GeluTanh>},
                         to_f16_generic,
                         softmax_stats_generic};
  return k;
}

}  // namespace kwker
