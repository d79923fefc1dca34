/// Row softmax with an optional additive or boolean mask, computed in fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cpu/types.hpp"

namespace caf_serving::kernels {

struct softmax_args {
  dtype type = dtype::f32;      ///< of input and output
  const void* input = nullptr;  ///< [rows, cols]
  void* output = nullptr;       ///< [rows, cols]; may alias `input`
  std::size_t rows = 0;
  std::size_t cols = 0;
  mask_kind mask = mask_kind::none;
  /// [mask_rows, cols]: float (or `mask_type`) for an additive mask, uint8
  /// (nonzero keeps) for a boolean one; row r uses mask row r % mask_rows. A fully
  /// masked row becomes zeros.
  const void* mask_data = nullptr;
  /// An additive mask's type: f32, or `type` (a mask stored in half precision
  /// like the scores, precision fp16/bf16 in the CUDA backend).
  dtype mask_type = dtype::f32;
  std::size_t mask_rows = 1;
  /// When `mask_layout.heads` > 0, the mask is read through these strides
  /// instead (attention scores [B, H, Sq, Sk] with a broadcast mask; types.hpp),
  /// and `mask_rows` is not used.
  mask_strides mask_layout;
  int threads = 0; ///< threads per block; 0 picks by row length
};

/// Enqueues the kernel on `stream`. Throws `std::invalid_argument` for an additive
/// mask of a type other than f32 or `type`, `cuda_error` if the launch fails.
void launch_softmax(const softmax_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
