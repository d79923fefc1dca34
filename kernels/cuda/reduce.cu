#include "cuda/reduce.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

struct reduce_launch {
  const void* input;
  void* output;
  reduce_shape shape;
  reduce_op op;
};

__device__ __forceinline__ float warp_merge(reduce_op op, float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = reduce_merge(op, v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Accumulates this thread's share of one contiguous row: elements `first`,
/// `first + step`, ... of `count`, 8 at a time from 16-byte words when `Vec`.
template <class T, bool Vec>
__device__ __forceinline__ float accumulate_row(const T* row, std::int64_t count, int first,
                                                int step, reduce_op op) {
  float acc = reduce_identity<float>(op);
  if constexpr (Vec) {
    std::int64_t groups = count / 8; // count % 8 == 0 and rows 16-byte aligned
    for (std::int64_t g = first; g < groups; g += step) {
      float x[8];
      detail::load8(row + g * 8, x);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc = reduce_step(op, acc, x[k]);
    }
  } else {
    for (std::int64_t i = first; i < count; i += step)
      acc = reduce_step(op, acc, detail::to_f32(row[i]));
  }
  return acc;
}

// inner == 1, a warp per row.
template <class T, bool Vec>
__global__ void reduce_rows_warp_kernel(const __grid_constant__ reduce_launch p) {
  const T* in = static_cast<const T*>(p.input);
  T* out = static_cast<T*>(p.output);
  int lane = threadIdx.x % 32;
  std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / 32;
  for (std::int64_t row = warp; row < p.shape.outer; row += warps) {
    float acc = accumulate_row<T, Vec>(in + row * p.shape.reduced, p.shape.reduced, lane, 32, p.op);
    acc = warp_merge(p.op, acc);
    if (lane == 0)
      out[row] = detail::from_f32<T>(reduce_finish(p.op, acc, p.shape.reduced));
  }
}

// inner == 1, a block per row: long rows, too few of them to fill the device by warps.
template <class T, bool Vec>
__global__ void reduce_rows_block_kernel(const __grid_constant__ reduce_launch p) {
  __shared__ float partial[32];
  const T* in = static_cast<const T*>(p.input);
  T* out = static_cast<T*>(p.output);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (std::int64_t row = blockIdx.x; row < p.shape.outer; row += gridDim.x) {
    float acc = accumulate_row<T, Vec>(in + row * p.shape.reduced, p.shape.reduced,
                                       threadIdx.x, blockDim.x, p.op);
    acc = warp_merge(p.op, acc);
    if (lane == 0)
      partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < warps ? partial[lane] : reduce_identity<float>(p.op);
      acc = warp_merge(p.op, acc);
      if (lane == 0)
        out[row] = detail::from_f32<T>(reduce_finish(p.op, acc, p.shape.reduced));
    }
    __syncthreads();
  }
}

// inner > 1: threadIdx.x walks 32 adjacent columns (coalesced), threadIdx.y splits
// the reduced dim; blockIdx.x picks the columns, blockIdx.y (striding) the outer index.
template <class T>
__global__ void reduce_columns_kernel(const __grid_constant__ reduce_launch p) {
  __shared__ float partial[32][33];
  const T* in = static_cast<const T*>(p.input);
  T* out = static_cast<T*>(p.output);
  const reduce_shape& s = p.shape;
  std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  for (std::int64_t o = blockIdx.y; o < s.outer; o += gridDim.y) {
    float acc = reduce_identity<float>(p.op);
    if (col < s.inner) {
      const T* base = in + o * s.reduced * s.inner + col;
      for (std::int64_t r = threadIdx.y; r < s.reduced; r += blockDim.y)
        acc = reduce_step(p.op, acc, detail::to_f32(base[r * s.inner]));
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < s.inner) {
      for (int y = 1; y < static_cast<int>(blockDim.y); ++y)
        acc = reduce_merge(p.op, acc, partial[y][threadIdx.x]);
      out[o * s.inner + col] = detail::from_f32<T>(reduce_finish(p.op, acc, s.reduced));
    }
    __syncthreads();
  }
}

/// Rows at least this long, with fewer than `block_row_max_rows` of them, take a block each.
constexpr std::int64_t block_row_min_length = 4096;
constexpr std::int64_t block_row_max_rows = 8192;

template <class T>
void enqueue(const reduce_launch& p, int threads, cudaStream_t stream) {
  const reduce_shape& s = p.shape;
  if (s.inner == 1) {
    bool vec = s.reduced % 8 == 0 && aligned16(p.input);
    bool by_block = s.reduced >= block_row_min_length && s.outer < block_row_max_rows;
    threads = std::clamp((threads > 0 ? threads : 256) / 32 * 32, 32, 1024);
    if (by_block) {
      int blocks = static_cast<int>(std::min<std::int64_t>(s.outer, 65535));
      if (vec)
        reduce_rows_block_kernel<T, true><<<blocks, threads, 0, stream>>>(p);
      else
        reduce_rows_block_kernel<T, false><<<blocks, threads, 0, stream>>>(p);
    } else {
      int blocks = detail::grid_stride_blocks(static_cast<std::size_t>(s.outer) * 32, threads);
      if (vec)
        reduce_rows_warp_kernel<T, true><<<blocks, threads, 0, stream>>>(p);
      else
        reduce_rows_warp_kernel<T, false><<<blocks, threads, 0, stream>>>(p);
    }
  } else {
    int rows = std::clamp((threads > 0 ? threads : 256) / 32, 1, 32);
    // Few columns and a long reduced dim: give the reduced dim all of the rows.
    auto col_blocks = (s.inner + 31) / 32;
    if (col_blocks > 0x7fffffff)
      throw std::invalid_argument("reduce: the inner dims are too large for one launch");
    dim3 grid(static_cast<unsigned>(col_blocks),
              static_cast<unsigned>(std::min<std::int64_t>(s.outer, 65535)));
    reduce_columns_kernel<T><<<grid, dim3(32, rows), 0, stream>>>(p);
  }
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace

void launch_reduce(const reduce_args& a, cudaStream_t stream) {
  if (a.type != dtype::f32 && a.type != dtype::f16 && a.type != dtype::bf16)
    throw std::invalid_argument(std::string("reduce: type ") + dtype_name(a.type)
                                + " is not supported; f32, f16 and bf16 are");
  reduce_shape s = make_reduce_shape(a.rank, a.dims, a.axes, a.axis_count);
  if (s.outer == 0 || s.inner == 0)
    return; // no output elements
  if (a.input == nullptr || a.output == nullptr)
    throw std::invalid_argument("reduce: null input or output pointer");
  reduce_launch p{a.input, a.output, s, a.op};
  if (a.type == dtype::f32)
    enqueue<float>(p, a.threads, stream);
  else if (a.type == dtype::f16)
    enqueue<__half>(p, a.threads, stream);
  else
    enqueue<__nv_bfloat16>(p, a.threads, stream);
}

} // namespace caf_serving::kernels
