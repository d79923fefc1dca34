#pragma once
/// The element-wise and indexing operators that current exporters emit around
/// a model's main work: torch's attention masks (IsNaN,
/// Max/Min), transformers' embeddings (GatherElements, CumSum), MobileNetV3's
/// activations (HardSigmoid, HardSwish), index arithmetic (Mod, Abs on INT64).
/// Each is one entry of ops_simple.cpp's table: its ONNX versions, the
/// datatypes it takes, shape inference and the reference kernel, which is also
/// its CPU step; the registry (op_registry.cpp) holds the table.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The operators of ops_simple.cpp with their versions, for op_registry.cpp.
const op_table& simple_operator_table();

} // namespace caf_serving::onnx
