#include "cuda/gather_axis.hpp"

#include "cuda/check.hpp"
#include "cuda/data_movement.cuh"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

struct gather_launch {
  const void* data;
  const void* indices;
  void* output;
  int* error_flag;
  gather_shape shape;
  std::int64_t rows;      ///< outer * index_count
  std::int64_t row_words; ///< words of W bytes per row
};

template <class I>
__device__ __forceinline__ std::int64_t source_row(const gather_launch& p, std::int64_t row) {
  const I* indices = static_cast<const I*>(p.indices);
  std::int64_t resolved = resolve_index(indices[row % p.shape.index_count], p.shape.axis_dim);
  if (resolved < 0) {
    *p.error_flag = 1; // a plain store: every writer writes the same 1
    return -1;
  }
  return gather_source_row(p.shape, row, resolved);
}

// One warp per output row: the index is read once, the row copied in words by the lanes.
template <class W, class I>
__global__ void gather_rows_kernel(const __grid_constant__ gather_launch p) {
  const W* __restrict__ data = static_cast<const W*>(p.data);
  W* __restrict__ out = static_cast<W*>(p.output);
  int lane = threadIdx.x % 32;
  std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * blockDim.x / 32;
  for (std::int64_t row = warp; row < p.rows; row += warps) {
    std::int64_t from = source_row<I>(p, row);
    W* dst = out + row * p.row_words;
    if (from < 0) {
      for (std::int64_t w = lane; w < p.row_words; w += 32)
        dst[w] = W{};
      continue;
    }
    const W* src = data + from * p.row_words;
    for (std::int64_t w = lane; w < p.row_words; w += 32)
      dst[w] = src[w];
  }
}

// One thread per output word, for short rows (inner == 1: Gather on the last axis).
template <class W, class I>
__global__ void gather_words_kernel(const __grid_constant__ gather_launch p) {
  const W* __restrict__ data = static_cast<const W*>(p.data);
  W* __restrict__ out = static_cast<W*>(p.output);
  std::int64_t total = p.rows * p.row_words;
  std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += stride) {
    std::int64_t row = i / p.row_words, w = i - row * p.row_words;
    std::int64_t from = source_row<I>(p, row);
    out[i] = from < 0 ? W{} : data[from * p.row_words + w];
  }
}

/// Rows of at least this many words take a warp each.
constexpr std::int64_t warp_row_words = 16;

} // namespace

void launch_gather_axis(const gather_axis_args& a, cudaStream_t stream) {
  const char* who = "gather_axis";
  gather_shape g = make_gather_shape(a.rank, a.dims, a.axis, a.index_count);
  if (a.element_size != 1 && a.element_size != 2 && a.element_size != 4 && a.element_size != 8)
    throw std::invalid_argument(std::string(who) + ": element size "
                                + std::to_string(a.element_size)
                                + " bytes is not supported; use 1, 2, 4 or 8");
  if (a.error_flag == nullptr)
    throw std::invalid_argument(std::string(who) + ": error_flag is required; pass a device "
                                "int zeroed before the launch and check it afterwards");
  std::int64_t rows = g.outer * g.index_count;
  auto row_bytes = static_cast<std::size_t>(g.inner) * a.element_size;
  if (rows == 0 || row_bytes == 0)
    return;
  if (a.data == nullptr || a.indices == nullptr || a.output == nullptr)
    throw std::invalid_argument(std::string(who) + ": null data, indices or output pointer");
  // The widest word that divides a row and both buffers' alignment (rows start at
  // multiples of the row size, so that is enough for every row).
  std::size_t word = 16;
  auto data_addr = reinterpret_cast<std::uintptr_t>(a.data);
  auto out_addr = reinterpret_cast<std::uintptr_t>(a.output);
  while (row_bytes % word != 0 || data_addr % word != 0 || out_addr % word != 0)
    word /= 2;
  gather_launch p{a.data, a.indices, a.output, a.error_flag, g, rows,
                  static_cast<std::int64_t>(row_bytes / word)};
  int threads = a.threads > 0 ? a.threads : 256;
  bool by_warp = p.row_words >= warp_row_words && threads >= 32;
  if (by_warp)
    threads = threads / 32 * 32;
  std::size_t work = by_warp ? static_cast<std::size_t>(rows) * 32
                             : static_cast<std::size_t>(rows * p.row_words);
  int blocks = detail::grid_stride_blocks(work, threads);
  detail::dispatch_width(word, [&](auto zero) {
    using W = decltype(zero);
    auto go = [&](auto index_zero) {
      using I = decltype(index_zero);
      if (by_warp)
        gather_rows_kernel<W, I><<<blocks, threads, 0, stream>>>(p);
      else
        gather_words_kernel<W, I><<<blocks, threads, 0, stream>>>(p);
    };
    if (a.indices_type == index_type::i64)
      go(std::int64_t{});
    else
      go(std::int32_t{});
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
