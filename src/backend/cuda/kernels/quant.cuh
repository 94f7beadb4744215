// Element formats on the device: reading one element of a row (dequantizing) and writing a whole
// block (quantizing). The block layouts are GGUF's; copy.cu checks them against loom/dtype.h.
// Includes nothing outside src/backend/cuda/.
//
// Each format is a struct with kBlock (elements per block), kBytes (bytes per block),
// load(block, j) -> element j as float, and store(x, block) writing kBlock floats as one block.
// Kernels are templated on these structs; the host maps a DType to one with a switch. Every store
// is the CPU reference quantizer, bit for bit; the K-quants' (a per-sub-block scale search, one
// thread per 256-element block) live in quant_k.cuh. The newer formats (q4_1 .. mxfp4) are read
// only (quant_blocks.cuh): loads, no stores.
//
// Loads are the CPU dequantizer's operations with its roundings: where it rounds a product before
// a sum (q4_K's step * q - off), the device must not contract the two into an fma, hence the
// named round-to-nearest helpers (fmul_rn, fsub_rn).
#pragma once

#include <cstdint>

#include "common.cuh"
#include "quant_blocks.cuh"
#include "quant_k.cuh"
#include "quantize_act.cuh"  // q4k_scale_min

namespace loom::cuda {

// Unaligned-safe little-endian 16-bit load: quantized blocks are 2-byte aligned at best.
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
// Block scales sit at even offsets (q8_0 and q4_0 blocks are 34 and 18 bytes, rows start on
// block boundaries of 256-byte aligned buffers), so one 16-bit store is legal. Two byte stores of
// the f16 conversion's result lost the low byte on the H200 (nvcc 13.0, sm_90): measured by the op
// test as a zeroed first byte of every q8_0/q4_0 block written on the device.
__device__ __forceinline__ void store_u16(uint8_t* p, uint16_t v) { *reinterpret_cast<uint16_t*>(p) = v; }
__device__ __forceinline__ int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

struct FormatF32 {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 4;
  __device__ static float load(const uint8_t* b, int) { return *reinterpret_cast<const float*>(b); }
  __device__ static void store(const float* x, uint8_t* b) { *reinterpret_cast<float*>(b) = x[0]; }
};

struct FormatF16 {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 2;
  __device__ static float load(const uint8_t* b, int) {
    return f16_to_float(*reinterpret_cast<const uint16_t*>(b));
  }
  __device__ static void store(const float* x, uint8_t* b) {
    *reinterpret_cast<uint16_t*>(b) = float_to_f16(x[0]);
  }
};

struct FormatBF16 {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 2;
  __device__ static float load(const uint8_t* b, int) {
    return bf16_to_float(*reinterpret_cast<const uint16_t*>(b));
  }
  __device__ static void store(const float* x, uint8_t* b) {
    *reinterpret_cast<uint16_t*>(b) = float_to_bf16(x[0]);
  }
};

/// i32 read as float (get_rows of an index table); stores round to nearest like the CPU.
struct FormatI32 {
  static constexpr int kBlock = 1;
  static constexpr int kBytes = 4;
  __device__ static float load(const uint8_t* b, int) {
    return static_cast<float>(*reinterpret_cast<const int32_t*>(b));
  }
  __device__ static void store(const float* x, uint8_t* b) {
    *reinterpret_cast<int32_t*>(b) = __float2int_rn(x[0]);
  }
};

/// q8_0: d (f16), 32 x int8; x = q * d. Quantization is the CPU reference's, bit for bit.
struct FormatQ8_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 34;
  __device__ static float load(const uint8_t* b, int j) {
    return static_cast<float>(static_cast<int8_t>(b[2 + j])) * f16_to_float(load_u16(b));
  }
  __device__ static void store(const float* x, uint8_t* b) {
    float amax = 0.0f;
    for (int i = 0; i < kBlock; ++i) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    store_u16(b, float_to_f16(d));
    for (int i = 0; i < kBlock; ++i)
      b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(x[i] * id)));
  }
};

/// q4_0: d (f16), 16 bytes of nibbles; element j < 16 in the low nibble of byte j, j >= 16 in the
/// high nibble of byte j - 16; x = (nibble - 8) * d. Quantization matches the CPU reference.
struct FormatQ4_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBytes = 18;
  __device__ static float load(const uint8_t* b, int j) {
    const uint8_t byte = b[2 + (j & 15)];
    const int q = j < 16 ? (byte & 0x0f) : (byte >> 4);
    return static_cast<float>(q - 8) * f16_to_float(load_u16(b));
  }
  __device__ static void store(const float* x, uint8_t* b) {
    float extreme = 0.0f;  // the value of largest magnitude maps to code 0 (-8)
    for (int i = 0; i < kBlock; ++i)
      if (fabsf(x[i]) > fabsf(extreme)) extreme = x[i];
    const float d = extreme / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(b, float_to_f16(d));
    for (int i = 0; i < kBlock / 2; ++i) {
      const int lo = clamp_int(__float2int_rn(x[i] * id) + 8, 0, 15);
      const int hi = clamp_int(__float2int_rn(x[i + kBlock / 2] * id) + 8, 0, 15);
      b[2 + i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
};

/// q4_K: d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles. Elements 64p..64p+31
/// are the low nibbles of qs[32p..32p+31], 64p+32..64p+63 the high nibbles; x = d*sc*q - dmin*m.
struct FormatQ4_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 144;
  __device__ static float load(const uint8_t* b, int j) {
    const int s = j / 32;  // sub-block
    int sc, m;
    q4k_scale_min(s, b + 4, sc, m);
    const uint8_t byte = b[16 + (j / 64) * 32 + (j % 32)];
    const int q = (s & 1) ? (byte >> 4) : (byte & 0x0f);
    const float step = fmul_rn(f16_to_float(load_u16(b)), static_cast<float>(sc));
    const float off = fmul_rn(f16_to_float(load_u16(b + 2)), static_cast<float>(m));
    return fsub_rn(fmul_rn(step, static_cast<float>(q)), off);
  }
  __device__ static void store(const float* x, uint8_t* b) { quantize_block_q4_k(x, b); }
};

/// q6_K: 128 bytes of low nibbles (ql), 64 bytes of 2-bit high parts (qh), 16 int8 scales, d
/// (f16). In each half h of 128 elements, element 32c + l (c = 0..3) takes the low nibble (c < 2)
/// or high nibble (c >= 2) of ql[64h + 32(c&1) + l] and bits 2c..2c+1 of qh[32h + l];
/// x = d * scales[j / 16] * (q - 32).
struct FormatQ6_K {
  static constexpr int kBlock = 256;
  static constexpr int kBytes = 210;
  __device__ static float load(const uint8_t* b, int j) {
    const int h = j / 128, c = (j % 128) / 32, l = j % 32;
    const uint8_t low = b[64 * h + 32 * (c & 1) + l];
    const int q = ((c < 2) ? (low & 0x0f) : (low >> 4)) | (((b[128 + 32 * h + l] >> (2 * c)) & 3) << 4);
    const int8_t scale = static_cast<int8_t>(b[192 + j / 16]);
    return f16_to_float(load_u16(b + 208)) * static_cast<float>(scale) * static_cast<float>(q - 32);
  }
  __device__ static void store(const float* x, uint8_t* b) { quantize_block_q6_k(x, b); }
};

// Eight consecutive elements j0 .. j0+7 (j0 a multiple of 8) of one weight block, for the fast
// mode's dequantization: the block's scales are decoded once per eight elements (a per-element
// FormatX::load decodes them per element, which made dequantizing a 4096 x 4096 q4_K matrix take
// ~50 us instead of the ~10 its bytes need). Same formulas and results as quant.cuh's loads, with
// two changes of instructions only: the quants are read two bytes at a time (these formats' blocks
// have even sizes and sit at even addresses), and small integers become floats through the mantissa
// of 2^23 (exact for 0 <= q < 2^23) instead of I2F, a quarter-rate instruction that bound gemm_q.cu.
__device__ __forceinline__ uint32_t load_u16_even(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
/// float(q) - offset for 0 <= q < 2^23 (exact when the result is a small integer).
template <int kOffset>
__device__ __forceinline__ float magic_float(uint32_t q) {
  return __int_as_float(0x4B000000u | q) - (8388608.0f + static_cast<float>(kOffset));
}
struct Dequant8Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34;
  __device__ static void run(const uint8_t* b, int j0, float* out) {
    const float d = f16_to_float(load_u16_even(b));
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const uint32_t v = load_u16_even(b + 2 + j0 + e) ^ 0x8080u;  // int8 + 128, two at a time
      out[e] = magic_float<128>(v & 0xff) * d;
      out[e + 1] = magic_float<128>(v >> 8) * d;
    }
  }
};
struct Dequant8Q4_0 {
  static constexpr int kBlock = 32, kBytes = 18;
  __device__ static void run(const uint8_t* b, int j0, float* out) {
    const float d = f16_to_float(load_u16_even(b));
    const int shift = j0 < 16 ? 0 : 4;
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const uint32_t v = (load_u16_even(b + 2 + (j0 & 15) + e) >> shift) & 0x0f0fu;
      out[e] = magic_float<8>(v & 0xff) * d;
      out[e + 1] = magic_float<8>(v >> 8) * d;
    }
  }
};
struct Dequant8Q4_K {
  static constexpr int kBlock = 256, kBytes = 144;
  __device__ static void run(const uint8_t* b, int j0, float* out) {
    const int s = j0 / 32;
    int sc, m;
    q4k_scale_min(s, b + 4, sc, m);
    const float scale = fmul_rn(f16_to_float(load_u16_even(b)), static_cast<float>(sc));
    const float bias = fmul_rn(f16_to_float(load_u16_even(b + 2)), static_cast<float>(m));
    const uint8_t* q = b + 16 + (j0 / 64) * 32 + (j0 % 32);
    const int shift = (s & 1) ? 4 : 0;
    // the eight codes in one 8-byte load where q is 8-byte aligned (a block at a 16-byte boundary,
    // as in every weight Loom loads), else four 2-byte ones
    uint32_t w[2];
    if ((reinterpret_cast<uintptr_t>(q) & 7) == 0) {
      const uint2 v = *reinterpret_cast<const uint2*>(q);
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = load_u16_even(q) | (load_u16_even(q + 2) << 16);
      w[1] = load_u16_even(q + 4) | (load_u16_even(q + 6) << 16);
    }
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const uint32_t v = (w[e / 4] >> (16 * ((e / 2) & 1) + shift)) & 0x0f0fu;
      out[e] = fsub_rn(fmul_rn(scale, magic_float<0>(v & 0xff)), bias);
      out[e + 1] = fsub_rn(fmul_rn(scale, magic_float<0>(v >> 8)), bias);
    }
  }
};
struct Dequant8Q6_K {
  static constexpr int kBlock = 256, kBytes = 210;
  __device__ static void run(const uint8_t* b, int j0, float* out) {
    const int h = j0 / 128, c = (j0 % 128) / 32, l0 = j0 % 32;
    const uint8_t* ql = b + 64 * h + 32 * (c & 1) + l0;
    const uint8_t* qh = b + 128 + 32 * h + l0;
    const float scale =
        f16_to_float(load_u16_even(b + 208)) * static_cast<float>(static_cast<int8_t>(b[192 + j0 / 16]));
    const int shift = c < 2 ? 0 : 4;
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const uint32_t v = ((load_u16_even(ql + e) >> shift) & 0x0f0fu) | (((load_u16_even(qh + e) >> (2 * c)) & 0x0303u) << 4);
      out[e] = scale * magic_float<32>(v & 0xff);
      out[e + 1] = scale * magic_float<32>(v >> 8);
    }
  }
};

/// The same for a format of quant_blocks.cuh: its sub-blocks (16 or 32 elements) never split a group of 8.
template <class F>
struct Dequant8Of {
  static constexpr int kBlock = F::kBlock, kBytes = F::kBytes;
  __device__ static void run(const uint8_t* b, int j0, float* out) {
    const typename F::Step s = F::step(b, j0);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = F::value(s, b, j0 + e);
  }
};

/// Element i0 of a row whose blocks are packed from `row`.
template <class F>
__device__ __forceinline__ float load_element(const char* row, int64_t i0) {
  return F::load(reinterpret_cast<const uint8_t*>(row) + (i0 / F::kBlock) * F::kBytes,
                 static_cast<int>(i0 % F::kBlock));
}

}  // namespace loom::cuda
