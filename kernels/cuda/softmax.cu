#include "cuda/softmax.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>

namespace caf_serving::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

struct softmax_params {
  softmax_args a;
  int group;       // threads per row: 32 (a warp) or the whole block
  bool vectorized; // 8 elements per step
  bool cached;     // vectorized, and the row fits in registers: cached_vectors per thread
};

constexpr int cached_vectors = 4;

// Max or sum over the threads of one row's group (a warp, or the whole block when
// group > 32). Every thread of the group gets the result.
template <bool Max>
__device__ __forceinline__ float group_reduce(float v, int group, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = Max ? fmaxf(v, other) : v + other;
  }
  if (group > 32) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
      scratch[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : (Max ? -INFINITY : 0.0f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = Max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
  }
  return v;
}

// Running max and sum of exp(x - max), merged pairwise (the online softmax).
struct max_sum {
  float max;
  float sum;
};

__device__ __forceinline__ max_sum merge(max_sum a, max_sum b) {
  if (a.max < b.max) {
    max_sum t = a;
    a = b;
    b = t;
  }
  if (b.max == -INFINITY) // also covers both being empty
    return a;
  return {a.max, a.sum + b.sum * __expf(b.max - a.max)};
}

template <mask_kind Mask>
__device__ __forceinline__ float masked(float x, const void* mask, std::size_t i) {
  if constexpr (Mask == mask_kind::additive)
    return x + static_cast<const float*>(mask)[i];
  else if constexpr (Mask == mask_kind::boolean)
    return static_cast<const std::uint8_t*>(mask)[i] ? x : -INFINITY;
  else
    return x;
}

// One body for all masks: a row is handled by a warp (short rows, several rows per
// block) or by the whole block (long rows). Pass 1 reads the row once for the
// online max and sum; pass 2 reads it again (from L2/L1) and writes the result.
template <class T, mask_kind Mask>
__global__ void softmax_kernel(softmax_params p) {
  __shared__ max_sum scratch[32];
  int groups = blockDim.x / p.group;
  std::size_t r = static_cast<std::size_t>(blockIdx.x) * groups + threadIdx.x / p.group;
  int t = threadIdx.x % p.group;
  bool active = r < p.a.rows;
  std::size_t cols = p.a.cols;
  const T* in = static_cast<const T*>(p.a.input) + (active ? r : 0) * cols;
  T* out = static_cast<T*>(p.a.output) + (active ? r : 0) * cols;
  std::size_t mask_offset = (active ? r % p.a.mask_rows : 0) * cols;
  int step = p.vectorized ? 8 : 1;

  if (p.cached) { // one read of the row, kept in registers between the reductions
    __shared__ float reduce_scratch[32];
    float x[cached_vectors][8];
    float m = -INFINITY;
#pragma unroll
    for (int v = 0; v < cached_vectors; ++v) {
      std::size_t c = (static_cast<std::size_t>(t) + v * p.group) * 8;
      bool here = active && c < cols;
      if (here)
        detail::load8(in + c, x[v]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[v][j] = here ? masked<Mask>(x[v][j], p.a.mask_data, mask_offset + c + j) : -INFINITY;
        m = fmaxf(m, x[v][j]);
      }
    }
    m = group_reduce<true>(m, p.group, reduce_scratch);
    float base = m == -INFINITY ? 0.0f : m; // a fully masked row gives zeros
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < cached_vectors; ++v)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[v][j] = __expf(x[v][j] - base);
        sum += x[v][j];
      }
    sum = group_reduce<false>(sum, p.group, reduce_scratch);
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int v = 0; v < cached_vectors; ++v) {
      std::size_t c = (static_cast<std::size_t>(t) + v * p.group) * 8;
      if (active && c < cols) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          x[v][j] *= inv;
        detail::store8(out + c, x[v]);
      }
    }
    return;
  }

  max_sum acc{-INFINITY, 0.0f};
  if (active) {
    for (std::size_t c = static_cast<std::size_t>(t) * step; c < cols; c += p.group * step) {
      float x[8];
      if (p.vectorized)
        detail::load8(in + c, x);
      else
        x[0] = to_f32(in[c]);
      // Max of the chunk first, so the chunk costs one exp per element.
      float chunk_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (j >= step)
          break;
        x[j] = masked<Mask>(x[j], p.a.mask_data, mask_offset + c + j);
        chunk_max = fmaxf(chunk_max, x[j]);
      }
      float chunk_sum = 0.0f;
      if (chunk_max != -INFINITY) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < step)
            chunk_sum += __expf(x[j] - chunk_max);
      }
      acc = merge(acc, {chunk_max, chunk_sum});
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    acc = merge(acc, {__shfl_xor_sync(0xffffffffu, acc.max, o),
                      __shfl_xor_sync(0xffffffffu, acc.sum, o)});
  if (p.group > 32) { // the whole block is one row
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
      scratch[warp] = acc;
    __syncthreads();
    acc = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : max_sum{-INFINITY, 0.0f};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc = merge(acc, {__shfl_xor_sync(0xffffffffu, acc.max, o),
                        __shfl_xor_sync(0xffffffffu, acc.sum, o)});
  }
  if (!active)
    return;
  float inv = acc.sum > 0.0f ? 1.0f / acc.sum : 0.0f;
  float max = acc.max == -INFINITY ? 0.0f : acc.max;
  for (std::size_t c = static_cast<std::size_t>(t) * step; c < cols; c += p.group * step) {
    float x[8];
    if (p.vectorized)
      detail::load8(in + c, x);
    else
      x[0] = to_f32(in[c]);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < step)
        x[j] = __expf(masked<Mask>(x[j], p.a.mask_data, mask_offset + c + j) - max) * inv;
    if (p.vectorized)
      detail::store8(out + c, x);
    else
      out[c] = from_f32<T>(x[0]);
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_softmax(const softmax_args& a, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0)
    return;
  softmax_params p{a, 32, a.cols % 8 == 0 && aligned16(a.input) && aligned16(a.output), false};
  int threads = a.threads;
  if (threads <= 0) { // a warp per row up to 1024 elements, then a block per row
    std::size_t per_two_vectors = (a.cols + 15) / 16; // two vectors per thread
    threads = a.cols <= 1024 ? 128
                             : static_cast<int>(std::min<std::size_t>(
                                 1024, std::max<std::size_t>(128, (per_two_vectors + 31) / 32 * 32)));
  }
  p.group = a.cols <= 1024 || threads == 32 ? 32 : threads;
  p.cached = p.vectorized
             && a.cols <= static_cast<std::size_t>(p.group) * 8 * cached_vectors;
  std::size_t rows_per_block = static_cast<std::size_t>(threads / p.group);
  auto blocks = static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block);
  detail::dispatch_dtype(a.type, [&](auto tag) {
    using T = decltype(tag);
    switch (a.mask) {
      case mask_kind::none:
        softmax_kernel<T, mask_kind::none><<<blocks, threads, 0, stream>>>(p);
        break;
      case mask_kind::additive:
        softmax_kernel<T, mask_kind::additive><<<blocks, threads, 0, stream>>>(p);
        break;
      case mask_kind::boolean:
        softmax_kernel<T, mask_kind::boolean><<<blocks, threads, 0, stream>>>(p);
        break;
    }
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
