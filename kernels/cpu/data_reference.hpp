/// Plain C++ references of the data-movement and reduction kernels.
///
/// The copies run the same plans as the device (`cpu/data_layout.hpp`: collapsed,
/// widened, tiled), element by element, so the CPU tests that compare them with
/// naive loops over the original shapes check the index arithmetic the GPU runs.
/// The reduction accumulates in double, far below any kernel tolerance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/data_layout.hpp"

namespace caf_serving::kernels::ref {

/// `dst` after copying `plan`'s box from `src` into it.
std::vector<std::uint8_t> run_copy_plan(const copy_plan& plan,
                                        const std::vector<std::uint8_t>& src,
                                        std::vector<std::uint8_t> dst);

/// The transposed tensor, through `plan_permute` (plain or tiled) as the device runs it.
std::vector<std::uint8_t> permute(const std::vector<std::uint8_t>& input,
                                  std::size_t element_size, const permute_shape& shape);

/// `dst` after copying `box` from `src` (checked, collapsed and widened as the device
/// does it).
std::vector<std::uint8_t> strided_copy(const std::vector<std::uint8_t>& src,
                                       std::vector<std::uint8_t> dst,
                                       std::size_t element_size, const strided_box& box);

/// Gather's output, zeros for rows whose index is out of range, and whether any was.
struct gather_result {
  std::vector<std::uint8_t> output;
  bool out_of_range = false;
};

gather_result gather_axis(const std::vector<std::uint8_t>& data, std::size_t element_size,
                          const gather_shape& shape, const std::vector<std::int64_t>& indices);

/// [outer, reduced, inner] -> [outer, inner], accumulated in double.
std::vector<float> reduce(const std::vector<float>& x, const reduce_shape& shape,
                          reduce_op op);

} // namespace caf_serving::kernels::ref
