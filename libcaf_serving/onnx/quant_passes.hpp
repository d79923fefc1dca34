#pragma once
/// The QDQ rewrite: onnxruntime.quantization.quantize_static writes int8
/// models in the QDQ format, fp32 operators between DequantizeLinear (DQ) and
/// QuantizeLinear (Q) nodes. Run as written, every activation is dequantized
/// to fp32, computed in fp32 and quantized again (ResNet-50: 74 Q and 74 DQ
/// over whole activations, 0.7x onnxruntime). As onnxruntime's QDQ
/// transformer does, fuse_qdq() turns each group into one integer operator
/// that reads and writes the 8-bit tensors themselves:
///
///   DQ(x) , DQ(w constant) [, bias] -> Conv [-> Relu] -> Q
///       ==> QLinearConv(x, w, bias as INT32) [activation Relu]
///   DQ(a) , DQ(b) -> Add [-> Relu] -> Q  ==>  QLinearAdd(a, b) (ops_quant.hpp)
///   DQ(x) , DQ(w constant) -> MatMul -> Q  ==>  QLinearMatMul(x, w)
///   DQ(x) , DQ(w constant) [, C] -> Gemm -> Q  ==>  QLinearMatMul(x, w as [K, N],
///       C as an INT32 bias per column) (transA 0, alpha 1, beta 1)
///   DQ(x) -> MaxPool -> Q of the same scale and zero point  ==>  QMaxPool(x)
///       (the max of the 8-bit values; explicit pads, floor rounding)
///
/// A Q whose output only these read, and the DQs between two rewritten
/// nodes, vanish: activations stay 8-bit from one fused node to the next.
///
/// What qualifies: x, a, b, y per tensor (one scale, one zero point, constant,
/// 8-bit); weights a constant 8-bit 4-D (2-D) tensor, per tensor or per output
/// channel (DQ axis 0; a MatMul's columns: axis 1); bias absent, a constant FLOAT, or a DQ of a constant
/// (through Identity nodes). The INT32 bias is round_half_even(bias /
/// (x_scale * w_scale[k])): exactly onnxruntime's quantized bias when the
/// model's bias scale is x_scale * w_scale, as the quantizer writes it. Any
/// other group (weights computed at run time, per-channel weights on another
/// axis, a tensor the graph also outputs) is left as it is and runs in fp32.
///
/// Numerics: QLinearConv requantises the exact int32 sum with the float
/// multiplier x_scale * w_scale / y_scale, as onnxruntime does; the fp32 graph
/// rounds conv(DQ(x), DQ(w)) / y_scale instead, and the two may differ by one
/// quantum where a value falls near a rounding midpoint.
/// GlobalAveragePool keeps its DQ/Q and runs in fp32 (a small share of the
/// CNNs' time).
///
///     graph g = imported;
///     fuse_qdq(g);                   // before specialize(): weights still INT8
///     auto opt = specialize(g, shapes);

#include "onnx/ir.hpp"

namespace caf_serving::onnx {

/// What fuse_qdq() rewrote.
struct qdq_fusions {
  int convs = 0;
  int adds = 0;
  int max_pools = 0;
  int matmuls = 0;
};

/// Rewrites the QDQ groups of `g` onto QLinearConv, QLinearMatMul, QLinearAdd
/// and QMaxPool (above) and
/// drops the nodes nothing reads any more. Works on an imported graph, before
/// shape inference: it needs only the constants.
qdq_fusions fuse_qdq(graph& g);

} // namespace caf_serving::onnx
