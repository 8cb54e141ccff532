// ggml's block formats, dequantized one block at a time (layouts as ggml-common.h declares them).
// Every float operation below is one rounding in float32, in the order ggml.h's contract in
// ggml.h describes; nothing here may be reassociated.
#include "ggml.h"

#include <cstring>

#include "formats.h"

namespace kwker {

namespace {

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},       {GgmlType::F16, "F16", 1, 2},
    {GgmlType::BF16, "BF16", 1, 2},     {GgmlType::Q4_0, "Q4_0", 32, 18},
    {GgmlType::Q4_1, "Q4_1", 32, 20},   {GgmlType::Q5_0, "Q5_0", 32, 22},
    {GgmlType::Q5_1, "Q5_1", 32, 24},   {GgmlType::Q8_0, "Q8_0", 32, 34},
    {GgmlType::Q2_K, "Q2_K", 256, 84},  {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144}, {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},
};

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

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
  switch (t.type) {
    case GgmlType::Q4_0:
      block = block_q4_0;
      break;
    case GgmlType::Q4_1:
      block = block_q4_1;
      break;
    case GgmlType::Q5_0:
      block = block_q5<false>;
      break;
    case GgmlType::Q5_1:
      block = block_q5<true>;
      break;
    case GgmlType::Q8_0:
      block = block_q8_0;
      break;
    case GgmlType::Q2_K:
      block = block_q2_k;
      break;
    case GgmlType::Q3_K:
      block = block_q3_k;
      break;
    case GgmlType::Q4_K:
      block = block_qk<false>;
      break;
    case GgmlType::Q5_K:
      block = block_qk<true>;
      break;
    case GgmlType::Q6_K:
      block = block_q6_k;
      break;
    default:
      break;
  }
  for (int b = 0; b < k / t.block; b++) block(src + size_t(b) * t.block_bytes, out + b * t.block);
}

}  // namespace kwker
