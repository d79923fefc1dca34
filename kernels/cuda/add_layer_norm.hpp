/// Residual add + LayerNorm in one pass over each row:
/// `sum = input + residual; output = (sum - mean) / sqrt(var + eps) * gamma + beta`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cpu/types.hpp"

namespace caf_serving::kernels {

struct add_layer_norm_args {
  dtype type = dtype::f32;        ///< of every tensor
  const void* input = nullptr;    ///< [rows, cols]
  const void* residual = nullptr; ///< [rows, cols], or null to normalise `input` alone
  const void* gamma = nullptr;    ///< [cols]
  const void* beta = nullptr;     ///< [cols]
  void* output = nullptr;         ///< [rows, cols]
  void* sum_output = nullptr;     ///< optional [rows, cols]: the pre-norm sum, for pre-norm blocks
  std::size_t rows = 0;
  std::size_t cols = 0; ///< at most `add_layer_norm_max_cols`
  float eps = 1e-5f;
  int threads = 0; ///< threads per block (one block per row); 0 picks the default
};

/// The row is kept in shared memory as fp32, so its length is bounded.
constexpr std::size_t add_layer_norm_max_cols = 32768;

/// Enqueues the kernel on `stream`. Throws `std::invalid_argument` for rows longer
/// than `add_layer_norm_max_cols`, `cuda_error` if the launch fails.
void launch_add_layer_norm(const add_layer_norm_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
