/// The data-movement and reduction part of the kernel table (`check/kernel_cases.hpp`):
/// permute, strided_copy, gather_axis and reduce, at the shapes the target models use
/// and at ragged ones. Their sizes are N-d: `case_size::shape` and `case_size::params`
/// (what `params` holds is said per op in `data_case`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/data_layout.hpp"

namespace caf_serving::kernels {

struct kernel_case;
struct case_size;

/// Which ONNX operator a strided_copy case builds its boxes for.
enum class copy_pattern {
  slice,  ///< shape: input dims; params: starts, steps, output dims (rank each)
  split,  ///< shape: input dims; params: axis, then the parts' sizes on it (one box each, one launch)
  concat, ///< shape: output dims; params: axis, then the inputs' sizes on it (one box each, one launch)
  expand, ///< shape: output dims; params: input dims (aligned on the right)
  pad,    ///< shape: input dims; params: pads before, pads after (rank each); fill, then a box
};

const char* copy_pattern_name(copy_pattern p);

/// What a data-movement or reduction case adds to its `kernel_case`.
///   permute:      shape = input dims, params = perm
///   gather_axis:  shape = data dims, params = axis, then the indices' dims
///   reduce:       shape = input dims, params = axes; the storage type is kernel_case::type
struct data_case {
  std::size_t element_bytes = 4;              ///< permute, strided_copy, gather_axis
  copy_pattern pattern = copy_pattern::slice; ///< strided_copy
  index_type indices = index_type::i64;       ///< gather_axis
  bool out_of_range = false; ///< gather_axis: some indices outside the axis (zeros and the flag)
  reduce_op reduce = reduce_op::sum; ///< reduce
};

/// One box of a strided_copy case, at element offsets into the case's one source
/// and one destination buffer (the device gives each part of a Split or Concat its
/// own pointer, so parts start unaligned where their sizes say so).
struct placed_box {
  std::int64_t src_at = 0;
  std::int64_t dst_at = 0;
  strided_box box;
};

/// The boxes a strided_copy case builds from its pattern, shape and params, with the
/// elements of its source and destination buffers.
struct copy_case_boxes {
  std::vector<placed_box> boxes;
  std::int64_t src_elements = 0;
  std::int64_t dst_elements = 0;
  std::uint64_t pad_value = 0; ///< pad: the fill value's bytes (1.0 for f16/f32)
};

copy_case_boxes plan_copy_case(const kernel_case& c, const case_size& size);

/// Appends the permute, strided_copy, gather_axis and reduce cases to `table`.
void append_data_cases(std::vector<kernel_case>& table);

/// "2x128x12x64 [0,2,1,3]" style text of an N-d size.
std::string describe_data(const case_size& size);

} // namespace caf_serving::kernels
