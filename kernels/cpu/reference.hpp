/// Plain C++ references for the fused CUDA kernels in `kernels/cuda/`.
///
/// Each function is one *unfused* operation on float data, written for clarity
/// rather than speed; the kernel checks compose them to get the expected result of
/// a fused kernel (bias, then activation, then residual add, ...). Half-precision
/// inputs are converted to float first (`cpu/half.hpp`), so the same references
/// serve every datatype. Reductions accumulate in double so that the reference's
/// own rounding is far below any kernel tolerance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/types.hpp"

namespace caf_serving::kernels::ref {

/// `act(x)` in double precision, rounded once to float.
float activate(activation act, float x, activation_params params = {});

/// `x + bias` broadcast by `layout`.
std::vector<float> add_bias(const std::vector<float>& x,
                            const std::vector<float>& bias, bias_layout layout);

/// `act(x)` element-wise.
std::vector<float> apply_activation(const std::vector<float>& x, activation act,
                                    activation_params params = {});

/// `a + b` element-wise; the sizes must match.
std::vector<float> add(const std::vector<float>& a, const std::vector<float>& b);

/// Shape of a row-wise operation on a row-major [rows, cols] matrix.
struct row_shape {
  std::size_t rows = 0;
  std::size_t cols = 0;
};

/// LayerNorm of each row: (x - mean) / sqrt(var + eps) * gamma + beta, with the
/// biased variance as in PyTorch and ONNX.
std::vector<float> layer_norm(const std::vector<float>& x, row_shape shape,
                              const std::vector<float>& gamma,
                              const std::vector<float>& beta, float eps);

/// A softmax mask of `mask_rows` rows, row r of the input using mask row
/// `r % mask_rows` (so one mask row can serve a whole batch), or, when
/// `layout.heads` > 0, through the strides of `layout` (types.hpp). A row whose
/// every element is masked becomes all zeros rather than NaN.
struct softmax_mask {
  mask_kind kind = mask_kind::none;
  std::vector<float> additive;
  std::vector<std::uint8_t> keep;
  std::size_t mask_rows = 1;
  mask_strides layout;
};

/// Row softmax with an optional mask.
std::vector<float> softmax(const std::vector<float>& x, row_shape shape,
                           const softmax_mask& mask);

/// Row-major [m, n] = [m, k] x op(B), where op(B) is B [k, n] or, when
/// `b_transposed`, B stored as [n, k].
struct matmul_shape {
  std::size_t m = 0;
  std::size_t n = 0;
  std::size_t k = 0;
  bool b_transposed = false;
};

std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b,
                          matmul_shape shape);

/// `x * s` element-wise.
std::vector<float> scale(const std::vector<float>& x, float s);

/// Shape of encoder multi-head attention over tensors laid out [batch, heads, seq, dim].
struct attention_shape {
  std::size_t batch = 1;
  std::size_t heads = 1;
  std::size_t seq = 1;
  std::size_t head_dim = 64;
};

/// The masks of `attention`, each optional (empty: none). Keys at positions >=
/// `key_lengths[b]` are masked. `additive` is added to the scaled scores
/// [batch, heads, seq, seq]: element (b, h, q, k) is additive[b * batch + h * head
/// + q * query + k], a stride of 0 broadcasting (padding [B,1,1,S] has query = 0).
struct attention_masks {
  std::vector<int> key_lengths;
  std::vector<float> additive;
  std::size_t batch = 0;
  std::size_t head = 0;
  std::size_t query = 0;
};

/// softmax(scale * Q Kᵀ + mask) V, composed from `matmul`, `scale`, `softmax` and
/// `matmul` per (batch, head). A query row with every key masked gives zeros
/// (`softmax`'s rule).
std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, attention_shape shape,
                             const attention_masks& masks, float softmax_scale);

/// Copies each request's bytes to consecutive places in one batch buffer.
std::vector<std::uint8_t> gather(const std::vector<std::vector<std::uint8_t>>& requests);

/// Splits a batch buffer back into pieces of the given byte sizes.
std::vector<std::vector<std::uint8_t>> scatter(const std::vector<std::uint8_t>& batch,
                                               const std::vector<std::size_t>& sizes);

/// The k largest probabilities of one row, largest first; ties go to the lower index.
struct top_k_row {
  std::vector<float> probabilities;
  std::vector<std::int32_t> indices;
};

/// softmax then top-k of each row of logits.
std::vector<top_k_row> softmax_top_k(const std::vector<float>& logits, row_shape shape,
                                     std::size_t k);

} // namespace caf_serving::kernels::ref
