// Which type each tensor of a model gets when `loom quantize` writes a given file type: the rules
// of llama.cpp's `llama-quantize` (src/llama-quant.cpp, llama_tensor_get_type), restricted to the
// types Loom has, so Loom's files match llama.cpp's for the same name.
//
//   * Only tensors whose name ends in "weight", with at least 2 dimensions (ne beyond the first
//     that are not 1), are quantized, and never norms ("_norm.weight"), MoE routers
//     ("ffn_gate_inp.weight"), position/token-type embeddings or T5 relative position biases.
//     Everything else (biases, norms, 1-D tensors) keeps its type and bytes.
//   * output.weight gets q6_K (q8_0 stays q8_0); so does token_embd.weight when the model has no
//     output.weight (tied embeddings), as it then serves as the output matrix too.
//   * q4_K_M: attn_v.weight (also fused attn_qkv and MLA attn_kv_b) and ffn_down get q6_K in the
//     layers where use_more_bits(i, n) holds: the first n/8, the last n/8, and every third layer in
//     between (i - n/8) % 3 == 2; other quantized tensors get q4_K.
//   * With 8 experts (Mixtral-like), attn_v and attn_k get q8_0, as in llama.cpp.
//   * Not carried over, because they need q5_K (which Loom lacks): 70B-model attn_v and MoE
//     attn_output bumps to q5_K; Falcon's ffn_down ladder. Those tensors stay q4_K.
//   * A type whose block does not divide the row length (ne0) falls back: q4_K and q6_K to q8_0
//     (llama.cpp uses q5_0 for q4_K, which Loom lacks; q4_0 would lose more than the mixture
//     saves), and anything whose ne0 is not a multiple of 32 to f16.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "loom/dtype.h"

namespace loom::app {

/// The file types `loom quantize` writes.
enum class QuantFtype { q8_0, q4_0, q4_k, q6_k, q4_k_m };

/// "q4_K_M", "Q8_0", ... (case-insensitive); nullopt for other names.
std::optional<QuantFtype> quant_ftype_from_name(std::string_view name);
/// The canonical spelling ("q4_K_M").
const char* quant_ftype_name(QuantFtype f);
/// The value of general.file_type, in llama.cpp's llama_ftype numbering: q8_0 7, q4_0 2, q6_K 18,
/// q4_K_M 15; plain q4_K is not a llama.cpp file type and is written as 14 (Q4_K_S, "mostly q4_K").
uint32_t quant_ftype_file_type(QuantFtype f);
/// The type most tensors get.
DType quant_ftype_base_type(QuantFtype f);

/// Facts about the whole model some rules need.
struct MixtureModelInfo {
  bool tied_embeddings = false;  ///< the file has no output.weight
  int n_expert = 0;              ///< {arch}.expert_count; 0 for dense models
};

/// Whether llama.cpp would quantize a tensor with this name and `n_dims` significant dimensions
/// (ggml_n_dims: trailing dimensions of 1 do not count).
bool tensor_is_quantizable(std::string_view name, int n_dims);

/// True for tensors ranked by the attn_v counter (attn_v, attn_qkv, attn_kv_b).
bool tensor_is_attn_v_like(std::string_view name);
/// True for tensors ranked by the ffn_down counter.
bool tensor_is_ffn_down(std::string_view name);

/// The type of a quantizable tensor, before the shape fallback. `layer` and `n_layers` are
/// llama.cpp's counters: for attn_v-like tensors, the tensor's rank among them in file order and
/// their count; for ffn_down tensors, its rank among ffn_down tensors and the block count. For a
/// dense model both are the block index and the block count. Other tensors ignore them.
DType choose_quant_type(std::string_view name, int layer, int n_layers, QuantFtype ftype,
                        const MixtureModelInfo& info = {});

/// llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between.
bool use_more_bits(int layer, int n_layers);

/// `t` when its block divides ne0, else the documented fallback (q8_0, then f16).
DType fallback_quant_type(DType t, int64_t ne0);

}  // namespace loom::app
