#pragma once
/// The element-wise, normalization and attention operators that current
/// exporters emit besides those of ops.cpp and ops_simple.cpp: Gelu (20),
/// RMSNormalization and Attention (23), QuantizeLinear and DequantizeLinear
/// (per tensor and per axis, INT8/UINT8), LRN, the reductions besides ReduceSum
/// and ReduceMean (ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
/// ReduceSumSquare, ReduceLogSum, ReduceLogSumExp) and GlobalMaxPool,
/// PRelu and the unary functions (Sin, Cos, Floor, Ceil, Round, Sign, Selu, Elu,
/// LeakyRelu, Softplus, Softsign, ThresholdedRelu, Mish). Each is registered
/// once, in ops_more.cpp's table: its ONNX versions, the datatypes it takes,
/// shape inference and the reference kernel, which is also its CPU step.
/// ops.cpp hands these operators here.
///
/// Usage (ops.cpp):
///
///     if (is_more_op(n.op)) return infer_more_op(g, n);
///     if (is_more_op(n.op)) run_more_op(n, inputs, outputs);

#include "onnx/ir.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/ops.hpp"

#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// The operators of ops_more.cpp, sorted.
const std::vector<std::string>& more_operators();

/// The operators of ops_more.cpp with their ONNX versions, for op_registry.cpp.
const op_table& more_operator_table();

bool is_more_op(const std::string& op);

/// Whether `op` computes each output element from the input elements at the
/// same index alone (the unary functions, and PRelu with a slope of X's
/// shape): any slice of equally shaped inputs runs on its own.
bool is_elementwise_more_op(const std::string& op);

/// Output types and shapes of `n`, an operator of more_operators(); the error
/// names the input, attribute or mode that the engine does not take, and the
/// opset when the operator does not exist in it.
std::variant<std::vector<inferred>, std::string> infer_more_op(const graph& g, const node& n);

/// Runs `n` on shapes and types that infer_more_op() accepted.
void run_more_op(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out);

} // namespace caf_serving::onnx
