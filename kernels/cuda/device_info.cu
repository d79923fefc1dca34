#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>

namespace caf_serving::kernels::detail {

int grid_stride_blocks(std::size_t work, int threads) {
  static thread_local int sm_count = [] {
    int device = 0, count = 0;
    CAF_CUDA_CHECK(cudaGetDevice(&device));
    CAF_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  std::size_t needed = (work + threads - 1) / threads;
  std::size_t cap = static_cast<std::size_t>(sm_count) * 32;
  return static_cast<int>(std::max<std::size_t>(1, std::min(needed, cap)));
}

} // namespace caf_serving::kernels::detail
