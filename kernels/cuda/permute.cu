#include "cuda/permute.hpp"

#include "cuda/check.hpp"
#include "cuda/data_movement.cuh"

#include <algorithm>
#include <stdexcept>

namespace caf_serving::kernels {
namespace {

constexpr int tile = 32;

struct tile_launch {
  const void* src;
  void* dst;
  tile_plan plan;
  std::int64_t batches;
  std::int64_t b_tiles;
};

// blockIdx.x: a tile along dim a; blockIdx.y (striding): along dim b; blockIdx.z
// (striding): the batch. Threads (x, y): x reads along a and writes along b; the
// y rows of the block step through the tile's 32 rows. The +1 column keeps the
// transposed read of the tile free of bank conflicts for 4-byte elements.
template <class T>
__global__ void transpose_tile_kernel(const __grid_constant__ tile_launch p) {
  __shared__ T cell[tile][tile + 1];
  const T* __restrict__ src = static_cast<const T*>(p.src);
  T* __restrict__ dst = static_cast<T*>(p.dst);
  const tile_plan& t = p.plan;
  std::int64_t a0 = static_cast<std::int64_t>(blockIdx.x) * tile;
  for (std::int64_t n = blockIdx.z; n < p.batches; n += gridDim.z) {
    offset_pair base = p.batches <= 0x7fffffff
                         ? box_offsets<std::uint32_t>(t.batch, static_cast<std::uint32_t>(n))
                         : box_offsets<std::uint64_t>(t.batch, static_cast<std::uint64_t>(n));
    for (std::int64_t bt = blockIdx.y; bt < p.b_tiles; bt += gridDim.y) {
      std::int64_t b0 = bt * tile;
      for (int j = threadIdx.y; j < tile; j += blockDim.y) {
        std::int64_t ia = a0 + threadIdx.x, ib = b0 + j;
        if (ia < t.a_size && ib < t.b_size)
          cell[j][threadIdx.x] = src[tile_offsets(t, base, ia, ib).src];
      }
      __syncthreads();
      for (int j = threadIdx.y; j < tile; j += blockDim.y) {
        std::int64_t ia = a0 + j, ib = b0 + threadIdx.x;
        if (ia < t.a_size && ib < t.b_size)
          dst[tile_offsets(t, base, ia, ib).dst] = cell[threadIdx.x][j];
      }
      __syncthreads();
    }
  }
}

} // namespace

void launch_permute(const permute_args& a, cudaStream_t stream) {
  permute_plan plan = plan_permute(a.shape, a.element_size,
                                   reinterpret_cast<std::uintptr_t>(a.input),
                                   reinterpret_cast<std::uintptr_t>(a.output));
  if (box_count(plan.plain.box) == 0)
    return;
  if (a.input == nullptr || a.output == nullptr)
    throw std::invalid_argument("permute: null input or output pointer");
  if (!plan.tiled) {
    detail::planned_copy copy{a.input, a.output, plan.plain};
    detail::enqueue_planned_copies(&copy, 1, a.threads, stream);
    return;
  }
  tile_launch p{a.input, a.output, plan.tile, box_count(plan.tile.batch),
                (plan.tile.b_size + tile - 1) / tile};
  int rows = std::clamp((a.threads > 0 ? a.threads : 256) / tile, 1, tile);
  auto a_tiles = (plan.tile.a_size + tile - 1) / tile;
  if (a_tiles > 0x7fffffff)
    throw std::invalid_argument("permute: the moved innermost dim is too long for one launch");
  dim3 grid(static_cast<unsigned>(a_tiles),
            static_cast<unsigned>(std::min<std::int64_t>(p.b_tiles, 65535)),
            static_cast<unsigned>(std::min<std::int64_t>(p.batches, 65535)));
  dim3 block(tile, rows);
  detail::dispatch_width(a.element_size, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (sizeof(T) <= 8)
      transpose_tile_kernel<T><<<grid, block, 0, stream>>>(p);
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
