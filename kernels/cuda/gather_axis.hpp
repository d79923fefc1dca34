/// ONNX Gather along any axis, on the element size alone (1, 2, 4 or 8 bytes), with
/// int64 or int32 indices; negative indices count from the end of the axis.
///
///   gather_axis_args a;                 // BERT's word embeddings
///   a.data = table; a.indices = ids; a.output = x; a.element_size = 2;
///   a.rank = 2; a.dims[0] = 30522; a.dims[1] = 768; a.axis = 0;
///   a.index_count = batch * seq;
///   a.error_flag = flag;                // device int, zeroed by the caller
///   launch_gather_axis(a, stream);
///
/// An index outside [-dim, dim) is never read through: its output row is written as
/// zeros and `*error_flag` is set to 1. The kernel cannot fail the request itself, so
/// the executor zeroes the flag before the step, reads it back with the outputs, and
/// turns a set flag into a clear error for that request ("Gather index out of range
/// for input 'ids'") instead of returning the zeros.
///
/// Rows of the gather (`inner` elements after the axis) are copied in up to 16-byte
/// words; rows of at least 16 words (the embedding case: a 768-wide row is 96 words in
/// fp16) take a warp each, with the index read once per row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cpu/data_layout.hpp"

namespace caf_serving::kernels {

struct gather_axis_args {
  const void* data = nullptr;
  const void* indices = nullptr; ///< `index_count` of `indices_type`, any shape
  void* output = nullptr; ///< data.dims[:axis] + indices.shape + data.dims[axis+1:]
  index_type indices_type = index_type::i64;
  std::size_t element_size = 0; ///< 1, 2, 4 or 8 bytes
  int rank = 0; ///< of `data`, 1 to 6
  std::int64_t dims[max_rank] = {};
  int axis = 0; ///< negative counts from the end
  std::int64_t index_count = 0;
  int* error_flag = nullptr; ///< device int set to 1 on an out-of-range index; required
  int threads = 0;           ///< threads per block; 0 picks the default
};

/// Enqueues the gather on `stream`. Throws `std::invalid_argument` for a bad rank or
/// axis, an element size other than 1/2/4/8 or a missing `error_flag`; `cuda_error`
/// if the launch fails.
void launch_gather_axis(const gather_axis_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
