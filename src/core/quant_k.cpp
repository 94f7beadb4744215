// STUB: replaced by the K-quant implementation.
#include "core/quant.h"
namespace loom {
void quantize_row_q4_k(const float*, BlockQ4_K*, int64_t) { LOOM_ASSERT(false); }
void dequantize_row_q4_k(const BlockQ4_K*, float*, int64_t) { LOOM_ASSERT(false); }
void quantize_row_q6_k(const float*, BlockQ6_K*, int64_t) { LOOM_ASSERT(false); }
void dequantize_row_q6_k(const BlockQ6_K*, float*, int64_t) { LOOM_ASSERT(false); }
}
