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
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n);
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n);
void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n);
void dequantize_row_q2_k(const BlockQ2_K* x, float* y, int64_t n);
void quantize_row_q3_k(const float* x, BlockQ3_K* y, int64_t n);
void dequantize_row_q3_k(const BlockQ3_K* x, float* y, int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n);
void quantize_row_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t n);
void dequantize_row_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t n);
void quantize_row_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t n);
void dequantize_row_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t n);
void quantize_row_mxfp4(const float* x, BlockMXFP4* y, int64_t n);
void dequantize_row_mxfp4(const BlockMXFP4* x, float* y, int64_t n);
/// Activations for K-quant dot products.
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);
void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n);

}  // namespace loom
