#pragma once
/// The element-wise operators that every exporter writes: the arithmetic and
/// comparison operators with numpy broadcasting (Add, Sub, Mul, Div, Pow,
/// Equal, Greater, GreaterOrEqual, Less, LessOrEqual, And, Or, Where), the
/// unary ones (Relu, Sqrt, Erf, Tanh, Sigmoid, Not, Identity, Clip) and the
/// conversions (Cast, CastLike), with the engine's FusedGelu(X, B?): the erf
/// GELU of X (+ B), which passes.cpp writes for the erf GELU patterns and ONNX's
/// Gelu, and FusedGeluTanh(X, B?): GELU's tanh approximation of X (+ B), for
/// the tanh patterns (GPT-2's) and Gelu with approximate "tanh". Two operators,
/// not one with an attribute, so that a backend that knows only FusedGelu
/// cannot run the tanh form as the erf one: it has no kernel for FusedGeluTanh.
/// Each operator is one entry of a table: its versions, shape inference and
/// reference kernel; the registry (op_registry.cpp) holds the tables.
///
/// The binary kernels take shortcuts for the two common broadcasts, one value
/// per row (SE blocks' channel scale, [N,C,1,1] against [N,C,H,W]) and one
/// vector per row (a bias, [C] against [N,S,C]), and the numpy index walk for
/// any other.

#include "onnx/ops_common.hpp"

namespace caf_serving::onnx {

/// The ONNX operators of ops_elementwise.cpp with their versions, for op_registry.cpp.
const op_table& elementwise_operator_table();

/// The engine's own operators of ops_elementwise.cpp (FusedGelu, FusedGeluTanh), for
/// op_registry.cpp.
const op_table& elementwise_engine_table();

} // namespace caf_serving::onnx
