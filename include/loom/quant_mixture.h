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
//   * The mixes (llama.cpp's names; i, n are the counters described below):
//       q4_K_M: attn_v (also fused attn_qkv and MLA attn_kv_b) and ffn_down get q6_K where
//               use_more_bits(i, n) holds: the first n/8, the last n/8, and every third layer in
//               between (i - n/8) % 3 == 2; q5_K_M the same on a q5_K base.
//       q4_K_S: attn_v of the first 4 and ffn_down of the first n/8 layers get q5_K.
//       q3_K_M: attn_v q5_K for the first 2, else q4_K; ffn_down q5_K for the first n/16, else
//               q4_K; attn_output q4_K.  q3_K_L: attn_v, ffn_down and attn_output q5_K.
//       q2_K:   attn_v q4_K where n_gqa >= 4, else q3_K; ffn_down and attn_output q3_K.
//       iq4_nl, iq4_xs: attn_v q5_K where n_gqa >= 4; ffn_down q5_K for the first n/8.
//       q3_K_S, q5_K_S, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q6_K: the base type (and output q6_K).
//       MXFP4_MOE (gpt-oss): every quantizable tensor with a third dimension (ne[2] > 1: the stacked
//               MoE experts ffn_gate_exps, ffn_up_exps, ffn_down_exps, fused ffn_gate_up_exps) gets
//               mxfp4; every other one q8_0, output.weight and token_embd.weight included (tied or
//               not). None of the rules above apply to it. llama.cpp keys it on the shape, not the
//               name (its one exception, BailingMoE3's 3-D MLA projections, is an architecture
//               Loom does not load).
//     As in llama.cpp, i and n are counters: an attn_v-like tensor's rank among them in file order
//     and their count; an ffn_down tensor's rank among ffn_down tensors (its block index in MoE
//     models, whose expert tensors need not come in block order) and the block count.
//   * With 8 experts (Mixtral-like), attn_v and attn_k get q8_0, and attn_output q5_K in the
//     q2_K..q4_K_M and iq4 mixes, as in llama.cpp.
//   * Not carried over: the 70B-model attn_v bump to q5_K (llama.cpp keys it on a model size
//     class Loom does not compute) and Falcon's ffn_down ladder (Loom does not load Falcon); the
//     imatrix-dependent rules (Loom quantizes without an importance matrix).
//   * A type whose block does not divide the row length (ne0) falls back as llama.cpp's
//     tensor_type_fallback does: q2_K, q3_K to q4_0; q5_K to q5_1; q6_K to q8_0; iq4_xs to
//     iq4_nl; and anything whose ne0 is not a multiple of 32 to f16. Except q4_K, which falls back
//     to q8_0 rather than llama.cpp's q5_0 (chosen while CUDA had no q5_0 kernels; it has now).
//     mxfp4 and q8_0 (MXFP4_MOE's types) go to f16 there too, where llama.cpp has no fallback for
//     them and refuses the file.
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
enum class FileType {
  f32,
  f16,
  bf16,
  q8_0,
  q4_0,
  q4_k,
  q6_k,
  q4_k_m,
  q4_1,
  q5_0,
  q5_1,
  q2_k,
  q3_k_s,
  q3_k_m,
  q3_k_l,
  q4_k_s,
  q5_k_s,
  q5_k_m,
  iq4_nl,
  iq4_xs,
  mxfp4_moe,
};

/// The canonical spelling: "f32", ..., "q4_K", "q6_K", "q4_K_M", "q3_K_S", "iq4_xs", "MXFP4_MOE"
/// (llama.cpp's spelling).
const char* file_type_name(FileType t);
/// Case-insensitive ("Q4_K_M", "q6_k"); nullopt for other names.
std::optional<FileType> file_type_from_name(std::string_view name);
/// The value of general.file_type, in llama.cpp's llama_ftype numbering (f32 0, f16 1, bf16 32,
/// q8_0 7, q4_0 2, q6_K 18, q4_K_M 15, q2_K 10, q3_K_S/M/L 11-13, q4_K_S 14, q5_K_S/M 16-17,
/// iq4_nl 25, iq4_xs 30, MXFP4_MOE 38); plain q4_K is not a llama.cpp file type and is written as 14 (Q4_K_S,
/// "mostly q4_K"), like q4_K_S, which differs from it by a few q5_K tensors.
uint32_t file_type_gguf_id(FileType t);
/// The type most tensors get (MXFP4_MOE: mxfp4, the experts' type, as llama.cpp's default type;
/// `--pure` puts every quantizable tensor in it).
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
  int n_gqa = 1;                 ///< query heads per key/value head (head_count / head_count_kv)
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
/// the block count. Other tensors ignore them. `ne` is the tensor's shape; only MXFP4_MOE reads it
/// (ne[2] > 1 marks the stacked expert matrices).
DType choose_quant_type(std::string_view name, int layer, int n_layers, FileType ft,
                        const MixtureModelInfo& info = {}, const Shape& ne = Shape{1, 1, 1, 1});

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

/// The whole rule: every tensor's type, in file order, with llama.cpp's counters. `pure`
/// (llama-quantize --pure) turns the mixture off: every quantizable tensor, the output and
/// embeddings included, gets the file type's base type; the shape fallback still applies.
std::vector<TensorTypeChoice> choose_tensor_types(FileType ft, std::span<const MixtureTensor> tensors,
                                                  const MixtureModelInfo& info, bool pure = false);

}  // namespace loom::llm
