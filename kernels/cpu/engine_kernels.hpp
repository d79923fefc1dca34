#pragma once
/// The ONNX CPU backend's own vectorised kernels for the fused operations that
/// oneDNN and OpenBLAS do not cover: LayerNorm, GELU (erf and tanh) with bias, row softmax
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

/// y = gelu_tanh(x + bias[i % width]) (bias may be null), GELU's tanh
/// approximation 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), computed as
/// v / (1 + exp(-2 sqrt(2/pi) (v + 0.044715 v^3))), the same function without
/// 1 + tanh's cancellation for negative v; relative error about 1e-6. AVX-512,
/// AVX2 (with FMA) or baseline code by engine_isa_level(). y may equal x.
void engine_gelu_tanh(const float* x, const float* bias, int64_t width, int64_t n, float* y,
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

struct conv_args {
  const float* x = nullptr;        ///< one image, nChw16c: [ic / 16][ih][iw][16]
  /// Weights in oneDNN's OIhw16i16o layout (the one its own AVX-512
  /// convolutions take, so both can share one copy):
  /// w[(((ob * ic / 16 + ib) * kh + ky) * kw + kx) * 256 + ii * 16 + oo] is
  /// output channel ob * 16 + oo, input channel ib * 16 + ii, kernel row ky
  /// and column kx.
  const float* w = nullptr;
  const float* bias = nullptr;     ///< [oc], or null
  const float* residual = nullptr; ///< shaped and stored like y, or null
  float* y = nullptr;              ///< one image, nChw16c: [oc / 16][oh][ow][16]
  int64_t ic = 0;                  ///< a multiple of 16
  int64_t oc = 0;                  ///< a multiple of 64
  int64_t ih = 0, iw = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0; ///< the bottom and right padding follow from oh and ow
  int64_t row_begin = 0, row_end = 0; ///< the output rows to compute; row_end 0: all
  int64_t oc_begin = 0, oc_end = 0;   ///< the output channels to compute, in whole groups of 64; oc_end 0: all
  bool relu = false;
};
/// y = conv(x, w) + bias [+ residual] [then max(0, .)], a direct convolution
/// without dilation, for output rows [row_begin, row_end) and output channels
/// [oc_begin, oc_end) of one image: a band of rows reads only its band of the
/// input (and the rows its window reaches), a range of channels only its
/// groups of weights. Needs AVX-512 (engine_conv_supported()).
void engine_conv(const conv_args& a);
bool engine_conv_supported();

} // namespace caf_serving::kernels::cpu
