/// ONNX Transpose of a contiguous tensor of up to 6 dims, on the element size alone
/// (1, 2, 4 or 8 bytes).
///
///   permute_args a;
///   a.input = x; a.output = y; a.element_size = 2;
///   a.shape.rank = 4; // [B, S, 12, 64] -> [B, 12, S, 64]
///   a.shape.dims = {B, S, 12, 64}; a.shape.perm = {0, 2, 1, 3};
///   launch_permute(a, stream);
///
/// Dims of size 1 are dropped and dims that stay adjacent merged first. Where the
/// innermost dim stays innermost (the head split above) it is a plain copy of
/// contiguous runs, widened to 16-byte vectors where it can be; where it moves
/// ([.., M, N] -> [.., N, M]) a 32x32 tile in shared memory keeps both the reads
/// and the writes coalesced.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cpu/data_layout.hpp"

namespace caf_serving::kernels {

struct permute_args {
  const void* input = nullptr;
  void* output = nullptr; ///< must not overlap `input`
  std::size_t element_size = 0; ///< 1, 2, 4 or 8 bytes
  permute_shape shape; ///< the input's dims; output dim i is input dim perm[i]
  int threads = 0; ///< threads per block; 0 picks the default (the tile: 32 x threads/32)
};

/// Enqueues the transpose on `stream`. Throws `std::invalid_argument` for rank > 6,
/// negative dims, a `perm` that is not a permutation or an element size other than
/// 1/2/4/8; `cuda_error` if the launch fails.
void launch_permute(const permute_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
