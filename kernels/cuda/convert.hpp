/// fp32 ↔ fp16/bf16 conversion at the serving edges (round to nearest even).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cpu/types.hpp"

namespace caf_serving::kernels {

struct convert_args {
  dtype from = dtype::f32;
  dtype to = dtype::f16; ///< one of `from` and `to` is f32, the other f16 or bf16
  const void* input = nullptr;
  void* output = nullptr; ///< must not overlap `input`
  std::size_t count = 0;
  int threads = 0; ///< threads per block; 0 picks the default
};

/// Enqueues the conversion on `stream`. Throws `std::invalid_argument` for a pair
/// of types other than f32 ↔ f16/bf16, `cuda_error` if the launch fails.
void launch_convert(const convert_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
