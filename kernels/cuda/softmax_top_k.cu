#include "cuda/softmax_top_k.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

// A candidate (logit, index); `better` orders by logit descending, then index
// ascending, which is the order the results are reported in.
struct candidate {
  float value;
  int index;
};

__device__ __forceinline__ bool better(candidate a, candidate b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

__device__ __forceinline__ candidate warp_best(candidate c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    candidate other{__shfl_xor_sync(0xffffffffu, c.value, o),
                    __shfl_xor_sync(0xffffffffu, c.index, o)};
    if (better(other, c))
      c = other;
  }
  return c;
}

// One block per row. The softmax normaliser comes from one pass; then k selection
// rounds each find the best candidate ranked after the previous pick. k rounds of
// reads hit L1/L2 (a row of logits is a few KB), so device memory is read once.
__global__ void softmax_top_k_kernel(softmax_top_k_args a) {
  __shared__ float scratch[32];
  __shared__ candidate picks[32];
  const float* row = a.logits + static_cast<std::size_t>(blockIdx.x) * a.cols;
  int cols = static_cast<int>(a.cols);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  float local_max = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    local_max = fmaxf(local_max, row[c]);
  local_max = detail::warp_max(local_max);
  if (lane == 0)
    scratch[warp] = local_max;
  __syncthreads();
  float max = detail::warp_max(lane < warps ? scratch[lane] : -INFINITY);
  __syncthreads();
  float local_sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    local_sum += __expf(row[c] - max);
  float inv_sum = 1.0f / detail::block_sum(local_sum, scratch);

  candidate previous{INFINITY, -1};
  for (int r = 0; r < a.k; ++r) {
    candidate best{-INFINITY, 0x7fffffff};
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      candidate x{row[c], c};
      if (better(previous, x) && better(x, best))
        best = x;
    }
    best = warp_best(best);
    if (lane == 0)
      picks[warp] = best;
    __syncthreads();
    best = warp_best(lane < warps ? picks[lane] : candidate{-INFINITY, 0x7fffffff});
    __syncthreads();
    if (threadIdx.x == 0) {
      std::size_t out = static_cast<std::size_t>(blockIdx.x) * a.k + r;
      a.probabilities[out] = __expf(best.value - max) * inv_sum;
      a.indices[out] = best.index;
    }
    previous = best;
  }
}

} // namespace

void launch_softmax_top_k(const softmax_top_k_args& a, cudaStream_t stream) {
  if (a.k < 1 || a.k > softmax_top_k_max_k || static_cast<std::size_t>(a.k) > a.cols)
    throw std::invalid_argument("softmax_top_k: k = " + std::to_string(a.k)
                                + " must be between 1 and min(cols = "
                                + std::to_string(a.cols) + ", "
                                + std::to_string(softmax_top_k_max_k) + ")");
  if (a.rows == 0)
    return;
  int threads = a.threads > 0 ? a.threads : 256;
  softmax_top_k_kernel<<<static_cast<unsigned>(a.rows), threads, 0, stream>>>(a);
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
