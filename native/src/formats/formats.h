// Weight formats and the packed layout the kernels read: the element types, the quantized blocks
// (plain structs), one trait row per format, and the load-time packer and quantizer (pack.cpp).
//
// A weight matrix [n, k] is packed in panels of kPanel rows, k padded with zeros to kp = pad_to(k):
//   float formats: [n_pad / kPanel][kp][kPanel] elements, so that one load brings kPanel outputs'
//   weights for one k (the layout an outer-product kernel streams); quantized formats: per panel,
//   kp / kQBlock blocks (BlockQ8 / BlockQ4 below), each kQBlock columns of the panel's kPanel rows.
//   BF16P (bf16 for the dot-product kernels) keeps a panel's k in pairs: [n_pad / kPanel][kp / 2]
//   [kPanel][2], so that a row's two consecutive k share one 32-bit word (k even in the low half),
//   the operand of VDPBF16PS.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kwker {

// Rows are padded to kPad floats: a multiple of the quantization block and of every register width.
constexpr int kPad = 32;
constexpr int kPanel = 16;  // weight rows per packed panel

inline int pad_to(int n, int m = kPad) { return (n + m - 1) / m * m; }

// BF16P: bf16 weights whose matmul rounds the activations to bf16 too (kernels.h, "BF16P").
enum class WType : int { F32 = 0, BF16 = 1, F16 = 2, Q8 = 3, Q4 = 4, BF16P = 5 };
constexpr int kWTypes = 6;
constexpr int kQBlock = 32;  // weights per quantization block, along k
// k-steps per group: what one integer dot-product instruction takes per lane
constexpr int kQGroup = 4;

// Q8: value = q * scale, q in [-127, 127] (symmetric), scale fp16. The 32 columns of a block are 8
// groups of 4 k-steps; a group holds, for each of the kPanel rows, its 4 consecutive values: the
// layout maddubs and vpdpbusd consume (one 4-byte broadcast of the activations meets 4 k-steps of
// every row). 8.5 bits per weight.
struct BlockQ8 {
  uint16_t scale[kPanel];                        // fp16, per row
  int8_t q[kQBlock / kQGroup][kPanel][kQGroup];  // [group][row][k step]
};
static_assert(sizeof(BlockQ8) == 544, "BlockQ8: 16 fp16 scales + 512 weights");

// Q4: value = q * scale + min, q in [0, 15] (asymmetric, as ggml's Q4_1: a block whose values are
// not centred on zero keeps all 16 levels), scale and min fp16. A group packs two rows per byte:
// byte r * 4 + e holds row r (low nibble) and row r + 8 (high nibble) at k step e. 5 bits per
// weight.
struct BlockQ4 {
  uint16_t scale[kPanel];                             // fp16, per row
  uint16_t min[kPanel];                               // fp16, per row
  uint8_t q[kQBlock / kQGroup][kPanel / 2][kQGroup];  // [group][row % 8][k step], nibble by row / 8
};
static_assert(sizeof(BlockQ4) == 320, "BlockQ4: 16 fp16 scales + 16 fp16 mins + 512 nibbles");

// What the matmul of a format reads as activations: float rows, or rows quantized to int8 per block
// (QRows).
enum class ActivationFormat { Float32, Int8Blocks };

// One row per format: its name, the activations its kernels take, and its size.
struct FormatTraits {
  WType type;
  const char* name;
  ActivationFormat activations;
  size_t element_bytes;  // float formats: one weight; quantized: 0
  size_t block_bytes;    // quantized formats: one block of kPanel rows x kQBlock columns; float: 0
  double bits_per_weight;
};
inline constexpr FormatTraits kFormats[kWTypes] = {
    {WType::F32, "F32", ActivationFormat::Float32, 4, 0, 32.0},
    {WType::BF16, "BF16", ActivationFormat::Float32, 2, 0, 16.0},
    {WType::F16, "F16", ActivationFormat::Float32, 2, 0, 16.0},
    {WType::Q8, "Q8", ActivationFormat::Int8Blocks, 0, sizeof(BlockQ8),
     8.0 * sizeof(BlockQ8) / (kPanel * kQBlock)},
    {WType::Q4, "Q4", ActivationFormat::Int8Blocks, 0, sizeof(BlockQ4),
     8.0 * sizeof(BlockQ4) / (kPanel * kQBlock)},
    {WType::BF16P, "BF16P", ActivationFormat::Float32, 2, 0, 16.0},
};
constexpr const FormatTraits& format(WType t) { return kFormats[int(t)]; }

constexpr bool wtype_quantized(WType t) {
  return format(t).activations == ActivationFormat::Int8Blocks;
}
constexpr size_t wtype_size(WType t) {
  return format(t).element_bytes;
}  // element size of the float formats
// The parts of a block as the SIMD kernels address them: the header (scales, and mins for Q4), then
// its groups.
constexpr size_t qheader_bytes(WType t) {
  return t == WType::Q8 ? sizeof(BlockQ8::scale) : 2 * sizeof(BlockQ4::scale);
}
constexpr size_t qgroup_bytes(WType t) {
  return t == WType::Q8 ? sizeof(BlockQ8::q[0]) : sizeof(BlockQ4::q[0]);
}
constexpr size_t qblock_bytes(WType t) { return format(t).block_bytes; }
static_assert(offsetof(BlockQ8, q) == qheader_bytes(WType::Q8) &&
                  offsetof(BlockQ4, q) == qheader_bytes(WType::Q4),
              "a block's groups follow its header");

// Portable scalar conversions, shared by the reference kernels and weight packing.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even
// Round to nearest even, NaN kept a quiet NaN: torch's float32 -> bfloat16 conversion.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
// A bf16 subnormal as zero of its sign, as VDPBF16PS reads its operands (DAZ): BF16P weights are
// stored so, and what the kernels read is what is stored.
inline uint16_t bf16_flush_subnormal(uint16_t h) { return (h & 0x7f80) ? h : uint16_t(h & 0x8000); }
// An activation as the BF16P matmul reads it: f32_to_bf16, but a subnormal float becomes zero of
// its sign (VCVTNE2PS2BF16 treats subnormal inputs as zero; rounding could otherwise make one the
// smallest normal bf16).
inline uint16_t f32_to_bf16_daz(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return (u & 0x7f800000u) ? f32_to_bf16(f) : uint16_t((u >> 16) & 0x8000);
}

// Rounding to the nearest integer, ties to even, with plain float adds (exact for |v| < 2^22): the
// same bits on every ISA and vectorizable, unlike a libm call.
inline int round_even(float v) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  const float r = v + kMagic;
  int32_t bits, magic_bits;
  __builtin_memcpy(&bits, &r, 4);
  __builtin_memcpy(&magic_bits, &kMagic, 4);
  return bits - magic_bits;
}

// Bytes of a packed [n, k] matrix of type t.
size_t panel_bytes(WType t, int n, int k);
// Packs a row-major [n, k] matrix into zeroed panels of type t. src holds elements of type t for
// the float formats and float32 for the quantized ones (quantized here).
void pack_panels(const void* src, WType t, int n, int k, void* dst);
// The rows of panels [p0, p1) only, into a zeroed dst (panels are independent: threads can share
// the work). src holds those rows only: its first row is row p0 * kPanel of the matrix.
void pack_panel_range(const void* src, WType t, int n, int k, void* dst, int p0, int p1);
// Copies row rs of a packed matrix into row rd of another of the same type and width kp, bit for
// bit (a subset of a matrix's rows packed as the matrix is: its dot products are the same bits).
void copy_panel_row(const void* src, int rs, void* dst, int rd, WType t, int kp);
// Element (r, c) of a packed matrix, as the kernels see it (dequantized).
float panel_value(const void* packed, WType t, int kp, int r, int c);
// Index of element (r, c) in a float-format packed matrix.
inline size_t panel_index(int r, int c, int kp) {
  return (size_t(r / kPanel) * kp + c) * kPanel + r % kPanel;
}
// Index of element (r, c) in a packed matrix of float format t (BF16P: k in pairs, see above).
inline size_t float_index(WType t, int r, int c, int kp) {
  if (t != WType::BF16P) return panel_index(r, c, kp);
  return (size_t(r / kPanel) * kp + (c & ~1)) * kPanel + (r % kPanel) * 2 + (c & 1);
}
// Quantized weight (row r, column c) of a packed Q8/Q4 matrix: the integer q, the block's scale and
// min (0 for Q8).
int panel_q(const void* packed, WType t, int kp, int r, int c, float* scale, float* min);

}  // namespace kwker
