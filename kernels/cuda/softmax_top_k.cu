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

// Reductions over the threads of one row's group: a warp (rows up to
// warp_row_limit, several rows per block, no barriers) or the whole block.
constexpr std::size_t warp_row_limit = 4096;

__device__ __forceinline__ float group_max(float v, int group, float* scratch) {
  v = detail::warp_max(v);
  if (group > 32) {
    int lane = threadIdx.x % 32;
    if (lane == 0)
      scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = detail::warp_max(lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : -INFINITY);
    __syncthreads();
  }
  return v;
}

__device__ __forceinline__ float group_sum(float v, int group, float* scratch) {
  if (group > 32)
    return detail::block_sum(v, scratch);
  return detail::warp_sum(v);
}

__device__ __forceinline__ candidate group_best(candidate c, int group, candidate* scratch) {
  c = warp_best(c);
  if (group > 32) {
    int lane = threadIdx.x % 32;
    if (lane == 0)
      scratch[threadIdx.x / 32] = c;
    __syncthreads();
    c = warp_best(lane < static_cast<int>(blockDim.x / 32) ? scratch[lane]
                                                           : candidate{-INFINITY, 0x7fffffff});
    __syncthreads();
  }
  return c;
}

// A group of threads per row. The softmax normaliser comes from one pass; then k
// selection rounds each find the best candidate ranked after the previous pick. The
// rounds re-read the row from L1/L2 (a row of logits is a few KB), so device memory
// is read once.
__global__ void softmax_top_k_kernel(softmax_top_k_args a, int group) {
  __shared__ float scratch[32];
  __shared__ candidate picks[32];
  int rows_per_block = blockDim.x / group;
  std::size_t r = static_cast<std::size_t>(blockIdx.x) * rows_per_block + threadIdx.x / group;
  bool active = r < a.rows; // uniform per group: warp mode has whole warps per row
  int t = threadIdx.x % group;
  const float* row = a.logits + (active ? r : 0) * a.cols;
  int cols = active ? static_cast<int>(a.cols) : 0;

  float local_max = -INFINITY;
  for (int c = t; c < cols; c += group)
    local_max = fmaxf(local_max, row[c]);
  float max = group_max(local_max, group, scratch);
  float local_sum = 0.0f;
  for (int c = t; c < cols; c += group)
    local_sum += __expf(row[c] - max);
  float inv_sum = 1.0f / group_sum(local_sum, group, scratch);

  candidate previous{INFINITY, -1};
  for (int k = 0; k < a.k; ++k) {
    candidate best{-INFINITY, 0x7fffffff};
    for (int c = t; c < cols; c += group) {
      candidate x{row[c], c};
      if (better(previous, x) && better(x, best))
        best = x;
    }
    best = group_best(best, group, picks);
    if (active && t == 0) {
      std::size_t out = r * a.k + k;
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
  int threads = a.threads > 0 ? a.threads : (a.cols <= warp_row_limit ? 128 : 512);
  int group = a.cols <= warp_row_limit || threads == 32 ? 32 : threads;
  std::size_t rows_per_block = static_cast<std::size_t>(threads / group);
  auto blocks = static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block);
  softmax_top_k_kernel<<<blocks, threads, 0, stream>>>(a, group);
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
