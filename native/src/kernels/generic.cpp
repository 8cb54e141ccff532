// Portable reference kernels: plain loops, written independently of the SIMD template so that they
// are a real oracle for it. They share only the definitions of the exponential and of a sum's order
// (canonical.h), so every ISA must return their bits exactly (tests/native). Also the fallback on
// CPUs without AVX2.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "canonical.h"
#include "kernels.h"

namespace kwker {

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

// The same, with one scale per super-block and the integer sum of each block of kQBlock levels.
// Plain loops on every ISA (a pass over the activations, small beside the matmuls it feeds).
void quantize_rows_super(const float* x, int m, int ldx, int kp, int8_t* q, float* d, int16_t* sums,
                         int16_t* sums16) {
  const int nsb = kp / kSuperBlock;
  for (int t = 0; t < m; t++) {
    for (int b = 0; b < nsb; b++) {
      const float* v = x + size_t(t) * ldx + b * kSuperBlock;
      float amax = 0.f;
      for (int j = 0; j < kSuperBlock; j++) {
        const float a = std::fabs(v[j]);
        amax = a > amax ? a : amax;
      }
      const float db = amax / 127.f, inv = amax > 0.f ? 1.f / db : 0.f;
      int8_t* qb = q + size_t(t) * kp + b * kSuperBlock;
      for (int j = 0; j < kSuperBlock; j++) qb[j] = int8_t(round_even(v[j] * inv));
      for (int s = 0; s < kSubBlocks16; s++) {
        int sum = 0;
        for (int j = s * 16; j < (s + 1) * 16; j++) sum += qb[j];
        sums16[size_t(t) * (kp / 16) + b * kSubBlocks16 + s] = int16_t(sum);
      }
      for (int s = 0; s < kSubBlocks; s++)
        sums[size_t(t) * (kp / kQBlock) + b * kSubBlocks + s] =
            int16_t(sums16[size_t(t) * (kp / 16) + b * kSubBlocks16 + 2 * s] +
                    sums16[size_t(t) * (kp / 16) + b * kSubBlocks16 + 2 * s + 1]);
      d[size_t(t) * nsb + b] = db;
    }
  }
}

namespace {

// One fused multiply-add chain per output over k in order: the contract every ISA's kernel meets
// bit for bit.
template <WType T>
void matmul_generic(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1, float* y,
                    int ldy, const float* bias, bool accumulate) {
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      float s = 0.f;
      for (int k = 0; k < kp; k++)
        s = fma_rn(x[size_t(t) * ldx + k], panel_value(w, T, kp, n, k), s);
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

// BF16P (kernels.h): the activations rounded to bf16, the chain over k in pairs, odd k first, each
// step flushed as VDPBF16PS flushes.
void matmul_generic_bf16p(const float* x, int m, int ldx, const void* w, int kp, int p0, int p1,
                          float* y, int ldy, const float* bias, bool accumulate) {
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      float s = 0.f;
      for (int k = 0; k < kp; k += 2) {
        for (int e : {k + 1, k}) {
          const float xe = bf16_to_f32(f32_to_bf16_daz(x[size_t(t) * ldx + e]));
          s = fma_ftz(xe, panel_value(w, WType::BF16P, kp, n, e), s);
        }
      }
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <WType T>
void qmatmul_generic(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y,
                     int ldy, const float* bias, bool accumulate) {
  const int nb = kp / kQBlock;
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      float s = 0.f;
      for (int b = 0; b < nb; b++) {
        int dot = 0;
        float dw = 0.f, mw = 0.f;
        for (int j = 0; j < kQBlock; j++)
          dot += panel_q(w, T, kp, n, b * kQBlock + j, &dw, &mw) *
                 x.q[size_t(t) * kp + b * kQBlock + j];
        const float dx = x.d[size_t(t) * nb + b];
        s = fma_rn(dw * dx, float(dot), s);
        if (T == WType::Q4) s = fma_rn(mw, x.dsum[size_t(t) * nb + b], s);
      }
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Q4K (kernels.h): integer sums over a super-block's sub-blocks, then two FMAs per super-block.
void qmatmul_generic_q4k(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y,
                         int ldy, const float* bias, bool accumulate) {
  const int nsb = kp / kSuperBlock;
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      const int i = n % kPanel;
      float s = 0.f;
      for (int b = 0; b < nsb; b++) {
        const BlockQ4K& blk = *q4k_block(w, kp, n, b * kSuperBlock);
        const int8_t* xq = x.q + size_t(t) * kp + b * kSuperBlock;
        const int16_t* xs = x.sums + size_t(t) * (kp / kQBlock) + b * kSubBlocks;
        int32_t s1 = 0, s2 = 0;
        for (int sb = 0; sb < kSubBlocks; sb++) {
          int32_t dot = 0;
          for (int j = sb * kQBlock; j < (sb + 1) * kQBlock; j++)
            dot += q4k_nibble(blk, i, j) * xq[j];
          s1 += int32_t(blk.sc[sb][i]) * dot;
          s2 += q4k_min(blk, i, sb) * int32_t(xs[sb]);
        }
        const float dx = x.d[size_t(t) * nsb + b];
        s = fma_rn(f16_to_f32(blk.d[i]) * dx, float(s1), s);
        s = fma_rn(f16_to_f32(blk.dmin[i]) * dx, float(-s2), s);
      }
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Q6K (kernels.h): per sub-block of 16, the integer dot product less 32 times the activations'
// sum, times the sub-block's scale; one FMA per super-block.
void qmatmul_generic_q6k(const QRows& x, int m, const void* w, int kp, int p0, int p1, float* y,
                         int ldy, const float* bias, bool accumulate) {
  const int nsb = kp / kSuperBlock;
  for (int t = 0; t < m; t++) {
    for (int n = p0 * kPanel; n < p1 * kPanel; n++) {
      const int i = n % kPanel;
      float s = 0.f;
      for (int b = 0; b < nsb; b++) {
        const BlockQ6K& blk = *q6k_block(w, kp, n, b * kSuperBlock);
        const int8_t* xq = x.q + size_t(t) * kp + b * kSuperBlock;
        const int16_t* xs = x.sums16 + size_t(t) * (kp / 16) + b * kSubBlocks16;
        int32_t sum = 0;
        for (int sb = 0; sb < kSubBlocks16; sb++) {
          int32_t dot = 0;
          for (int j = sb * 16; j < (sb + 1) * 16; j++) dot += q6k_level(blk, i, j) * xq[j];
          sum += int32_t(blk.sc[sb][i]) * (dot - 32 * int32_t(xs[sb]));
        }
        s = fma_rn(f16_to_f32(blk.d[i]) * x.d[size_t(t) * nsb + b], float(sum), s);
      }
      if (bias) s += bias[n];
      float* out = y + size_t(t) * ldy + n;
      *out = accumulate ? *out + s : s;
    }
  }
}

template <class KV>
float kv_value(const void* p, size_t i) {
  if constexpr (std::is_same_v<KV, float>)
    return static_cast<const float*>(p)[i];
  else
    return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

template <class KV>
void attend_part_generic(AttendPhase phase, int lo, int hi, const float* q, int g, int nt,
                         size_t q_stride, const void* k, const void* v, const int* first,
                         const int* n, int hdp, float scale, float* scores, float* out) {
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
        for (int d = 0; d < hdp; d++)
          dot = fma_rn(qj[d], kv_value<KV>(k, panel_index(i, d, hdp)), dot);
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
        for (int c = lo; c < std::min(hi, hdp); c++)
          o[c] = fma_rn(s[i], kv_value<KV>(v, size_t(i) * hdp + c), o[c]);
    }
  }
}

int softmax_stats_generic(const float* x, int n, float t, float close, float* max_out,
                          double* sum_out, int32_t* ids) {
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

int argmax_generic(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

void to_f16_generic(const float* x, uint16_t* out, int n) {
  for (int i = 0; i < n; i++) out[i] = f32_to_f16(x[i]);
}

template <Activation A>
void glu_generic(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; i++) {
    const float x = gate[i];
    const float z =
        A == Activation::GeluTanh ? 2.f * 0.7978845608028654f * fma_rn(0.044715f, x * x * x, x) : x;
    out[i] = x / (1.f + exp_canonical(0.f - z)) * up[i];
  }
}

}  // namespace

const Kernels& kernels_generic() {
  static const Kernels k{
      "generic",
      {matmul_generic<WType::F32>, matmul_generic<WType::BF16>, matmul_generic<WType::F16>, nullptr,
       nullptr, matmul_generic_bf16p},
      {nullptr, nullptr, nullptr, qmatmul_generic<WType::Q8>, qmatmul_generic<WType::Q4>, nullptr,
       qmatmul_generic_q4k, qmatmul_generic_q6k},
      quantize_rows,
      {attend_part_generic<float>, attend_part_generic<uint16_t>},
      {glu_generic<Activation::Silu>, glu_generic<Activation::GeluTanh>},
      to_f16_generic,
      softmax_stats_generic,
      argmax_generic};
  return k;
}

}  // namespace kwker
