// STUB
#include "backend/cpu/cpu_ops.h"
namespace loom::cpu {
void op_flash_attn(const KernelContext&, Tensor*) { LOOM_ASSERT(false); }
size_t flash_attn_work_size(const Tensor&, int) { return 0; }
}
