#include "cuda/softmax.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace caf_serving::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

struct softmax_params {
  softmax_args a;
  int group;       // threads per row: 32 (a warp) or the whole block
  bool vectorized; // 8 elements per step
  bool cached;     // vectorized, and the row fits in registers: <= cached_vectors per thread
};

constexpr int cached_vectors = 4;

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

// An additive mask is float, or of the scores' type T (mask_type; the launcher
// checks it is one of the two): a uniform branch, no extra instantiations.
template <class T, mask_kind Mask>
__device__ __forceinline__ float masked(float x, const softmax_args& a, std::size_t i) {
  const void* mask = a.mask_data;
  if constexpr (Mask == mask_kind::additive)
    return x + (a.mask_type == dtype::f32 ? static_cast<const float*>(mask)[i]
                                          : to_f32(static_cast<const T*>(mask)[i]));
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
  std::size_t mask_offset = active ? mask_row_offset(p.a.mask_layout, p.a.mask_rows, cols, r) : 0;
  int step = p.vectorized ? 8 : 1;

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
        x[j] = masked<T, Mask>(x[j], p.a, mask_offset + c + j);
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
        x[j] = __expf(masked<T, Mask>(x[j], p.a, mask_offset + c + j) - max) * inv;
    if (p.vectorized)
      detail::store8(out + c, x);
    else
      out[c] = from_f32<T>(x[0]);
  }
}

// Rows that fit in registers (vectorized, at most `V` vectors of 8 per thread): the
// row is read once and written once. A warp's row (short rows) takes two warp
// reductions, max then sum, which are only shuffles. A block's row takes one block
// reduction of (max, sum) pairs: each thread exponentiates against its own max and
// rescales by exp(own max - row max) at the end, so the block synchronises once
// instead of twice between reading the row and writing it. `V` is a template
// parameter so that a row of 512 columns keeps 16 floats per lane, not 32, and
// exponentiates only what it loaded.
template <class T, mask_kind Mask, int V>
__global__ void softmax_cached_kernel(softmax_params p) {
  __shared__ max_sum scratch[32];
  int groups = blockDim.x / p.group;
  std::size_t r = static_cast<std::size_t>(blockIdx.x) * groups + threadIdx.x / p.group;
  int t = threadIdx.x % p.group;
  bool active = r < p.a.rows;
  std::size_t cols = p.a.cols;
  const T* in = static_cast<const T*>(p.a.input) + (active ? r : 0) * cols;
  T* out = static_cast<T*>(p.a.output) + (active ? r : 0) * cols;
  std::size_t mask_offset = active ? mask_row_offset(p.a.mask_layout, p.a.mask_rows, cols, r) : 0;
  float x[V][8];
  bool here[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    std::size_t c = (static_cast<std::size_t>(t) + v * p.group) * 8;
    here[v] = active && c < cols;
    if (here[v])
      detail::load8(in + c, x[v]);
  }
  float m = -INFINITY;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    std::size_t c = (static_cast<std::size_t>(t) + v * p.group) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[v][j] = here[v] ? masked<T, Mask>(x[v][j], p.a, mask_offset + c + j) : -INFINITY;
      m = fmaxf(m, x[v][j]);
    }
  }
  float scale;
  if (p.group == 32) {
    m = detail::warp_max(m);
    float base = m == -INFINITY ? 0.0f : m; // a fully masked row gives zeros
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (here[v])
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          x[v][j] = __expf(x[v][j] - base);
          sum += x[v][j];
        }
    sum = detail::warp_sum(sum);
    scale = sum > 0.0f ? 1.0f / sum : 0.0f;
  } else {
    float base = m == -INFINITY ? 0.0f : m; // this thread's own max
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (here[v])
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          x[v][j] = __expf(x[v][j] - base);
          sum += x[v][j];
        }
    max_sum acc{m, sum};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc = merge(acc, {__shfl_xor_sync(0xffffffffu, acc.max, o),
                        __shfl_xor_sync(0xffffffffu, acc.sum, o)});
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
      scratch[warp] = acc;
    __syncthreads();
    acc = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : max_sum{-INFINITY, 0.0f};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc = merge(acc, {__shfl_xor_sync(0xffffffffu, acc.max, o),
                        __shfl_xor_sync(0xffffffffu, acc.sum, o)});
    // exp(x - row max) / row sum = exp(x - own max) * exp(own max - row max) / row sum;
    // a thread with no finite value scales nothing (its x are exp(-inf) = 0).
    scale = acc.sum > 0.0f && m != -INFINITY ? __expf(m - acc.max) / acc.sum : 0.0f;
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    std::size_t c = (static_cast<std::size_t>(t) + v * p.group) * 8;
    if (here[v]) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        x[v][j] *= scale;
      detail::store8(out + c, x[v]);
    }
  }
}

// The largest block the cached kernel can be launched with (its registers per thread
// bound it: the 4-vector kernel does not fit 1024 threads); asked once per variant.
template <class T, mask_kind Mask, int V>
int cached_max_threads() {
  static const int max_threads = [] {
    cudaFuncAttributes f{};
    CAF_CUDA_CHECK(cudaFuncGetAttributes(&f, softmax_cached_kernel<T, Mask, V>));
    return f.maxThreadsPerBlock;
  }();
  return max_threads;
}

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_softmax(const softmax_args& a, cudaStream_t stream) {
  if (a.rows == 0 || a.cols == 0)
    return;
  if (a.mask == mask_kind::additive && a.mask_type != dtype::f32 && a.mask_type != a.type)
    throw std::invalid_argument("softmax: an additive mask is f32 or of the scores' type");
  softmax_params p{a, 32, a.cols % 8 == 0 && aligned16(a.input) && aligned16(a.output), false};
  int threads = a.threads;
  if (threads <= 0) { // a warp per row up to 1024 elements, then a block per row
    std::size_t per_two_vectors = (a.cols + 15) / 16; // two vectors per thread
    threads = a.cols <= 1024 ? 128
                             : static_cast<int>(std::min<std::size_t>(
                                 1024, std::max<std::size_t>(128, (per_two_vectors + 31) / 32 * 32)));
  }
  p.group = a.cols <= 1024 || threads == 32 ? 32 : threads;
  std::size_t vectors_per_thread = (a.cols + p.group * 8 - 1) / (p.group * 8);
  p.cached = p.vectorized && vectors_per_thread <= cached_vectors;
  std::size_t rows_per_block = static_cast<std::size_t>(threads / p.group);
  auto blocks = static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block);
  detail::dispatch_dtype(a.type, [&](auto tag) {
    using T = decltype(tag);
    if (p.cached) {
      // Launches the variant for `V` vectors per thread; false when the block is too
      // large for its registers (then the two-pass kernel below runs instead).
      auto launch = [&](auto mask_tag, auto vectors_tag) {
        constexpr mask_kind M = decltype(mask_tag)::value;
        constexpr int V = decltype(vectors_tag)::value;
        if (threads > cached_max_threads<T, M, V>())
          return false;
        softmax_cached_kernel<T, M, V><<<blocks, threads, 0, stream>>>(p);
        return true;
      };
      auto by_vectors = [&](auto mask_tag) {
        if (vectors_per_thread <= 1)
          return launch(mask_tag, std::integral_constant<int, 1>{});
        if (vectors_per_thread <= 2)
          return launch(mask_tag, std::integral_constant<int, 2>{});
        return launch(mask_tag, std::integral_constant<int, cached_vectors>{});
      };
      bool launched = false;
      switch (a.mask) {
        case mask_kind::none:
          launched = by_vectors(std::integral_constant<mask_kind, mask_kind::none>{});
          break;
        case mask_kind::additive:
          launched = by_vectors(std::integral_constant<mask_kind, mask_kind::additive>{});
          break;
        case mask_kind::boolean:
          launched = by_vectors(std::integral_constant<mask_kind, mask_kind::boolean>{});
          break;
      }
      if (launched)
        return;
    }
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
