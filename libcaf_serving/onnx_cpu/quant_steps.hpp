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
/// Each step is the build of its operator's entry in the CPU kernel table
/// (cpu_kernels(), onnx_backend.cpp), where the node fits it:
///
///     if (!qlinear_conv_runs_on_onednn(g, n)) return std::nullopt; // the reference runs it
///     return qlinear_conv_step(ctx, g, n, threads);
///
/// and alike qlinear_add_runs_in_spans() with qlinear_add_step() (QLinearAdd),
/// quant_linear_runs_in_spans() with quant_linear_step() (QuantizeLinear,
/// DequantizeLinear), qlinear_matmul_runs_on_onednn() with
/// qlinear_matmul_step(), and qmax_pool_step() for every QMaxPool.
///
/// A QLinearConv with fewer images than threads splits its output rows into
/// one band per thread; `activation` "Relu" (quant_passes.hpp) is a oneDNN
/// post-op.

#include "onnx_cpu/onednn_steps.hpp"

namespace caf_serving::onnx {

/// Whether qlinear_conv_step() computes QLinearConv node `n`.
bool qlinear_conv_runs_on_onednn(const graph& g, const node& n);

/// The step of QLinearConv node `n`: one oneDNN call per image, or per band
/// of output rows when there are fewer images than threads; NHWC inside,
/// reading and writing NCHW or NHWC as assign_int8_layouts() marked it.
step qlinear_conv_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads);

/// The exact path of qlinear_conv_step() and qlinear_matmul_step(), which
/// they take where oneDNN's int8 products saturate (no VNNI: cpu_level.hpp):
/// the weights split into two halves whose products cannot saturate, INT32
/// sums, and the reference kernel's requantisation, equal to it to the bit.
step qlinear_conv_exact_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                             unsigned threads);
step qlinear_matmul_exact_step(const dnnl_ctx& ctx, const graph& g, const node& n,
                               unsigned threads);

/// Keeps the 8-bit tensors between QLinearConv (on oneDNN), QLinearAdd and
/// QMaxPool nodes in NHWC, the layout of oneDNN's AMX and VNNI int8 convolutions, so
/// that no tensor is reordered twice between two convolutions (measured:
/// ResNet-50's NCHW <-> NHWC reorders took 80% of its int8 convolutions' time
/// at batch 1). A tensor stays NHWC when every node that reads it takes NHWC
/// and it is no graph output; a QLinearAdd's three tensors share one layout,
/// and a QMaxPool's two. Marks each QLinearConv's x_nhwc and y_nhwc and each
/// QMaxPool's nhwc. Call after the passes, when
/// QLinearConv runs on oneDNN (int8_onednn).
void assign_int8_layouts(graph& g);

/// Whether qlinear_add_step() computes QLinearAdd node `n` (quant_passes.hpp):
/// constant scales and zero points, A, B and C of one shape (no broadcasting).
bool qlinear_add_runs_in_spans(const graph& g, const node& n);

/// The step of QLinearAdd node `n`: spans of elements split over the threads.
step qlinear_add_step(const graph& g, const node& n, unsigned threads);

/// Whether qlinear_matmul_step() computes QLinearMatMul node `n`: constant
/// INT8 weights [K, N] with zero points 0 and constant scales and zero points
/// (what fuse_qdq writes for a MatMul or Gemm); A of rank 2 or more.
bool qlinear_matmul_runs_on_onednn(const graph& g, const node& n);

/// The step of such a node: oneDNN's int8 matmul over A's rows as [M, K]
/// (bands of rows over the threads), per-column scales, the INT32 bias.
step qlinear_matmul_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads);

/// The step of a QMaxPool node (ops_quant.hpp): oneDNN's int8 max pooling,
/// NHWC where assign_int8_layouts() marked it, split by images.
step qmax_pool_step(const dnnl_ctx& ctx, const graph& g, const node& n, unsigned threads);

/// Whether quant_linear_step() computes QuantizeLinear or DequantizeLinear
/// node `n`: FLOAT to or from an 8-bit type, one constant scale and zero point
/// (what stays of a QDQ model around the operators fuse_qdq leaves in fp32).
bool quant_linear_runs_in_spans(const graph& g, const node& n);

/// The step of such a node: spans over the threads, vectorised, equal to the
/// reference kernel to the bit.
step quant_linear_step(const graph& g, const node& n, unsigned threads);

} // namespace caf_serving::onnx
