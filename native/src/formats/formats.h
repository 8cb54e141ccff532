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
enum class WType : int { F32 = 0, BF16 = 1, F16 = 2, Q8 = 3, Q4 = 4, BF16P = 5, Q4K = 6, Q6K = 7 };
constexpr int kWTypes = 8;
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

// Q4K: ggml's Q4_K, held exactly (a GGUF's Q4_K blocks are rearranged, never requantized). A row's
// super-block of kSuperBlock values has an fp16 scale d and min dmin, and 8 sub-blocks of 32 with
// 6-bit integer scales sc and mins mn: value = d * sc * q - dmin * mn, q in [0, 15]. In a panel, a
// super-block's 16 rows are one BlockQ4K: the headers by row (so that a register of 16 int32 lanes,
// one per row, loads them), then each sub-block's nibbles in Q4's group layout. The mins are in
// pairs of sub-blocks, (mn[2i], mn[2i + 1]) side by side for each row: widened to int16, a pair is
// one 32-bit lane of pmaddwd. 4.625 bits per weight (ggml: 4.5; the 6-bit fields are unpacked).
constexpr int kSuperBlock = 256;
constexpr int kSubBlocks = kSuperBlock / kQBlock;  // 8
struct BlockQ4K {
  uint16_t d[kPanel];                                             // fp16, per row
  uint16_t dmin[kPanel];                                          // fp16, per row
  uint8_t sc[kSubBlocks][kPanel];                                 // [sub-block][row], 0..63
  uint8_t mn[kSubBlocks / 2][kPanel][2];                          // [pair][row][which], 0..63
  uint8_t q[kSubBlocks][kQBlock / kQGroup][kPanel / 2][kQGroup];  // as BlockQ4's q, per sub-block
};
static_assert(sizeof(BlockQ4K) == 2368, "BlockQ4K: 64 + 256 header bytes + 4096 nibbles");
// ggml's Q4_K block (ggml-common.h block_q4_K): 144 bytes for 256 values.
constexpr int kGgmlQ4KBytes = 144;

// Q6K: ggml's Q6_K, held exactly. A row's super-block has an fp16 scale d and 16 sub-blocks of 16
// with int8 scales sc: value = d * sc * (q - 32), q in [0, 63]. In a panel's BlockQ6K, a group of
// 4 k-steps is the 64 bytes [row][step] of Q8's groups, split into planes that a 64-byte load
// brings whole: per sub-block (4 groups), q's low nibbles two groups a line (group 2P in the low
// halves, 2P + 1 in the high) and its top two bits in one line (group G at bits 2G). A group's
// levels are then 3 or 4 operations away (an AND, a shift, a ternary merge), where Q4's layout of
// 8 rows a nibble needs a broadcast and a masked shift first; and a sub-block's 192 bytes are
// contiguous, one stream for the prefetcher (planes apart, the lm_head's GEMV ran at half the
// bandwidth). 6.5625 bits a weight, as ggml's.
constexpr int kSubBlocks16 = kSuperBlock / 16;          // 16
constexpr int kGroupsPerSuper = kSuperBlock / kQGroup;  // 64
struct BlockQ6K {
  uint16_t d[kPanel];               // fp16, per row
  int8_t sc[kSubBlocks16][kPanel];  // [sub-block][row]
  struct Sub {
    uint8_t ql[2][kPanel][kQGroup];  // [pair][row][step]: two groups' nibbles
    uint8_t qh[kPanel][kQGroup];     // [row][step]: the 4 groups' top bits
  } sub[kSubBlocks16];
};
static_assert(sizeof(BlockQ6K) == 3360, "BlockQ6K: 32 + 256 header bytes + 4096 6-bit values");
constexpr int kGgmlQ6KBytes = 210;  // ggml's block_q6_K: 256 values

// What the matmul of a format reads as activations: float rows, rows quantized to int8 with a scale
// per block of 32 (QRows), or with a scale per super-block of 256 and the sums of each 32 (QRows'
// K fields: Q4K's integer sub-block arithmetic needs one activation scale across a super-block).
enum class ActivationFormat { Float32, Int8Blocks, Int8Super };

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
    {WType::Q4K, "Q4K", ActivationFormat::Int8Super, 0, sizeof(BlockQ4K),
     8.0 * sizeof(BlockQ4K) / (kPanel * kSuperBlock)},
    {WType::Q6K, "Q6K", ActivationFormat::Int8Super, 0, sizeof(BlockQ6K),
     8.0 * sizeof(BlockQ6K) / (kPanel * kSuperBlock)},
};
constexpr const FormatTraits& format(WType t) { return kFormats[int(t)]; }

constexpr bool wtype_quantized(WType t) {
  return format(t).activations != ActivationFormat::Float32;
}
// The formats whose activations are quantized per super-block (Int8Super).
constexpr bool wtype_super(WType t) { return format(t).activations == ActivationFormat::Int8Super; }
// Values per block of a quantized format along k (a packed row's k is a multiple of it).
constexpr int qblock_values(WType t) { return wtype_super(t) ? kSuperBlock : kQBlock; }
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
// Of a packed Q4K matrix: the block of (row r, column c) and its row in the block.
const BlockQ4K* q4k_block(const void* packed, int kp, int r, int c);
inline int q4k_nibble(const BlockQ4K& b, int i, int c) {  // row i, column c of the super-block
  const uint8_t byte = b.q[c / kQBlock][c % kQBlock / kQGroup][i % 8][c % kQGroup];
  return i < 8 ? byte & 0x0f : byte >> 4;
}
inline int q4k_min(const BlockQ4K& b, int i, int s) { return b.mn[s / 2][i][s % 2]; }
// Rows [r0, r0 + rows) of a ggml Q4_K matrix with k columns (its blocks, kGgmlQ4KBytes per 256
// values, row after row) into the packed Q4K matrix dst (k a multiple of kSuperBlock): the same
// numbers, rearranged. ggml_from_q4k reads row r of a packed matrix back into ggml's bytes, which
// are the file's own, bit for bit.
void q4k_from_ggml(const uint8_t* src, int rows, int r0, int k, void* dst);
void ggml_from_q4k(const void* packed, int r, int k, uint8_t* out);
// A row of k float weights (k a multiple of kSuperBlock) quantized to ggml's Q4_K blocks
// (quantize_k.cpp), which q4k_from_ggml packs.
void quantize_q4k_ggml(const float* x, int k, uint8_t* out);
// The int4 format for float rows [nr <= kPanel, k] (k a multiple of kSuperBlock): Q4K, unless Q4
// holds them better for its bytes (its squared error under Q4K's by more than 0.375 bits a weight
// are worth: weights that lie on Q4's grid, from a Q4_0 or Q4_1 file).
WType q4_or_q4k(const float* rows, int nr, int k);
// ggml's 12 bytes of a Q4_K block's 8 six-bit scales and mins (the inverse of its
// get_scale_min_k4): the first four in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), the
// last four as nibbles of bytes 8-11 with their top 2 bits in the top bits of bytes 0-7.
void ggml_scales_mins(const uint8_t* sc, const uint8_t* mn, uint8_t* out);
// The same for Q6K and ggml's Q6_K (kGgmlQ6KBytes per 256 values).
const BlockQ6K* q6k_block(const void* packed, int kp, int r, int c);
inline int q6k_level(const BlockQ6K& b, int i, int c) {  // row i, column c: q in [0, 63]
  const BlockQ6K::Sub& s = b.sub[c / 16];
  const int g = c % 16 / kQGroup, e = c % kQGroup;
  return ((s.ql[g / 2][i][e] >> (4 * (g % 2))) & 0xF) | ((s.qh[i][e] >> (2 * g)) & 3) << 4;
}
void q6k_from_ggml(const uint8_t* src, int rows, int r0, int k, void* dst);
void ggml_from_q6k(const void* packed, int r, int k, uint8_t* out);
// Bytes of ggml's block of 256 values for a K format (Q4K: Q4_K, Q6K: Q6_K).
constexpr int ggml_block_bytes(WType t) { return t == WType::Q4K ? kGgmlQ4KBytes : kGgmlQ6KBytes; }
// ggml rows into packed panels and back, for either K format.
void k_from_ggml(WType t, const uint8_t* src, int rows, int r0, int k, void* dst);
void ggml_from_k(WType t, const void* packed, int r, int k, uint8_t* out);

}  // namespace kwker
