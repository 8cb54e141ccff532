// ggml's block formats, dequantized one block at a time (layouts as ggml-common.h declares them).
// Every float operation below is one rounding in float32, in the order ggml.h's contract in
// ggml.h describes; nothing here may be reassociated.
#include "ggml.h"

#include <cstring>

#include "formats.h"
#include "iq_tables.h"

namespace kwker {

namespace {

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},
    {GgmlType::F16, "F16", 1, 2},
    {GgmlType::BF16, "BF16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},
    {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},
    {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},
    {GgmlType::Q2_K, "Q2_K", 256, 84},
    {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},
    {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},
    {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56},
    {GgmlType::TQ1_0, "TQ1_0", 256, 54},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66},
};

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float half_at(const uint8_t* p) { return f16_to_f32(u16_at(p)); }

// Q8_0: fp16 d, int8 q[32]; value d * q.
void block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; j++) y[j] = d * float(int8_t(b[2 + j]));
}

// Q4_0: fp16 d, 16 bytes of nibbles (value j: low nibble of byte j, value j + 16: its high
// nibble); value d * (q - 8).
void block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 16; j++) {
    y[j] = d * float((b[2 + j] & 0xF) - 8);
    y[j + 16] = d * float((b[2 + j] >> 4) - 8);
  }
}

// Q4_1: fp16 d, fp16 m, nibbles as Q4_0; value d * q + m.
void block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 16; j++) {
    y[j] = d * float(b[4 + j] & 0xF) + m;
    y[j + 16] = d * float(b[4 + j] >> 4) + m;
  }
}

// Q5_0 / Q5_1: fp16 d (and m), a 32-bit mask of the fifth bits (bit j for value j), nibbles as
// Q4_0. Q5_0: d * (q - 16); Q5_1: d * q + m.
template <bool kMin>
void block_q5(const uint8_t* b, float* y) {
  const float d = half_at(b), m = kMin ? half_at(b + 2) : 0.f;
  const uint8_t* p = b + (kMin ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; j++) {
    const int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    if (kMin) {
      y[j] = d * float(lo) + m;
      y[j + 16] = d * float(hi) + m;
    } else {
      y[j] = d * float(lo - 16);
      y[j + 16] = d * float(hi - 16);
    }
  }
}

// Q2_K: 16 bytes of 4-bit scale (low) and min (high) per 16 values, 64 bytes of 2-bit values,
// fp16 d, fp16 dmin. Value i = 128 h + 32 s + l (l < 32) is bits 2s of byte 32 h + l; its group
// of 16 is i / 16. Value (d * scale) * q - (dmin * min).
void block_q2_k(const uint8_t* b, float* y) {
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int i = 0; i < 256; i++) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32, g = i / 16;
    const float dl = d * float(b[g] & 0xF), ml = dmin * float(b[g] >> 4);
    y[i] = dl * float((b[16 + 32 * h + l] >> (2 * s)) & 3) - ml;
  }
}

// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, fp16 d.
// Value i = 128 h + 32 s + l: low bits as Q2_K, high bit (h * 4 + s) of mask byte l, where a clear
// bit subtracts 4. Scale g (one per 16 values) is 6 bits biased by 32.
void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
  const float d = half_at(b + 108);
  float scale[16];
  for (int g = 0; g < 16; g++) {
    const int low = g < 8 ? sc[g] & 0xF : sc[g - 8] >> 4;
    const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    scale[g] = d * float((low | (high << 4)) - 32);
  }
  for (int i = 0; i < 256; i++) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - (((hmask[l] >> (4 * h + s)) & 1) ? 0 : 4);
    y[i] = scale[i / 16] * float(q);
  }
}

// The 6-bit scales and mins of Q4_K / Q5_K's eight sub-blocks of 32 (ggml's get_scale_min_k4).
void k_scales(const uint8_t* q, float* scale, float* min) {
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      scale[j] = float(q[j] & 63);
      min[j] = float(q[j + 4] & 63);
    } else {
      scale[j] = float((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
      min[j] = float((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
  }
}

// Q4_K: fp16 d, fp16 dmin, 12 bytes of scales, 128 bytes of nibbles: sub-block 2g + n holds the
// n-th nibbles of bytes 32 g .. 32 g + 31. Q5_K adds 32 bytes of fifth bits (bit s of byte l for
// value l of sub-block s) before the nibbles. Value (d * scale) * q - (dmin * min).
template <bool kFifthBit>
void block_qk(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  float scale[8], min[8];
  k_scales(b + 4, scale, min);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (kFifthBit ? 48 : 16);
  for (int s = 0; s < 8; s++) {
    const float ds = d * scale[s], ms = dmin * min[s];
    for (int l = 0; l < 32; l++) {
      int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
      if (kFifthBit) q |= ((qh[l] >> s) & 1) << 4;
      y[32 * s + l] = ds * float(q) - ms;
    }
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales, fp16 d. Value
// i = 128 h + 32 s + l: low nibble n = s / 2 of byte 64 h + 32 (s % 2) + l, high bits 2s of byte
// 32 h + l; q - 32 times (d * scale[i / 16]).
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int i = 0; i < 256; i++) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int low = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0xF;
    const int high = (qh[32 * h + l] >> (2 * s)) & 3;
    y[i] = (d * float(sc[i / 16])) * float((low | (high << 4)) - 32);
  }
}

// Q8_K (the K-quants' dot-product partner, rarely a weight type): fp32 d, int8 q[256], 16 int16
// block sums that dequantizing ignores; value d * q.
void block_q8_k(const uint8_t* b, float* y) {
  float d;
  std::memcpy(&d, b, 4);
  for (int j = 0; j < 256; j++) y[j] = d * float(int8_t(b[4 + j]));
}

// IQ4_NL: Q4_0's layout, but a nibble picks one of 16 non-uniform levels; value d * level.
void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 16; j++) {
    y[j] = d * float(iq::kValuesIq4nl[b[2 + j] & 0xF]);
    y[j + 16] = d * float(iq::kValuesIq4nl[b[2 + j] >> 4]);
  }
}

// IQ4_XS: fp16 d, the 2 high bits of 8 6-bit scales (a uint16), their 4 low bits (4 bytes), then
// IQ4_NL's nibbles for 8 sub-blocks of 32. Value (d * (scale - 32)) * level.
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint16_t high = u16_at(b + 2);
  for (int ib = 0; ib < 8; ib++) {
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((high >> (2 * ib)) & 3) << 4);
    const float dl = d * float(ls - 32);
    const uint8_t* qs = b + 8 + 16 * ib;
    for (int j = 0; j < 16; j++) {
      y[32 * ib + j] = dl * float(iq::kValuesIq4nl[qs[j] & 0xF]);
      y[32 * ib + j + 16] = dl * float(iq::kValuesIq4nl[qs[j] >> 4]);
    }
  }
}

// The grid types: value j of a grid entry (byte j) times a scale, with its sign from bit j of a
// sign byte. gguf-py multiplies by +-1 last, which is exact, as a negation is.
inline float grid_value(uint64_t entry, int j) { return float(uint8_t(entry >> (8 * j))); }
inline float sign(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.f : 1.f; }

// IQ2_XXS: fp16 d, then per sub-block of 32 two uint32: 4 byte indices into the 256-entry grid,
// and 4 7-bit sign indices (into ksigns) under a 4-bit scale. Value
// ((d * (0.5 + scale)) * 0.25) * grid * sign.
void block_iq2_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int ib = 0; ib < 8; ib++) {
    const uint8_t* q = b + 2 + 8 * ib;
    const uint32_t aux = u32_at(q + 4);
    const float db = d * (0.5f + float(aux >> 28)) * 0.25f;
    for (int g = 0; g < 4; g++) {
      const uint64_t entry = iq::kIq2xxsGrid[q[g]];
      const uint8_t signs = iq::kSigns[(aux >> (7 * g)) & 127];
      for (int j = 0; j < 8; j++)
        y[32 * ib + 8 * g + j] = db * grid_value(entry, j) * sign(signs, j);
    }
  }
}

// IQ2_XS: fp16 d, 32 uint16 (9-bit index into the 512-entry grid, 7-bit sign index), 8 bytes of
// two 4-bit scales, one per 16 values. Value as IQ2_XXS.
void block_iq2_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int l = 0; l < 32; l++) {
    const uint16_t q = u16_at(b + 2 + 2 * l);
    const int scale = (b[66 + l / 4] >> (4 * ((l / 2) % 2))) & 0xF;
    const float db = d * (0.5f + float(scale)) * 0.25f;
    const uint64_t entry = iq::kIq2xsGrid[q & 511];
    const uint8_t signs = iq::kSigns[q >> 9];
    for (int j = 0; j < 8; j++) y[8 * l + j] = db * grid_value(entry, j) * sign(signs, j);
  }
}

// IQ2_S: fp16 d, 32 low bytes of 10-bit indices into the 1024-entry grid, 32 sign bytes (all 8
// signs stored), 8 bytes of the indices' 2 high bits, 8 bytes of scales as IQ2_XS. Value as
// IQ2_XXS.
void block_iq2_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
  for (int l = 0; l < 32; l++) {
    const int scale = (scales[l / 4] >> (4 * ((l / 2) % 2))) & 0xF;
    const float db = d * (0.5f + float(scale)) * 0.25f;
    const uint64_t entry = iq::kIq2sGrid[qs[l] | (((qh[l / 4] >> (2 * (l % 4))) & 3) << 8)];
    for (int j = 0; j < 8; j++) y[8 * l + j] = db * grid_value(entry, j) * sign(signs[l], j);
  }
}

// IQ3_XXS: fp16 d, 64 byte indices into the 256-entry grid of 4 values, then per sub-block of 32
// a uint32 of 4 7-bit sign indices under a 4-bit scale. Value
// ((d * (0.5 + scale)) * 0.5) * grid * sign.
void block_iq3_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int ib = 0; ib < 8; ib++) {
    const uint32_t aux = u32_at(b + 66 + 4 * ib);
    const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
    for (int g = 0; g < 4; g++) {
      const uint8_t signs = iq::kSigns[(aux >> (7 * g)) & 127];
      for (int j = 0; j < 8; j++) {
        const uint32_t entry = iq::kIq3xxsGrid[qs[8 * ib + 2 * g + j / 4]];
        y[32 * ib + 8 * g + j] = db * grid_value(entry, j % 4) * sign(signs, j);
      }
    }
  }
}

// IQ3_S: fp16 d, 64 low bytes of 9-bit indices into the 512-entry grid of 4 values, 8 bytes of
// their high bits, 32 sign bytes, 4 bytes of two 4-bit scales (one per 32 values). Value
// (d * (1 + 2 scale)) * grid * sign.
void block_iq3_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
  for (int i = 0; i < 256; i++) {
    const int k = i / 4, ib = i / 32;
    const float db = d * float(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0xF));
    const uint32_t entry = iq::kIq3sGrid[qs[k] | (((qh[k / 8] >> (k % 8)) & 1) << 8)];
    y[i] = db * grid_value(entry, i % 4) * sign(signs[i / 8], i % 8);
  }
}

// The 1-bit types' grid holds -1, 0 or 1 per value, shifted by +-1/8 before the scale.
inline float grid_int8(uint64_t entry, int j) { return float(int8_t(uint8_t(entry >> (8 * j)))); }
constexpr float kIq1Delta = 0.125f;

// IQ1_S: fp16 d, 32 low bytes of 11-bit indices into the 2048-entry grid, then per sub-block of
// 32 a uint16: 4 x 3 high index bits, a 3-bit scale, the delta's sign. Value
// (d * (2 scale + 1)) * (grid + delta).
void block_iq1_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int ib = 0; ib < 8; ib++) {
    const uint16_t qh = u16_at(b + 34 + 2 * ib);
    const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
    for (int g = 0; g < 4; g++) {
      const uint64_t entry = iq::kIq1sGrid[b[2 + 4 * ib + g] | (((qh >> (3 * g)) & 7) << 8)];
      for (int j = 0; j < 8; j++) y[32 * ib + 8 * g + j] = dl * (grid_int8(entry, j) + delta);
    }
  }
}

// IQ1_M: 32 low index bytes, 16 bytes of two nibbles (3 high index bits and the delta's sign per
// grid entry), 4 uint16 of 3-bit scales (one per 16 values) whose top nibbles hold fp16 d. Value
// as IQ1_S.
void block_iq1_m(const uint8_t* b, float* y) {
  const uint16_t sc[4] = {u16_at(b + 48), u16_at(b + 50), u16_at(b + 52), u16_at(b + 54)};
  const float d = f16_to_f32(
      uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)));
  for (int k = 0; k < 32; k++) {
    const int s = k / 2, nibble = (b[32 + k / 2] >> (4 * (k % 2))) & 0xF;
    const float dl = d * float(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
    const float delta = nibble & 8 ? -kIq1Delta : kIq1Delta;
    const uint64_t entry = iq::kIq1sGrid[b[k] | ((nibble & 7) << 8)];
    for (int j = 0; j < 8; j++) y[8 * k + j] = dl * (grid_int8(entry, j) + delta);
  }
}

// TQ1_0: 48 + 4 bytes of 5 (the last 4: 4) base-3 digits each, fp16 d. A byte q holds digit n as
// the top of (q * 3^n mod 256) * 3 / 256; value d * (digit - 1). Value i: digit i / 32 of byte
// i % 32 for i < 160, digit (i - 160) / 16 of byte 32 + i % 16 below 240, then digit
// (i - 240) / 4 of byte 48 + i % 4.
void block_tq1_0(const uint8_t* b, float* y) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const float d = half_at(b + 52);
  for (int i = 0; i < 256; i++) {
    const int byte = i < 160 ? i % 32 : i < 240 ? 32 + (i - 160) % 16 : 48 + (i - 240) % 4;
    const int digit = i < 160 ? i / 32 : i < 240 ? (i - 160) / 16 : (i - 240) / 4;
    const uint8_t q = uint8_t(b[byte] * kPow3[digit]);
    y[i] = d * float(((q * 3) >> 8) - 1);
  }
}

// TQ2_0: 64 bytes of 2-bit values (value 128 h + 32 s + l: bits 2s of byte 32 h + l), fp16 d;
// value d * (q - 1).
void block_tq2_0(const uint8_t* b, float* y) {
  const float d = half_at(b + 64);
  for (int i = 0; i < 256; i++) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    y[i] = d * float(((b[32 * h + l] >> (2 * s)) & 3) - 1);
  }
}

struct BlockDecoder {
  GgmlType type;
  void (*block)(const uint8_t* b, float* y);  // one block's bytes -> its t.block values
};

constexpr BlockDecoder kDecoders[] = {
    {GgmlType::Q4_0, block_q4_0},      {GgmlType::Q4_1, block_q4_1},
    {GgmlType::Q5_0, block_q5<false>}, {GgmlType::Q5_1, block_q5<true>},
    {GgmlType::Q8_0, block_q8_0},      {GgmlType::Q2_K, block_q2_k},
    {GgmlType::Q3_K, block_q3_k},      {GgmlType::Q4_K, block_qk<false>},
    {GgmlType::Q5_K, block_qk<true>},  {GgmlType::Q6_K, block_q6_k},
    {GgmlType::Q8_K, block_q8_k},      {GgmlType::IQ4_NL, block_iq4_nl},
    {GgmlType::IQ4_XS, block_iq4_xs},  {GgmlType::IQ3_XXS, block_iq3_xxs},
    {GgmlType::IQ3_S, block_iq3_s},    {GgmlType::IQ2_XXS, block_iq2_xxs},
    {GgmlType::IQ2_XS, block_iq2_xs},  {GgmlType::IQ2_S, block_iq2_s},
    {GgmlType::IQ1_S, block_iq1_s},    {GgmlType::IQ1_M, block_iq1_m},
    {GgmlType::TQ1_0, block_tq1_0},    {GgmlType::TQ2_0, block_tq2_0},
};

}  // namespace

const GgmlTypeInfo* ggml_type_info(int id) {
  for (const GgmlTypeInfo& t : kTypes)
    if (int(t.type) == id) return &t;
  return nullptr;
}

void ggml_dequantize_row(const GgmlTypeInfo& t, const uint8_t* src, int k, float* out) {
  if (t.type == GgmlType::F32) {
    std::memcpy(out, src, sizeof(float) * k);
    return;
  }
  if (t.type == GgmlType::F16 || t.type == GgmlType::BF16) {
    for (int i = 0; i < k; i++) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = t.type == GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    return;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  for (const BlockDecoder& decoder : kDecoders)
    if (decoder.type == t.type) block = decoder.block;
  for (int b = 0; b < k / t.block; b++) block(src + size_t(b) * t.block_bytes, out + b * t.block);
}

}  // namespace kwker
