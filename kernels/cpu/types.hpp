/// Vocabulary shared by the CPU references, the CUDA launchers and the kernel checks.
#pragma once

#include <cstddef>

namespace caf_serving::kernels {

/// Element type of a kernel's floating-point tensors.
enum class dtype {
  f32,
  f16,
  bf16,
};

inline std::size_t dtype_size(dtype t) {
  return t == dtype::f32 ? 4 : 2;
}

inline const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
  }
  return "?";
}

/// Element-wise activation applied by the GEMM/convolution epilogue: every
/// activation the ONNX engine fuses into FusedConv, FusedMatMul and FusedGemm.
/// Those with parameters read them from `activation_params` (ONNX's alpha, beta).
enum class activation {
  none,
  relu,
  gelu_erf,     ///< x/2 (1 + erf(x/sqrt 2)): BERT's exact GELU.
  gelu_tanh,    ///< x/2 (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))): GPT-2's approximation.
  tanh,         ///< tanh(x)
  sigmoid,      ///< 1 / (1 + exp(-x))
  clip,         ///< min(max(x, alpha), beta): ReLU6 is alpha 0, beta 6.
  hard_swish,   ///< x clamp(alpha x + beta, 0, 1): MobileNetV3's, alpha 1/6, beta 1/2.
  hard_sigmoid, ///< clamp(alpha x + beta, 0, 1): ONNX's default alpha 0.2, beta 0.5.
  swish,        ///< x sigmoid(alpha x): SiLU (EfficientNet's) at alpha 1.
  leaky_relu,   ///< x for x >= 0, alpha x below.
};

/// The parameters of `clip`, `hard_swish`, `hard_sigmoid`, `swish` and
/// `leaky_relu`, named as ONNX names them; the other activations ignore them.
struct activation_params {
  float alpha = 0.0f;
  float beta = 0.0f;
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

/// A softmax mask read in place through strides, for attention scores: the rows
/// are [outer, heads, queries] (row r is query r % queries of head
/// (r / queries) % heads of outer index r / (queries * heads)), and the mask row of
/// (o, h, q) starts at o * outer + h * head + q * query elements, its columns
/// contiguous. A stride of 0 broadcasts, so that a [B, 1, 1, S] padding mask, an
/// [S, S] causal mask and a full [B, H, S, S] mask are all read without expanding
/// them. `heads` = 0 leaves it unused.
struct mask_strides {
  std::size_t heads = 0;
  std::size_t queries = 1;
  std::size_t outer = 0;
  std::size_t head = 0;
  std::size_t query = 0;
};

/// Element offset of the mask row that row `r` of a [rows, cols] softmax reads:
/// through `strides` when set, else row r % mask_rows of a [mask_rows, cols] mask.
/// constexpr, so that the CUDA kernels call it too (--expt-relaxed-constexpr).
constexpr std::size_t mask_row_offset(const mask_strides& strides, std::size_t mask_rows,
                                      std::size_t cols, std::size_t r) {
  if (strides.heads == 0)
    return (r % mask_rows) * cols;
  std::size_t q = r % strides.queries, t = r / strides.queries;
  return (t / strides.heads) * strides.outer + (t % strides.heads) * strides.head
         + q * strides.query;
}

} // namespace caf_serving::kernels
