#pragma once
/// The launches of the data-movement and reduction device steps (steps_data.cpp),
/// planned from a node and the bucket's fixed shapes without a device: which
/// values each box copy, permute, gather or reduction reads and writes, with the
/// kernels' own index arithmetic (kernels/cpu/data_layout.hpp). The steps fill in
/// the device addresses; data_plan.test.cpp runs the same plans through the
/// kernels' CPU references against the operators' reference kernels.
///
///   if (auto p = plan_data_step(g, n)) ... p->kernel, p->copies, ...
///
/// Nothing (std::nullopt) for a node the kernels cannot take: it stays a host step.

#include "onnx/ir.hpp"

#include "cpu/data_layout.hpp"
#include "cpu/types.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving::cuda {

/// One box copy from value `src` into value `dst`.
struct planned_copy {
  int src = -1;
  int dst = -1;
  kernels::strided_box box;
  int64_t src_elements = 0;
  int64_t dst_elements = 0;
};

struct data_plan {
  std::string kernel; ///< "permute", "concat", "split", "slice", "expand", "tile", "pad", "gather", "reduce"
  size_t element_size = 0; ///< of the moved elements (movement steps)
  int input = -1;          ///< permute, gather (data), reduce
  int indices = -1;        ///< gather
  int output = -1;         ///< permute, gather, reduce, pad (the fill)
  int64_t output_elements = 0;
  std::vector<planned_copy> copies; ///< in order, after the fill
  bool fill = false;       ///< pad: the output filled with `fill_value` first
  uint64_t fill_value = 0; ///< its low element_size bytes
  kernels::permute_shape permute;
  kernels::index_type indices_type = kernels::index_type::i64;
  int gather_rank = 0;
  int64_t gather_dims[kernels::max_rank] = {};
  int gather_axis = 0;
  int64_t index_count = 0;
  kernels::dtype reduce_type = kernels::dtype::f32;
  kernels::reduce_op reduce_op = kernels::reduce_op::sum;
  int reduce_rank = 0;
  int64_t reduce_dims[kernels::max_rank] = {};
  int reduce_axes[kernels::max_rank] = {};
  int reduce_axis_count = 0;
};

/// The plan of `n` (Transpose, Concat, Split, Slice, Gather, Expand, Tile, Pad,
/// ReduceMean/Sum/Max/Min/Prod/L2/SumSquare, GlobalAveragePool/GlobalMaxPool), or
/// nothing where the kernels do not take it (shapes, types, runtime starts or
/// axes, a constant index out of range, non-adjacent reduced axes).
std::optional<data_plan> plan_data_step(const onnx::graph& g, const onnx::node& n);

} // namespace caf_serving::cuda
