/// Classification post-processing on the device: softmax over each row of logits,
/// then its k largest probabilities with their class indices, largest first (ties go
/// to the lower index), as KServe's classification extension reports them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace caf_serving::kernels {

struct softmax_top_k_args {
  const float* logits = nullptr;   ///< [rows, cols]
  float* probabilities = nullptr;  ///< [rows, k]
  std::int32_t* indices = nullptr; ///< [rows, k]
  std::size_t rows = 0;
  std::size_t cols = 0;
  int k = 1; ///< 1 to min(cols, softmax_top_k_max_k)
  int threads = 0; ///< threads per block (one block per row); 0 picks the default
};

constexpr int softmax_top_k_max_k = 64;

/// Enqueues the kernel on `stream`. Throws `std::invalid_argument` for a k out of
/// range, `cuda_error` if the launch fails.
void launch_softmax_top_k(const softmax_top_k_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
