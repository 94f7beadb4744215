// Tensor: a node of a Graph. Up to 4 dimensions, byte strides, views of other tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "loom/dtype.h"

namespace loom {

class Buffer;

inline constexpr int kMaxDims = 4;
inline constexpr int kMaxSrc = 5;
inline constexpr size_t kMaxOpParams = 48;

/// Operation that produces a tensor. `none` marks a leaf (weight or input).
enum class OpKind : uint8_t {
  none,
  view,  // view/reshape/permute/transpose: no kernel, aliases view_src
  get_rows,
  add,
  sub,
  mul,
  div,
  scale,
  rms_norm,
  norm,
  mul_mat,
  mul_mat_id,
  rope,
  soft_max,
  flash_attn,
  silu,
  gelu,
  gelu_erf,
  swiglu,
  geglu,
  swiglu_oai,
  softcap,
  argmax,
  top_k,
  sample_tokens,
  set_rows,
  cpy,
  concat,
  sum_rows,
  all_reduce,  // sum over the ranks of a Communicator (tensor parallelism)
  count_,
};
inline constexpr int kOpCount = static_cast<int>(OpKind::count_);
const char* op_name(OpKind op);

/// Role flags of a tensor within a graph.
enum TensorFlags : uint32_t {
  kTensorInput = 1u << 0,   ///< set by the caller before compute
  kTensorWeight = 1u << 1,  ///< persistent parameter
  kTensorOutput = 1u << 2,  ///< read by the caller after compute; kept alive to the end
};

/// Shape helper: ne[0] is the innermost (contiguous) dimension, as in GGUF.
using Shape = std::array<int64_t, kMaxDims>;

struct Tensor {
  DType type = DType::f32;
  Shape ne{1, 1, 1, 1};                  ///< elements per dimension
  std::array<size_t, kMaxDims> nb{};     ///< byte stride per dimension (nb[0] = type size)
  OpKind op = OpKind::none;
  std::array<Tensor*, kMaxSrc> src{};    ///< operands
  alignas(8) std::array<uint8_t, kMaxOpParams> params{};  ///< op parameters (see graph.h)
  Tensor* view_src = nullptr;            ///< tensor whose memory this one aliases
  size_t view_offset = 0;                ///< byte offset into view_src
  void* data = nullptr;                  ///< address in its buffer's address space once allocated
  Buffer* buffer = nullptr;              ///< buffer holding data (null until allocated)
  uint32_t flags = 0;
  int32_t index = -1;                    ///< position among the graph's nodes or leafs
  std::string name;

  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
  /// Bytes spanned from the first to one past the last element (with strides).
  size_t nbytes() const;
  /// Bytes of one contiguous row of ne[0] elements.
  size_t row_size() const { return dtype_row_size(type, ne[0]); }
  /// Rows are packed with no gaps and dimensions in order.
  bool is_contiguous() const;
  /// Each row of ne[0] elements is contiguous (outer strides may be anything).
  bool rows_contiguous() const;
  bool is_leaf() const { return op == OpKind::none; }
  /// The tensor that owns the memory (follows view_src).
  const Tensor* root() const { return view_src ? view_src->root() : this; }
  /// Byte offset of element (i0,i1,i2,i3); i0 must be on a block boundary for quantized types.
  size_t offset_of(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    return (i0 / dtype_block_size(type)) * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }

  template <typename P>
  const P& get_params() const {
    static_assert(sizeof(P) <= kMaxOpParams && std::is_trivially_copyable_v<P>);
    return *reinterpret_cast<const P*>(params.data());
  }
  template <typename P>
  void set_params(const P& p) {
    static_assert(sizeof(P) <= kMaxOpParams && std::is_trivially_copyable_v<P>);
    std::memcpy(params.data(), &p, sizeof(P));
  }
};

/// Strides of a packed tensor of this type and shape.
std::array<size_t, kMaxDims> contiguous_strides(DType type, const Shape& ne);
/// "[4096, 7, 1, 1]" with trailing 1s trimmed: "[4096, 7]".
std::string shape_string(const Shape& ne);
/// "'name' f32 [4096, 7]".
std::string describe(const Tensor& t);

}  // namespace loom
