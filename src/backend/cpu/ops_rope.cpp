// STUB
#include "backend/cpu/cpu_ops.h"
namespace loom::cpu {
void op_rope(const KernelContext&, Tensor*) { LOOM_ASSERT(false); }
}
