// The ggml tensor types a GGUF file stores weights in, read row by row into float32 for the packer.
//
// Contract (numerics): every value is computed with the float32 operations, in the order, of
// transformers' GGUF dequantizer (integrations/gguf/dequant.py), which for these types is also
// the order of ggml's and gguf-py's reference: e.g. Q4_K is (d * scale) * q - (dmin * min), two
// products and a difference, each rounded once (no fused multiply-add: this file is compiled for
// the baseline ISA with -ffp-contract=off). So a model loaded from the file packs exactly the
// bytes that the same model dequantized by transformers packs. For the types transformers does not
// read (Q5_0 / Q5_1, the i-quants, the ternary TQ1_0 / TQ2_0), the order is gguf-py's
// (gguf.quants), e.g. IQ2_XXS is ((d * (0.5 + scale)) * 0.25) * grid * sign; Q8_K, which gguf-py
// does not read either, is ggml's d * q.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kwker {

// Type ids as ggml.h's `enum ggml_type` numbers them.
enum class GgmlType : int {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;
  int block;        // values per block (1 for the float types)
  int block_bytes;  // bytes per block
};

// The row of the table for a type id; nullptr for a type this loader cannot read.
const GgmlTypeInfo* ggml_type_info(int id);

// Bytes of a row of k values (k a multiple of the type's block).
inline size_t ggml_row_bytes(const GgmlTypeInfo& t, int k) {
  return size_t(k / t.block) * t.block_bytes;
}

// One row: k values of type t at src -> out [k] float32.
void ggml_dequantize_row(const GgmlTypeInfo& t, const uint8_t* src, int k, float* out);

}  // namespace kwker
