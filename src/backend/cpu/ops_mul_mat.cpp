// STUB
#include "backend/cpu/cpu_ops.h"
namespace loom::cpu {
void op_mul_mat(const KernelContext&, Tensor*) { LOOM_ASSERT(false); }
void op_mul_mat_id(const KernelContext&, Tensor*) { LOOM_ASSERT(false); }
size_t mul_mat_work_size(const Tensor&, int) { return 0; }
size_t mul_mat_id_work_size(const Tensor&, int) { return 0; }
}
