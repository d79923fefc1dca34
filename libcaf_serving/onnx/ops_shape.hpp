#pragma once
/// The shape and data-movement operators that every exporter writes: the
/// constants (Constant, ConstantOfShape, Range), Shape, the views that only
/// change a shape (Reshape, Flatten, Squeeze, Unsqueeze), and the copies that
/// move elements (Gather, Slice, Concat, Split, Expand, Transpose). Each
/// operator is one entry of a table: its versions, shape inference, reference
/// kernel and, where an ONNX version defines something the engine refuses, its
/// check; the registry (op_registry.cpp) holds the table. Shape-determining
/// inputs (Reshape's target, Slice's starts, ...) must be constants.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The operators of ops_shape.cpp with their versions, for op_registry.cpp.
const op_table& shape_operator_table();

} // namespace caf_serving::onnx
