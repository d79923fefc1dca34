#pragma once
/// The indexing and data-movement operators that torch's exporters and
/// transformers emit besides the ones in ops.cpp and ops_simple.cpp: GatherND,
/// ScatterND, Pad, Trilu, Resize (nearest and linear), Einsum, Tile, TopK and
/// NonZero (on a constant input only: its output shape depends on the values).
/// Each is registered once, in ops_nd.cpp's table: its ONNX versions, shape
/// inference and the reference kernel, which is also its CPU step. ops.cpp
/// hands these operators here.
///
/// Usage (ops.cpp):
///
///     if (is_nd_op(n.op)) return infer_nd_op(g, n);
///     if (is_nd_op(n.op)) run_nd_op(n, inputs, outputs);

#include "onnx/ir.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/ops.hpp"

#include <string>
#include <variant>
#include <vector>

namespace caf_serving::onnx {

/// The operators of ops_nd.cpp, sorted.
const std::vector<std::string>& nd_operators();

/// The operators of ops_nd.cpp with their ONNX versions, for op_registry.cpp.
const op_table& nd_operator_table();

bool is_nd_op(const std::string& op);

/// Output types and shapes of `n`, an operator of nd_operators(); the error
/// names the input, attribute or mode that the engine does not take, and the
/// opset when the operator does not exist in it.
std::variant<std::vector<inferred>, std::string> infer_nd_op(const graph& g, const node& n);

/// Runs `n` on shapes and types that infer_nd_op() accepted.
void run_nd_op(const node& n, const std::vector<tensor_ref>& in,
               const std::vector<tensor_ref>& out);

} // namespace caf_serving::onnx
