#pragma once
/// The integer operators of quantized models, as onnxruntime's quantizer
/// writes them: QLinearConv (10), QLinearMatMul (10, 21), MatMulInteger (10),
/// ConvInteger (10) and DynamicQuantizeLinear (11). Their reference kernels are
/// exact: products accumulate in int32, QLinear* requantise with the float
/// multiplier x_scale * w_scale / y_scale (as onnxruntime computes it), round
/// halves to even and saturate to the output's type. Zero points and scales are
/// per tensor, or per output channel where ONNX allows it (the weights' of
/// QLinearConv and ConvInteger, the columns of B for the matmuls).
/// QuantizeLinear/DequantizeLinear are ops_more.cpp's.
///
/// Usage (ops.cpp):
///
///     if (is_quant_op(n.op)) return infer_quant_op(g, n);
///     if (is_quant_op(n.op)) run_quant_op(n, inputs, outputs);

#include "onnx/ir.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/ops.hpp"

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

/// The operators of ops_quant.cpp with their ONNX versions, for op_registry.cpp.
const op_table& quant_operator_table();

bool is_quant_op(const std::string& op);

/// Output types and shapes of `n`, an operator of quant_operator_table(); the
/// error names the input, attribute or type that the engine does not take.
std::variant<std::vector<inferred>, std::string> infer_quant_op(const graph& g, const node& n);

/// Runs `n` on shapes and types that infer_quant_op() accepted.
void run_quant_op(const node& n, const std::vector<tensor_ref>& in,
                  const std::vector<tensor_ref>& out);

} // namespace caf_serving::onnx
