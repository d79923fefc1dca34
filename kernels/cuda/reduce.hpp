/// ONNX ReduceSum/Mean/Max/Min/Prod/SumSquare/L2 over a set of axes, with f32, f16 or
/// bf16 storage and f32 accumulation.
///
///   reduce_args a;                 // EfficientNet's squeeze-excite mean over H, W
///   a.type = dtype::f16; a.input = x; a.output = y; a.op = reduce_op::mean;
///   a.rank = 4; a.dims = {N, C, H, W}; a.axes = {2, 3}; a.axis_count = 2;
///   launch_reduce(a, stream);      // y: [N, C] (keepdims is only a shape)
///
/// The launcher normalises the request to [outer, reduced, inner]
/// (`make_reduce_shape` in cpu/data_layout.hpp). Refused: reduced axes that are not
/// adjacent once size-1 dims are ignored ([A, B, C] over {0, 2} with B > 1: transpose
/// first, or reduce twice), repeated or out-of-range axes, rank > 6 and integer types.
/// No axes reduce nothing (each output is the op of one element: x, x², |x|).
/// An empty reduction gives the identity (0; 1 for prod; -inf/+inf for max/min; NaN for
/// mean). Max and min propagate NaN.
///
/// Paths: inner == 1 (LayerNorm-style means, GlobalAveragePool, SE means over H, W)
/// reduces contiguous rows, a warp per row (16-byte loads where rows allow), or a whole
/// block per row for long rows with few of them; inner > 1 reads coalesced across
/// `inner`, a block of 32 columns splitting the reduced dim over its rows of threads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cpu/data_layout.hpp"
#include "cpu/types.hpp"

namespace caf_serving::kernels {

struct reduce_args {
  dtype type = dtype::f32; ///< f32, f16 or bf16, for the input and the output
  const void* input = nullptr;
  void* output = nullptr; ///< outer * inner elements
  reduce_op op = reduce_op::sum;
  int rank = 0;
  std::int64_t dims[max_rank] = {};
  int axes[max_rank] = {}; ///< negative counts from the end
  int axis_count = 0;
  int threads = 0; ///< threads per block; 0 picks the default
};

/// Enqueues the reduction on `stream`. Throws `std::invalid_argument` for what the
/// header above says is refused; `cuda_error` if the launch fails.
void launch_reduce(const reduce_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
