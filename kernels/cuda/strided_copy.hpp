/// Strided N-d box copies: ONNX Slice (steps, negative steps), Split, Concat, Expand
/// (source stride 0) and constant Pad (`launch_fill`, then the input's box), on the
/// element size alone (1, 2, 4 or 8 bytes; the datatype does not matter).
///
///   strided_copy_args a;
///   a.src = x; a.dst = y; a.element_size = 2;
///   a.box = slice_box(in_dims, starts, steps, out_dims); // cpu/data_layout.hpp
///   launch_strided_copy(a, stream);
///
/// Boxes are collapsed (size-1 dims dropped, adjacent dims merged) and widened to
/// 16-byte vectors where strides, offsets and pointers allow.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/data_layout.hpp"

namespace caf_serving::kernels {

struct strided_copy_args {
  const void* src = nullptr;
  void* dst = nullptr; ///< must not overlap `src`
  std::size_t element_size = 0; ///< 1, 2, 4 or 8 bytes
  strided_box box;              ///< in elements; see cpu/data_layout.hpp
  std::int64_t src_elements = 0; ///< > 0: the box must stay inside; 0: not checked
  std::int64_t dst_elements = 0; ///< > 0: the box must stay inside; 0: not checked
  int threads = 0;               ///< threads per block; 0 picks the default
};

/// Enqueues one box copy on `stream`. Throws `std::invalid_argument` for an element
/// size other than 1/2/4/8, rank > 6, negative dims, a destination stride 0 on a dim
/// of size > 1, or a box that reaches outside its buffers; `cuda_error` if the launch
/// fails.
void launch_strided_copy(const strided_copy_args& args, cudaStream_t stream);

/// Several boxes (Concat: one per input into one output; Split: one per output) in
/// one launch, up to `max_boxes_per_launch`; longer lists take several launches. Each
/// box is checked as by `launch_strided_copy` before anything is enqueued.
inline constexpr int max_boxes_per_launch = 16;
void launch_strided_copies(const std::vector<strided_copy_args>& copies, cudaStream_t stream);

/// Writes `count` elements of `element_size` bytes at `dst`, each the low
/// `element_size` bytes of `value` (little-endian): the pad value of constant Pad
/// before the input's box goes in.
struct fill_args {
  void* dst = nullptr; ///< aligned to `element_size`
  std::size_t element_size = 0; ///< 1, 2, 4 or 8 bytes
  std::int64_t count = 0;
  std::uint64_t value = 0;
  int threads = 0;
};
void launch_fill(const fill_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
