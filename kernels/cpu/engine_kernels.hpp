#pragma once
/// The ONNX CPU backend's own vectorised kernels for the fused operations that
/// oneDNN and OpenBLAS do not cover: LayerNorm, erf-GELU with bias, row softmax
/// and multi-head attention. Each parallelises with OpenMP over `threads`.
///
/// Plain C++ with OpenMP SIMD loops; no dependency on the engine, ONNX or CAF.

#include <cstdint>

namespace caf_serving::kernels::cpu {

struct layer_norm_args {
  const float* x = nullptr;
  const float* gamma = nullptr; ///< [width]
  const float* beta = nullptr;  ///< [width] or null
  float* y = nullptr;
  int64_t rows = 0;
  int64_t width = 0;
  float epsilon = 1e-5f;
  int threads = 1;
};
/// y = (x - mean) / sqrt(var + eps) * gamma + beta, per row.
void engine_layer_norm(const layer_norm_args& a);

/// y = gelu_erf(x + bias[i % width]) (bias may be null). y may equal x.
void engine_gelu(const float* x, const float* bias, int64_t width, int64_t n, float* y,
                 int threads);

/// In place softmax over `rows` rows of `width`.
void engine_softmax(float* x, int64_t rows, int64_t width, int threads);

struct attention_args {
  /// [batch, seq, heads * head_dim] each (the projections' outputs, unpermuted).
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  /// Additive mask read at mask[b * mask_strides[0] + h * mask_strides[1] +
  /// i * mask_strides[2] + j * mask_strides[3]]; null for none.
  const float* mask = nullptr;
  int64_t mask_strides[4] = {0, 0, 0, 0};
  float* out = nullptr; ///< [batch, seq, heads * head_dim]
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 1.0f;
  int threads = 1;
  /// Jobs (batch row * heads + head) [first_job, last_job) run; last_job < 0: all.
  int64_t first_job = 0, last_job = -1;
};
/// out_h = softmax(q_h k_h^T * scale + mask) v_h for every batch row and head.
void engine_attention(const attention_args& a);

} // namespace caf_serving::kernels::cpu
