// The float -> Q4_K quantizer: a row of float weights into ggml's Q4_K blocks (kGgmlQ4KBytes per
// 256 values), which q4k_from_ggml then packs as Q4K. The format is ggml's, so a row quantized here
// reads back in llama.cpp (and in gguf's dequantize) as the same numbers.
//
// Per super-block of 256: each sub-block of 32 gets a step and a min by a weighted least-squares
// search, then the 8 steps and the 8 mins are rounded to 6-bit multiples of the super-block's fp16
// scale and min scale, and every value is rounded to its level under the rounded ones. The search
// is the one ggml's reference quantizer makes (weights |x| + the sub-block's RMS, so large values
// count more; 21 trial ranges around min..max, each refit by least squares); its code is ours.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "formats.h"

namespace kwker {

namespace {

constexpr int kLevels = 15;  // Q4_K's levels are 0..15

inline int nearest(float v) { return int(std::nearbyint(v)); }

// Step d and min m >= 0 of one sub-block (x[i] ~ d * q[i] - m, q in [0, 15]) minimizing the squared
// error weighted by w, and its levels q. The grid's lowest level -m is at most 0: Q4_K's mins are
// unsigned.
float fit_sub_block(const float* x, const float* w, float* m_out, int* q) {
  float lo = std::min(x[0], 0.f), hi = x[0], sw = 0.f, swx = 0.f;
  for (int i = 0; i < kQBlock; i++) {
    lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    sw += w[i], swx += w[i] * x[i];
  }
  if (hi == lo) {  // every value equal (and <= 0): the min alone holds them
    std::fill(q, q + kQBlock, 0);
    *m_out = -lo;
    return 0.f;
  }
  // The candidate's weighted squared error for step d and grid start lo over levels q.
  auto error = [&](const int* q, float d, float start) {
    float e = 0.f;
    for (int i = 0; i < kQBlock; i++) {
      const float r = d * float(q[i]) + start - x[i];
      e += w[i] * r * r;
    }
    return e;
  };
  // The plain grid: 15 steps from lo to hi.
  const float inv0 = kLevels / (hi - lo);
  float d = 1.f / inv0, start = lo;
  for (int i = 0; i < kQBlock; i++) q[i] = std::clamp(nearest(inv0 * (x[i] - lo)), 0, kLevels);
  float best = error(q, d, start);
  // Ranges of 14 to 16 steps from the best grid start so far to hi: each rounds the values to other
  // levels, refit by least squares (start kept <= 0, else refit as a step alone from 0).
  int trial[kQBlock];
  for (int s = 0; s <= 20; s++) {
    const float inv = (float(kLevels) - 1.f + 0.1f * float(s)) / (hi - start);
    float sl = 0.f, sll = 0.f, sxl = 0.f;
    for (int i = 0; i < kQBlock; i++) {
      const int l = std::clamp(nearest(inv * (x[i] - start)), 0, kLevels);
      trial[i] = l, sl += w[i] * l, sll += w[i] * l * l, sxl += w[i] * l * x[i];
    }
    const float det = sw * sll - sl * sl;
    if (det <= 0.f) continue;
    float td = (sw * sxl - swx * sl) / det, ts = (sll * swx - sl * sxl) / det;
    if (ts > 0.f) ts = 0.f, td = sxl / sll;
    const float e = error(trial, td, ts);
    if (e < best) best = e, d = td, start = ts, std::copy(trial, trial + kQBlock, q);
  }
  *m_out = -start;
  return d;
}

// One super-block of x into a ggml Q4_K block g: fp16 d, fp16 dmin, 12 scale bytes, 128 bytes of
// nibbles (values 64 at a time: the first 32 in the low nibbles of 32 bytes, the next 32 in the
// high ones).
void quantize_super_block(const float* x, uint8_t* g) {
  float steps[kSubBlocks], mins[kSubBlocks], w[kQBlock], max_step = 0.f, max_min = 0.f;
  int levels[kSuperBlock];
  for (int s = 0; s < kSubBlocks; s++) {
    const float* v = x + s * kQBlock;
    float sum_x2 = 0.f;
    for (int i = 0; i < kQBlock; i++) sum_x2 += v[i] * v[i];
    const float rms = std::sqrt(sum_x2 / kQBlock);
    for (int i = 0; i < kQBlock; i++) w[i] = rms + std::fabs(v[i]);
    steps[s] = fit_sub_block(v, w, &mins[s], levels + s * kQBlock);
    max_step = std::max(max_step, steps[s]), max_min = std::max(max_min, mins[s]);
  }
  // The 6-bit fields: multiples of d = max_step / 63 and dmin = max_min / 63.
  const float inv_step = max_step > 0.f ? 63.f / max_step : 0.f;
  const float inv_min = max_min > 0.f ? 63.f / max_min : 0.f;
  uint8_t sc[kSubBlocks], mn[kSubBlocks];
  for (int s = 0; s < kSubBlocks; s++) {
    sc[s] = uint8_t(std::min(63, nearest(inv_step * steps[s])));
    mn[s] = uint8_t(std::min(63, nearest(inv_min * mins[s])));
  }
  const uint16_t dh = f32_to_f16(max_step / 63.f), mh = f32_to_f16(max_min / 63.f);
  std::memcpy(g, &dh, 2);
  std::memcpy(g + 2, &mh, 2);
  ggml_scales_mins(sc, mn, g + 4);
  // Each value's level under the rounded fields, as the kernels will read it: (d sc) q - dmin mn
  // (a sub-block whose step rounded to 0 keeps its fit's levels: they multiply 0).
  const float d = f16_to_f32(dh), dmin = f16_to_f32(mh);
  for (int s = 0; s < kSubBlocks; s++) {
    const float step = d * float(sc[s]), m = dmin * float(mn[s]);
    for (int c = s * kQBlock; step != 0.f && c < (s + 1) * kQBlock; c++)
      levels[c] = std::clamp(nearest((x[c] + m) / step), 0, kLevels);
  }
  uint8_t* qs = g + 16;
  std::memset(qs, 0, 128);
  for (int c = 0; c < kSuperBlock; c++)
    qs[c / 64 * 32 + c % 32] |= uint8_t(levels[c] << (c % 64 < 32 ? 0 : 4));
}

}  // namespace

void quantize_q4k_ggml(const float* x, int k, uint8_t* out) {
  if (k % kSuperBlock) throw std::invalid_argument("Q4_K rows are whole super-blocks of 256");
  for (int b = 0; b < k / kSuperBlock; b++)
    quantize_super_block(x + size_t(b) * kSuperBlock, out + size_t(b) * kGgmlQ4KBytes);
}

WType q4_or_q4k(const float* rows, int nr, int k) {
  // Both formats' squared error over the rows, packed as the loader packs them.
  const int kp = pad_to(k);
  std::vector<uint8_t> q4(panel_bytes(WType::Q4, nr, k)), q4k(panel_bytes(WType::Q4K, nr, k));
  pack_panel_range(rows, WType::Q4, nr, k, q4.data(), 0, 1);
  pack_panel_range(rows, WType::Q4K, nr, k, q4k.data(), 0, 1);
  double e4 = 0, e4k = 0;
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < k; c++) {
      const double x = rows[size_t(r) * k + c];
      const double a = panel_value(q4.data(), WType::Q4, kp, r, c) - x;
      const double b = panel_value(q4k.data(), WType::Q4K, kp, r, c) - x;
      e4 += a * a, e4k += b * b;
    }
  // 0.375 bits fewer a weight are worth 2^0.375 times the RMS error (6 dB a bit), 2^0.75 squared
  return e4k <= std::exp2(0.75) * e4 ? WType::Q4K : WType::Q4;
}

void ggml_scales_mins(const uint8_t* sc, const uint8_t* mn, uint8_t* out) {
  for (int j = 0; j < 4; j++) {
    out[j] = uint8_t(sc[j] | (sc[j + 4] >> 4) << 6);
    out[j + 4] = uint8_t(mn[j] | (mn[j + 4] >> 4) << 6);
    out[j + 8] = uint8_t((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
  }
}

}  // namespace kwker
