#pragma once
/// The element-wise and indexing operators that current exporters emit around
/// a model's main work: torch's attention masks (IsNaN,
/// Max/Min), transformers' embeddings (GatherElements, CumSum), MobileNetV3's
/// activations (HardSigmoid, HardSwish), index arithmetic (Mod, Abs on INT64).
/// Each is registered once, in ops_simple.cpp's table: its ONNX versions,
/// the datatypes it takes, shape inference and the reference kernel, which is
/// also its CPU step. ops.cpp hands these operators here.
///
/// Usage (ops.cpp):
///
///     if (is_simple_op(n.op)) return infer_simple_op(g, n);
///     if (is_simple_op(n.op)) run_simple_op(n, inputs, outputs);

#include "onnx/ir.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/ops.hpp"

#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// The operators of ops_simple.cpp, sorted.
const std::vector<std::string>& simple_operators();

/// The operators of ops_simple.cpp with their ONNX versions, for op_registry.cpp.
const op_table& simple_operator_table();

bool is_simple_op(const std::string& op);

/// Whether `op` computes each output element from the input elements at the
/// same index alone (with inputs of the output's shape, any slice of them runs
/// on its own): the unary operators, Max, Min and Mod.
bool is_elementwise_simple_op(const std::string& op);

/// Output types and shapes of `n`, an operator of simple_operators(); the
/// error names an input datatype the kernel does not take, an attribute out of
/// range, or an opset before the operator's first version.
std::variant<std::vector<inferred>, std::string> infer_simple_op(const graph& g, const node& n);

/// Runs `n` on shapes and types that infer_simple_op() accepted.
void run_simple_op(const node& n, const std::vector<tensor_ref>& in,
                   const std::vector<tensor_ref>& out);

} // namespace caf_serving::onnx
