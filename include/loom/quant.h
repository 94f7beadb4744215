// Reference (scalar) quantization of the GGUF block formats (loom_core), which the CPU backend's
// kernels build on; other callers go through quantize_row/dequantize_row in loom/dtype.h.
#pragma once

#include <cstdint>

#include "loom/dtype.h"
#include "loom/status.h"

namespace loom {

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n);
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n);
/// Activations for K-quant dot products.
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);
void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n);

}  // namespace loom
