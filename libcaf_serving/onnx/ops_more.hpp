#pragma once
/// The element-wise, normalization and attention operators that current
/// exporters emit besides those of ops_elementwise.cpp, ops_nn.cpp and
/// ops_simple.cpp: Gelu (20), RMSNormalization and Attention (23),
/// QuantizeLinear and DequantizeLinear (per tensor and per axis, INT8/UINT8),
/// LRN, the reductions besides ReduceSum and ReduceMean (ReduceMax, ReduceMin,
/// ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum,
/// ReduceLogSumExp) and GlobalMaxPool, PRelu and the unary functions (Sin, Cos,
/// Floor, Ceil, Round, Sign, Selu, Elu, LeakyRelu, Softplus, Softsign,
/// ThresholdedRelu, Mish). Each is one entry of ops_more.cpp's table: its ONNX
/// versions, the datatypes it takes, shape inference and the reference kernel,
/// which is also its CPU step; the registry (op_registry.cpp) holds the table.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The operators of ops_more.cpp with their versions, for op_registry.cpp.
const op_table& more_operator_table();

} // namespace caf_serving::onnx
