#pragma once
/// The integer operators of quantized models, as onnxruntime's quantizer
/// writes them: QLinearConv (10), QLinearMatMul (10, 21), MatMulInteger (10),
/// ConvInteger (10) and DynamicQuantizeLinear (11). Their reference kernels are
/// exact: products accumulate in int32, QLinear* requantise with the float
/// multiplier x_scale * w_scale / y_scale (as onnxruntime computes it), round
/// halves to even and saturate to the output's type. Zero points and scales are
/// per tensor, or per output channel where ONNX allows it (the weights' of
/// QLinearConv and ConvInteger, the columns of B for the matmuls).
/// QuantizeLinear/DequantizeLinear are ops_more.cpp's. The engine's
/// QLinearMatMul takes a 9th input that ONNX's does not: an INT32 bias per
/// column, added to the sums (quant_passes.cpp writes it for a Gemm's C).
/// Each operator is one entry of a table, the engine's own 8-bit operators
/// (QLinearAdd, QMaxPool) of a table of their own; the registry
/// (op_registry.cpp) holds both. The CPU backend's int8 steps
/// (onnx_cpu/quant_steps.cpp) share the geometry and arithmetic declared here.

#include "onnx/ops_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// The 2-D geometry of a ConvInteger or QLinearConv node (NCHW input x,
/// weights [k, c / group, kh, kw]); pads resolved from auto_pad.
struct quant_conv_geometry {
  int64_t n, c, h, w, k, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, group;
  int64_t ph1, pw1; ///< bottom and right padding
};

/// The geometry of `nd` on input shape `x` and weight shape `w`, or what does not fit.
std::variant<quant_conv_geometry, std::string>
quant_conv_geometry_of(const node& nd, const std::vector<int64_t>& x, const std::vector<int64_t>& w);

/// The engine-internal quantized Add that quant_passes.cpp writes for
/// Add(DequantizeLinear(a), DequantizeLinear(b)) -> QuantizeLinear: inputs
/// (A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
/// C_zero_point) as com.microsoft's QLinearAdd, per-tensor scales, optional
/// attribute activation "Relu". In quant_engine_table(): no model names it, and
/// the importer refuses it.
inline constexpr const char* quant_add_op = "QLinearAdd";

/// The engine-internal MaxPool of an 8-bit tensor that quant_passes.cpp
/// writes for DequantizeLinear -> MaxPool -> QuantizeLinear with one scale and
/// zero point on both sides (the max of the 8-bit values is exactly that):
/// input X, MaxPool's kernel_shape, strides, pads and dilations (2-D,
/// explicit pads, floor rounding). In quant_engine_table(): no model names it,
/// and the importer refuses it.
inline constexpr const char* quant_max_pool_op = "QMaxPool";

/// QLinearAdd's arithmetic, as onnxruntime's MlasQLinearAdd: the scale ratios
/// A_scale / C_scale and B_scale / C_scale in float, c = saturate(
/// round_half_even(a_ratio * (a - a_zero) + b_ratio * (b - b_zero)) + c_zero).
/// It may differ by one quantum from QuantizeLinear(DQ(a) + DQ(b)), which
/// rounds (DQ(a) + DQ(b)) / C_scale.
struct quant_add_params {
  float a_ratio = 1, b_ratio = 1;
  int32_t a_zero = 0, b_zero = 0, c_zero = 0;
};

/// The parameters of a QLinearAdd from its inputs (tensor_refs of its 8 inputs).
quant_add_params quant_add_params_of(const std::vector<tensor_ref>& in);

/// c[i] = QLinearAdd(a[i], b[i]) for i < count (8-bit types).
template <class A, class B, class C>
inline void quant_add_span(const quant_add_params& p, const A* a, const B* b, C* c, int64_t count) {
  constexpr float lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
  const float az = static_cast<float>(p.a_zero), bz = static_cast<float>(p.b_zero),
              cz = static_cast<float>(p.c_zero);
  for (int64_t i = 0; i < count; ++i) {
    float v = p.a_ratio * (static_cast<float>(a[i]) - az)
              + p.b_ratio * (static_cast<float>(b[i]) - bz);
    // Saturate, then round half to even (the default rounding mode) by adding
    // and taking away 1.5 * 2^23: std::nearbyint is a libm call per element
    // without SSE4.1 in the build's flags, this loop vectorises.
    v = std::clamp(v, lo - cz, hi - cz);
    v = (v + 12582912.0f) - 12582912.0f;
    c[i] = static_cast<C>(static_cast<int32_t>(v + cz));
  }
}

/// The ONNX operators of ops_quant.cpp with their versions, for op_registry.cpp.
const op_table& quant_operator_table();

/// The engine's own 8-bit operators (QLinearAdd, QMaxPool), for op_registry.cpp.
const op_table& quant_engine_table();

} // namespace caf_serving::onnx
