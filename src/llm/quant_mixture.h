// Which type each tensor of a model gets when a whole model is written or quantized to one "file
// type". Shared by `loom gen-model` and (later) `loom quantize`.
//
// Plain types (f32, f16, bf16, q8_0, q4_0, q4_K, q6_K) put every 2-D weight in that type. The
// mixture q4_K_M follows llama.cpp's public rule for LLAMA_FTYPE_MOSTLY_Q4_K_M
// (llama_tensor_get_type in src/llama-quant.cpp):
//   - output.weight (or token_embd.weight when the model has no output.weight, i.e. ties them):
//     q6_K, or q8_0 when its rows are not a multiple of 256;
//   - attn_v.weight and ffn_down.weight of layer i of n: q6_K when use_more_bits(i, n), i.e.
//     i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 (the first and last eighth of the layers and every
//     third layer in between), else q4_K;
//   - everything else q4_K.
// llama.cpp also bumps attn_v of 70B models to q5_K and treats MoE experts specially; Loom has
// neither q5_K nor MoE models yet, so those rules are left out.
// In every file type, tensors with one dimension (norms, biases) stay f32, and a tensor whose rows
// are not a multiple of its type's block falls back as llama.cpp does (q6_K -> q8_0; q4_K -> q5_0
// there, q8_0 here because Loom has no q5_0), and to f16 when not even 32 divides its rows.
#pragma once

#include <optional>
#include <string_view>

#include "loom/dtype.h"
#include "loom/tensor.h"

namespace loom::llm {

enum class FileType { f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m };

/// "f32", ..., "q4_K", "q6_K", "q4_K_M".
const char* file_type_name(FileType t);
/// Case-insensitive.
std::optional<FileType> file_type_from_name(std::string_view name);
/// llama.cpp's `general.file_type` value (LLAMA_FTYPE_*); plain q4_K reports MOSTLY_Q4_K_S (14),
/// the closest existing id.
uint32_t file_type_gguf_id(FileType t);
/// The type most tensors get.
DType file_type_base(FileType t);

/// What the rule needs to know about the model besides the tensor.
struct MixtureModelInfo {
  int n_layer = 0;
  bool has_output = true;  ///< false when output.weight is absent (tied to token_embd)
};

/// True for the layers that get more bits: llama.cpp's use_more_bits.
bool use_more_bits(int i_layer, int n_layer);

/// The type of tensor `name` with shape `ne` (`n_dims` dimensions) in a model of file type `ft`.
DType tensor_type_for(FileType ft, std::string_view name, const Shape& ne, int n_dims,
                      const MixtureModelInfo& info);

}  // namespace loom::llm
