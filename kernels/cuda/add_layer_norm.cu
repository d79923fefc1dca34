#include "cuda/add_layer_norm.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

// One block per row. The row (input + residual) is read from device memory once and
// kept in shared memory as fp32 for the two reductions (mean, then the variance
// around it, which is more accurate than E[x²] - mean²) and the final write.
template <class T>
__global__ void add_layer_norm_kernel(add_layer_norm_args a, bool vectorized) {
  extern __shared__ float row[];
  __shared__ float scratch[32];
  std::size_t offset = static_cast<std::size_t>(blockIdx.x) * a.cols;
  const T* in = static_cast<const T*>(a.input) + offset;
  const T* res = a.residual ? static_cast<const T*>(a.residual) + offset : nullptr;
  T* sum_out = a.sum_output ? static_cast<T*>(a.sum_output) + offset : nullptr;
  const T* gamma = static_cast<const T*>(a.gamma);
  const T* beta = static_cast<const T*>(a.beta);
  T* out = static_cast<T*>(a.output) + offset;
  int cols = static_cast<int>(a.cols);

  float local = 0.0f;
  if (vectorized) {
    for (int c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {
      float x[8];
      detail::load8(in + c, x);
      if (res) {
        float r[8];
        detail::load8(res + c, r);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          x[j] += r[j];
      }
      if (sum_out)
        detail::store8(sum_out + c, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        row[c + j] = x[j];
        local += x[j];
      }
    }
  } else {
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float x = to_f32(in[c]) + (res ? to_f32(res[c]) : 0.0f);
      if (sum_out)
        sum_out[c] = from_f32<T>(x);
      row[c] = x;
      local += x;
    }
  }
  float mean = detail::block_sum(local, scratch) / static_cast<float>(cols);
  // Each thread reads back only what it wrote, in the same pattern, so no barrier
  // is needed between the writes above and these reads.
  float sq = 0.0f;
  int step = vectorized ? 8 : 1;
  for (int c0 = threadIdx.x * step; c0 < cols; c0 += blockDim.x * step)
    for (int j = 0; j < step; ++j) {
      float d = row[c0 + j] - mean;
      sq += d * d;
    }
  float inv_std = rsqrtf(detail::block_sum(sq, scratch) / static_cast<float>(cols) + a.eps);
  if (vectorized) {
    for (int c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {
      float g[8], b[8], y[8];
      detail::load8(gamma + c, g);
      detail::load8(beta + c, b);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        y[j] = (row[c + j] - mean) * inv_std * g[j] + b[j];
      detail::store8(out + c, y);
    }
  } else {
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      out[c] = from_f32<T>((row[c] - mean) * inv_std * to_f32(gamma[c]) + to_f32(beta[c]));
  }
}

// Rows of at most 32 * 8 * V elements (vectorized): one warp per row, several rows per
// block, the row kept in registers (V vectors of 8 per lane). Both statistics are
// warp reductions (shuffles only, no barrier, no shared memory), and all of a lane's
// loads of input and residual are issued before the first reduction. For BERT-sized
// rows (768) a block-per-row kernel gives each block 96 threads and two barriers per
// reduction, which left the memory system idle between rows.
template <class T, int V>
__global__ void add_layer_norm_warp_kernel(add_layer_norm_args a) {
  int rows_per_block = blockDim.x / 32;
  std::size_t r = static_cast<std::size_t>(blockIdx.x) * rows_per_block + threadIdx.x / 32;
  if (r >= a.rows) // a whole warp leaves; nothing below synchronises the block
    return;
  int lane = threadIdx.x % 32;
  int cols = static_cast<int>(a.cols);
  std::size_t offset = r * a.cols;
  const T* in = static_cast<const T*>(a.input) + offset;
  const T* res = a.residual ? static_cast<const T*>(a.residual) + offset : nullptr;
  T* sum_out = a.sum_output ? static_cast<T*>(a.sum_output) + offset : nullptr;
  T* out = static_cast<T*>(a.output) + offset;
  float x[V][8], y[V][8];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int c = (lane + v * 32) * 8;
    if (c < cols) {
      detail::load8(in + c, x[v]);
      if (res)
        detail::load8(res + c, y[v]);
    }
  }
  float local = 0.0f;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int c = (lane + v * 32) * 8;
    if (c < cols) {
      if (res)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          x[v][j] += y[v][j];
      if (sum_out)
        detail::store8(sum_out + c, x[v]);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        local += x[v][j];
    }
  }
  float mean = detail::warp_sum(local) / static_cast<float>(cols);
  float sq = 0.0f;
#pragma unroll
  for (int v = 0; v < V; ++v)
    if ((lane + v * 32) * 8 < cols)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float d = x[v][j] - mean;
        sq += d * d;
      }
  float inv_std = rsqrtf(detail::warp_sum(sq) / static_cast<float>(cols) + a.eps);
  const T* gamma = static_cast<const T*>(a.gamma);
  const T* beta = static_cast<const T*>(a.beta);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int c = (lane + v * 32) * 8;
    if (c < cols) {
      float g[8], b[8];
      detail::load8(gamma + c, g);
      detail::load8(beta + c, b);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        y[v][j] = (x[v][j] - mean) * inv_std * g[j] + b[j];
      detail::store8(out + c, y[v]);
    }
  }
}

/// Longest row the warp-per-row kernel takes: 4 vectors of 8 per lane.
constexpr std::size_t warp_row_max_cols = 32 * 8 * 4;

bool aligned16(const void* p) {
  return p == nullptr || (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_add_layer_norm(const add_layer_norm_args& a, cudaStream_t stream) {
  if (a.cols > add_layer_norm_max_cols)
    throw std::invalid_argument("add_layer_norm: rows of " + std::to_string(a.cols)
                                + " elements exceed the supported "
                                + std::to_string(add_layer_norm_max_cols)
                                + "; split the normalised dimension or raise the limit");
  if (a.rows == 0 || a.cols == 0)
    return;
  bool vectorized = a.cols % 8 == 0 && aligned16(a.input) && aligned16(a.residual)
                    && aligned16(a.gamma) && aligned16(a.beta) && aligned16(a.output)
                    && aligned16(a.sum_output);
  if (vectorized && a.cols <= warp_row_max_cols) {
    // Warp per row; `threads` (rounded up to whole warps, at most 256: a lane of the
    // 4-vector kernel holds ~100 registers, too many for 1024-thread blocks) sets
    // the rows per block.
    int threads = a.threads > 0 ? std::min(256, (a.threads + 31) / 32 * 32) : 128;
    std::size_t rows_per_block = static_cast<std::size_t>(threads / 32);
    auto blocks = static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block);
    std::size_t vectors = (a.cols / 8 + 31) / 32; // per lane: 1 to 4
    detail::dispatch_dtype(a.type, [&](auto tag) {
      using T = decltype(tag);
      if (vectors <= 1)
        add_layer_norm_warp_kernel<T, 1><<<blocks, threads, 0, stream>>>(a);
      else if (vectors == 2)
        add_layer_norm_warp_kernel<T, 2><<<blocks, threads, 0, stream>>>(a);
      else if (vectors == 3)
        add_layer_norm_warp_kernel<T, 3><<<blocks, threads, 0, stream>>>(a);
      else
        add_layer_norm_warp_kernel<T, 4><<<blocks, threads, 0, stream>>>(a);
    });
    CAF_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // By default one thread per 8 elements (one vector), 64 to 256 threads: short rows
  // get small blocks, so more rows (and more loads) are in flight per SM.
  int threads = a.threads;
  if (threads <= 0)
    threads = static_cast<int>(std::min<std::size_t>(256, std::max<std::size_t>(64, (a.cols / 8 + 31) / 32 * 32)));
  std::size_t smem = a.cols * sizeof(float);
  detail::dispatch_dtype(a.type, [&](auto tag) {
    using T = decltype(tag);
    auto kernel = add_layer_norm_kernel<T>;
    if (smem > 48 * 1024)
      CAF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    kernel<<<static_cast<unsigned>(a.rows), threads, smem, stream>>>(a, vectorized);
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
