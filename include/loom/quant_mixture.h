// Which type each tensor of a model gets when a whole model is written (`loom gen-model`) or
// quantized (`loom quantize`) to one "file type". The rules are those of llama.cpp's
// `llama-quantize` (src/llama-quant.cpp, llama_tensor_get_type), restricted to the types Loom has,
// so Loom's files match llama.cpp's for the same file type name.
//
//   * Only tensors whose name ends in "weight", with at least 2 dimensions (ne beyond the first
//     that are not 1), are quantized, and never norms ("_norm.weight"), MoE routers
//     ("ffn_gate_inp.weight"), position/token-type embeddings or T5 relative position biases.
//     Everything else (biases, norms, 1-D tensors) keeps its type: `loom quantize` copies it,
//     `loom gen-model` writes it as f32.
//   * Float file types (f32, f16, bf16) put every quantized tensor in that type, as llama.cpp does
//     when the target type is not a quantized one; the rules below apply to quantized types only.
//   * output.weight gets q6_K (q8_0 stays q8_0); so does token_embd.weight when the model has no
//     output.weight (tied embeddings), as it then serves as the output matrix too.
//   * q4_K_M: attn_v.weight (also fused attn_qkv and MLA attn_kv_b) and ffn_down get q6_K in the
//     layers where use_more_bits(i, n) holds: the first n/8, the last n/8, and every third layer in
//     between (i - n/8) % 3 == 2; other quantized tensors get q4_K. As in llama.cpp, i and n are
//     counters: an attn_v-like tensor's rank among them in file order and their count; an
//     ffn_down tensor's rank among ffn_down tensors (its block index in MoE models, whose expert
//     tensors need not come in block order) and the block count.
//   * With 8 experts (Mixtral-like), attn_v and attn_k get q8_0, as in llama.cpp.
//   * Not carried over, because they need q5_K (which Loom lacks): 70B-model attn_v and MoE
//     attn_output bumps to q5_K; Falcon's ffn_down ladder. Those tensors stay q4_K.
//   * A type whose block does not divide the row length (ne0) falls back: q4_K and q6_K to q8_0
//     (llama.cpp uses q5_0 for q4_K, which Loom lacks; q4_0 would lose more than the mixture
//     saves), and anything whose ne0 is not a multiple of 32 to f16.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "loom/dtype.h"
#include "loom/tensor.h"

namespace loom::llm {

/// The file types Loom writes. `loom quantize` takes the quantized ones, `loom gen-model` all.
enum class FileType { f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m };

/// The canonical spelling: "f32", ..., "q4_K", "q6_K", "q4_K_M".
const char* file_type_name(FileType t);
/// Case-insensitive ("Q4_K_M", "q6_k"); nullopt for other names.
std::optional<FileType> file_type_from_name(std::string_view name);
/// The value of general.file_type, in llama.cpp's llama_ftype numbering (f32 0, f16 1, bf16 32,
/// q8_0 7, q4_0 2, q6_K 18, q4_K_M 15); plain q4_K is not a llama.cpp file type and is written as
/// 14 (Q4_K_S, "mostly q4_K").
uint32_t file_type_gguf_id(FileType t);
/// The type most tensors get.
DType file_type_base(FileType t);
/// False for f32, f16 and bf16.
bool file_type_is_quantized(FileType t);
/// Every file type, in enum order (for lists of valid names).
std::span<const FileType> all_file_types();

/// Facts about the whole model some rules need.
struct MixtureModelInfo {
  int n_layer = 0;               ///< {arch}.block_count (ffn_down's counter runs up to it)
  bool tied_embeddings = false;  ///< the model has no output.weight
  int n_expert = 0;              ///< {arch}.expert_count; 0 for dense models
};

/// ggml_n_dims: the dimensions that count, trailing dimensions of 1 dropped ([4096, 1] is 1-D).
int significant_dims(const Shape& ne);
/// "blk.12.attn_v.weight" -> 12; -1 for tensors outside the blocks.
int tensor_block_index(std::string_view name);

/// Whether llama.cpp would quantize a tensor with this name and `n_dims` significant dimensions.
bool tensor_is_quantizable(std::string_view name, int n_dims);
/// True for tensors ranked by the attn_v counter (attn_v, attn_qkv, attn_kv_b).
bool tensor_is_attn_v_like(std::string_view name);
/// True for tensors ranked by the ffn_down counter.
bool tensor_is_ffn_down(std::string_view name);

/// llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between.
bool use_more_bits(int layer, int n_layers);

/// The type of a quantizable tensor, before the shape fallback. `layer` and `n_layers` are
/// llama.cpp's counters (see the top of this file); for a dense model both are the block index and
/// the block count. Other tensors ignore them.
DType choose_quant_type(std::string_view name, int layer, int n_layers, FileType ft,
                        const MixtureModelInfo& info = {});

/// `t` when its block divides ne0, else the documented fallback (q8_0, then f16).
DType fallback_quant_type(DType t, int64_t ne0);

/// One tensor as the rule sees it.
struct MixtureTensor {
  std::string_view name;
  Shape ne{1, 1, 1, 1};
};

/// The rule's decision for one tensor.
struct TensorTypeChoice {
  bool quantizable = false;   ///< false: the tensor keeps its type (wanted and type are f32)
  DType wanted = DType::f32;  ///< choose_quant_type's answer
  DType type = DType::f32;    ///< after fallback_quant_type
};

/// The whole rule: every tensor's type, in file order, with llama.cpp's counters.
std::vector<TensorTypeChoice> choose_tensor_types(FileType ft, std::span<const MixtureTensor> tensors,
                                                  const MixtureModelInfo& info);

}  // namespace loom::llm
