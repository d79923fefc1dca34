#pragma once
/// The indexing and data-movement operators that torch's exporters and
/// transformers emit besides those of ops_shape.cpp and ops_simple.cpp:
/// GatherND, ScatterND, Pad, Trilu, Resize (nearest and linear), Einsum, Tile,
/// TopK and NonZero (on a constant input only: its output shape depends on the
/// values). Each is one entry of ops_nd.cpp's table: its ONNX versions, shape
/// inference and the reference kernel, which is also its CPU step; the
/// registry (op_registry.cpp) holds the table.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The operators of ops_nd.cpp with their versions, for op_registry.cpp.
const op_table& nd_operator_table();

} // namespace caf_serving::onnx
