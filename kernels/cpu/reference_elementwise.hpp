/// Plain C++ references for the element-wise kernels (`cuda/elementwise.hpp`).
///
/// Tensors are the bytes of their elements as the device stores them (f16/bf16 as
/// IEEE binary16/bfloat16 bits, bool as one byte 0 or 1), so the checks upload and
/// compare the very same buffers. The references walk the output with the same
/// `collapse` and `broadcast_cursor` as the kernels and compute with the same
/// operator functions (`cpu/elementwise_math.hpp`); what they add is the host's
/// storage conversions and a plain loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/elementwise_math.hpp"
#include "cpu/types.hpp"

namespace caf_serving::kernels::ref {

/// Element `i` of a buffer of `type` as a double (exact except i64 beyond 2^53).
double load_value(dtype type, const std::uint8_t* data, std::size_t i);

/// Element `i` of an integer or bool buffer, exactly.
std::int64_t load_integer(dtype type, const std::uint8_t* data, std::size_t i);

/// Stores `x` into element `i` of a buffer of `type`: floats round to nearest even,
/// integers and bool go through Cast's rules (`cast` below).
void store_value(dtype type, double x, std::uint8_t* data, std::size_t i);

/// `op(a, b)` over `layout` (operand 0 is a, 1 is b); the output, of type
/// `binary_output_type(op, type)`, is contiguous over the layout's shape.
std::vector<std::uint8_t> binary(binary_op op, dtype type, const broadcast_layout<2>& layout,
                                 const std::uint8_t* a, const std::uint8_t* b);

/// `op(x)` of `count` elements.
std::vector<std::uint8_t> unary(unary_op op, dtype type, const unary_params& params,
                                const std::uint8_t* x, std::size_t count);

/// `condition ? x : y` over `layout` (operand 0 is the bool condition, 1 is x, 2 is y).
std::vector<std::uint8_t> where(dtype type, const broadcast_layout<3>& layout,
                                const std::uint8_t* condition, const std::uint8_t* x,
                                const std::uint8_t* y);

/// Cast of `count` elements from `from` to `to` with ONNX's rules (see
/// `cpu/elementwise_math.hpp` for what ONNX leaves open).
std::vector<std::uint8_t> cast(dtype from, dtype to, const std::uint8_t* x, std::size_t count);

} // namespace caf_serving::kernels::ref
