// `loom quantize`'s engine: reads a GGUF model, picks each tensor's type (loom/quant_mixture.h),
// converts the weights on several threads and writes a new GGUF atomically.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/quant_mixture.h"
#include "loom/gguf.h"

namespace loom::app {

/// What happens to one tensor.
struct TensorPlan {
  std::string name;
  Shape ne{1, 1, 1, 1};
  int n_dims = 1;         ///< significant dimensions (trailing 1s dropped)
  uint32_t src_type = 0;  ///< ggml type id in the input
  uint32_t dst_type = 0;  ///< ggml type id written
  uint64_t src_bytes = 0;
  uint64_t dst_bytes = 0;
  bool quantizable = false;  ///< the mixture chose its type (else it is copied as it is)
  bool fell_back = false;    ///< the mixture's type did not fit ne0 (fallback_quant_type)
  bool convert = false;      ///< bytes are converted (else copied)
};

/// Every tensor's fate, in file order, and the model facts the rules used.
struct QuantizePlan {
  llm::FileType ftype = llm::FileType::q8_0;
  bool pure = false;  ///< the mixture was off (--pure)
  int n_layers = 0;  ///< {arch}.block_count, else the highest blk.N + 1 (also info.n_layer)
  llm::MixtureModelInfo info;
  std::vector<TensorPlan> tensors;
};

/// Decides every tensor's output type without touching tensor data. Fails, naming the tensor, when
/// a tensor to be quantized holds a type other than f32, f16 or bf16 (or the target type itself),
/// for split files, and for a file type that is not a quantized one (f32, f16, bf16).
/// `pure`: no mixture, every quantizable tensor in the file type's base type (llama-quantize --pure).
Result<QuantizePlan> plan_quantization(const GgufFile& in, llm::FileType ftype, bool pure = false);

/// Reported when each tensor starts (done = false) and when it is written (done = true).
struct QuantizeProgress {
  bool done = false;
  size_t index = 0;  ///< 0-based
  size_t count = 0;
  const TensorPlan* tensor = nullptr;
  uint64_t bytes_done = 0;  ///< input bytes of the tensors written so far
  uint64_t bytes_total = 0;
};

struct QuantizeOptions {
  int n_threads = 0;  ///< 0: all hardware threads
  bool pure = false;  ///< no mixture (plan_quantization)
  std::function<void(const QuantizeProgress&)> on_tensor;
};

struct QuantizeSummary {
  QuantizePlan plan;
  uint64_t bytes_in = 0;    ///< tensor bytes read
  uint64_t bytes_out = 0;   ///< tensor bytes written
  uint64_t file_bytes = 0;  ///< size of the output file
  double seconds = 0.0;
  int n_threads = 1;
};

/// Quantizes `in_path` into `out_path` (which must not be the input). Metadata is copied in order,
/// with general.file_type and general.quantization_version (2) set. Weights containing NaN or inf
/// are an error naming the tensor, row and column. On any failure `out_path` is left untouched.
Result<QuantizeSummary> quantize_gguf(const std::string& in_path, const std::string& out_path,
                                      llm::FileType ftype, const QuantizeOptions& options = {});

}  // namespace loom::app
