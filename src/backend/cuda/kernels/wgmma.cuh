// Hopper's warpgroup MMA (wgmma.mma_async) for the sm_90a kernels: gemm_q's (gemm_q_wgmma.cu) and
// flash attention's (attention_wgmma.cu). Every function here is sm_90a code: include this header only
// from a file of the loom_cuda_sm90a object library, and call it under __CUDA_ARCH_FEAT_SM90_ALL.
//
// Shared-memory operands without swizzle are built from core matrices of 8 rows x 16 bytes (8 f16),
// 128 contiguous bytes each; a descriptor gives the start address, the leading byte offset (between
// core matrices adjacent along K) and the stride byte offset (between core matrices adjacent along M or
// N). The same holds for a K-major operand (rows along M/N, the 16 bytes along K) and for an MN-major
// one (rows along K, the 16 bytes along M/N), which wgmma takes for 16-bit B with the transpose flag.
#pragma once

#include <cstdint>

namespace loom::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/// A no-swizzle operand at shared address addr; lbo: bytes between K-adjacent core matrices, sbo:
/// between M/N-adjacent ones.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}
/// An operand in the kBytes-byte swizzle (32, 64 or 128) at shared address addr (8 kBytes-aligned), as
/// a tensor copy with the matching CU_TENSOR_MAP_SWIZZLE_* writes rows of kBytes: 8-row groups 8 kBytes
/// apart (the stride offset). K-major: rows along M/N, kBytes / 32 k16 steps of 16-bit elements per row
/// (step within a row by adding 32 bytes to addr; the leading offset unused). MN-major (B with the
/// transpose flag): rows along K, each kBytes / 2 elements of M/N; lbo: bytes between those groups.
template <int kBytes>
__device__ __forceinline__ uint64_t wgmma_desc_swizzled(uint32_t addr, uint32_t lbo = 16) {
  static_assert(kBytes == 32 || kBytes == 64 || kBytes == 128, "a wgmma swizzle");
  constexpr uint64_t kMode = kBytes == 128 ? 1 : kBytes == 64 ? 2 : 3;
  return wgmma_desc(addr, lbo, 8 * kBytes) | (kMode << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/// Keeps registers live (and unmoved) across an in-flight wgmma that reads or writes them.
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]));
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]));
}
// The accumulator operands of an m64nN wgmma: the register list of its first 32 (N = 64) or 64 (N =
// 128) operands, and the read-write constraints binding them to d[].
#define LOOM_WGMMA_REGS_0_31 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define LOOM_WGMMA_REGS_32_63 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LOOM_WGMMA_ACC_0_31(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define LOOM_WGMMA_ACC_32_63(d) \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/// d (64 x 64, f32, this thread's 32) += a (64 x 16 f16 from registers: this thread's m16n8k16 A
/// fragment of its warp's 16 rows) x b (16 x 64 f16 at descriptor desc; kTransB: MN-major), plus d
/// when accumulate (else d's old values are ignored).
template <bool kTransB>
__device__ __forceinline__ void wgmma_64x64x16_rs(float (&d)[32], const uint32_t* a, uint64_t desc, bool accumulate = true) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" LOOM_WGMMA_REGS_0_31
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
               : LOOM_WGMMA_ACC_0_31(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(kTransB ? 1 : 0), "r"(accumulate ? 1 : 0));
}
/// d (64 x 128, f32, this thread's 64) += a (64 x 16 f16 from registers: this thread's m16n8k16 A
/// fragment of its warp's 16 rows) x b (16 x 128 f16 at descriptor desc; kTransB: MN-major), plus d
/// when accumulate (else d's old values are ignored).
template <bool kTransB>
__device__ __forceinline__ void wgmma_64x128x16_rs(float (&d)[64], const uint32_t* a, uint64_t desc, bool accumulate = true) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %70, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" LOOM_WGMMA_REGS_0_31 ", " LOOM_WGMMA_REGS_32_63
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
               : LOOM_WGMMA_ACC_0_31(d), LOOM_WGMMA_ACC_32_63(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(kTransB ? 1 : 0), "r"(accumulate ? 1 : 0));
}
/// d (64 x 128, f32, this thread's 64) = a (64 x 16 f16 at descriptor da, K-major) x b (16 x 128 f16 at
/// descriptor db, K-major), plus d when accumulate (else d's old values are ignored).
__device__ __forceinline__ void wgmma_64x128x16_ss(float (&d)[64], uint64_t da, uint64_t db, bool accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" LOOM_WGMMA_REGS_0_31 ", " LOOM_WGMMA_REGS_32_63
               "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : LOOM_WGMMA_ACC_0_31(d), LOOM_WGMMA_ACC_32_63(d)
               : "l"(da), "l"(db), "r"(accumulate ? 1 : 0));
}
#undef LOOM_WGMMA_REGS_0_31
#undef LOOM_WGMMA_REGS_32_63
#undef LOOM_WGMMA_ACC_0_31
#undef LOOM_WGMMA_ACC_32_63
#endif

}  // namespace loom::cuda
