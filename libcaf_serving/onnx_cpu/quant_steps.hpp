#pragma once
/// QLinearConv on oneDNN's int8 convolution (u8s8 or s8s8 with int32
/// accumulation, per-tensor or per-output-channel output scales, runtime
/// source and destination zero points): the step that onnx_backend.cpp
/// compiles for a QLinearConv whose weights are constant INT8 with zero points
/// of 0 (what onnxruntime's quantizer writes); the others run the reference
/// kernel of ops_quant.cpp. The requantisation multiplies the int32 sum (bias
/// included) by x_scale * w_scale / y_scale in float, as the reference and
/// onnxruntime do.
///
///     if (qlinear_conv_runs_on_onednn(g, n)) return qlinear_conv_step(ctx, g, n, threads);

#include "onnx_cpu/onednn_steps.hpp"

namespace caf_serving::onnx {

/// Whether qlinear_conv_step() computes QLinearConv node `n`.
bool qlinear_conv_runs_on_onednn(const graph& g, const node& n);

/// The step of QLinearConv node `n`: one oneDNN call per image (NCHW, 8-bit).
step qlinear_conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads);

} // namespace caf_serving::onnx
