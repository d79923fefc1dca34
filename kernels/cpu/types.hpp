/// Vocabulary shared by the CPU references, the CUDA launchers and the kernel checks.
#pragma once

#include <cstddef>

namespace caf_serving::kernels {

/// Element type of a kernel's tensors. The fused kernels take the floating-point
/// types (f32, f16, bf16); the element-wise kernels (`cuda/elementwise.hpp`) also the
/// integer types and `boolean` (one byte, 0 or 1).
enum class dtype {
  f32,
  f16,
  bf16,
  i64,
  i32,
  i8,
  u8,
  boolean,
};

constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::i64:
      return 8;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
      return 1;
  }
  return 0;
}

/// f32, f16 or bf16: the types the fused (non-element-wise) kernels take.
constexpr bool is_floating(dtype t) {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

inline const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
    case dtype::i64:
      return "i64";
    case dtype::i32:
      return "i32";
    case dtype::i8:
      return "i8";
    case dtype::u8:
      return "u8";
    case dtype::boolean:
      return "bool";
  }
  return "?";
}

/// Element-wise activation applied by the GEMM/convolution epilogue.
enum class activation {
  none,
  relu,
  gelu_erf,  ///< x/2 (1 + erf(x/sqrt 2)): BERT's exact GELU.
  gelu_tanh, ///< x/2 (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))): GPT-2's approximation.
};

/// How a bias vector lines up with a tensor: element `i` takes
/// `bias[(i / inner) % channels]`. A row-major GEMM output [m, n] has inner = 1 and
/// channels = n; an NCHW convolution output has inner = H*W and channels = C.
struct bias_layout {
  std::size_t channels = 1;
  std::size_t inner = 1;
};

/// What masks a softmax row.
enum class mask_kind {
  none,
  additive, ///< float values added to the logits (-inf or a large negative masks).
  boolean,  ///< uint8: nonzero keeps the element, zero masks it.
};

} // namespace caf_serving::kernels
