#pragma once
/// The launches of the element-wise device steps (steps_elementwise.cpp), planned
/// from a node and the bucket's fixed shapes without a device: which launcher
/// (binary, unary, where, cast), the kernels' types, the operator and its
/// parameters, the broadcast layout. The steps fill in the device addresses;
/// elementwise_plan.test.cpp runs the same plans through the kernels' CPU
/// references (kernels/cpu/reference_elementwise.hpp) against the operators'
/// reference kernels.
///
///   if (auto p = plan_elementwise(g, n)) ... p->kernel, p->binary_layout, ...
///
/// Nothing (std::nullopt) for a node the kernels cannot take: it stays a host step.

#include "onnx/ir.hpp"

#include "cpu/elementwise_math.hpp"
#include "cpu/types.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::cuda {

struct elementwise_plan {
  std::string kernel; ///< "binary", "unary", "where" or "cast"
  kernels::dtype type = kernels::dtype::f32; ///< of the (non-condition) inputs; Cast's source
  kernels::dtype to = kernels::dtype::f32;   ///< Cast's target
  /// A Cast to FLOAT16/BFLOAT16 inside the graph keeps fp32 values rounded to the
  /// half's precision (onnx/ops_elementwise.cpp's run_cast): cast `type` -> `via`
  /// into a scratch buffer, then `via` -> f32 (`to`). Nothing for a plain Cast.
  std::optional<kernels::dtype> via;
  kernels::binary_op binary = kernels::binary_op::add;
  kernels::unary_op unary = kernels::unary_op::identity;
  kernels::unary_params params; ///< the unary operator's attributes, Clip's constant bounds
  kernels::broadcast_layout<2> binary_layout; ///< binary: a (0), b (1)
  kernels::broadcast_layout<3> where_layout;  ///< where: condition (0), x (1), y (2)
  std::vector<int> inputs; ///< the values the launch reads, in the launcher's order
  int output = -1;
  std::size_t count = 0; ///< output elements (0: nothing to launch)
};

/// The most scratch bytes a rounding Cast's intermediate half tensor takes (the
/// step builder's workspace, free between steps on the one compute stream); a
/// larger one stays a host step.
inline constexpr std::size_t max_cast_scratch_bytes = std::size_t{64} << 20;

/// The kernels' type of an ONNX type: fp32 fp16 bf16 int64 int32 int8 uint8 bool.
std::optional<kernels::dtype> kernel_type(datatype t);

/// The plan of an element-wise node, or nothing when the kernels do not take it.
std::optional<elementwise_plan> plan_elementwise(const onnx::graph& g, const onnx::node& n);

} // namespace caf_serving::cuda
