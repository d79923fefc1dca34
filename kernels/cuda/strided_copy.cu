#include "cuda/strided_copy.hpp"

#include "cuda/check.hpp"
#include "cuda/data_movement.cuh"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

/// One box of a launch: blockIdx.y picks it.
struct box_item {
  const void* src;
  void* dst;
  strided_box box;
  std::int64_t count;
  int element_size; ///< the widened word: 1, 2, 4, 8 or 16 bytes
};

struct box_batch {
  box_item items[max_boxes_per_launch];
};

/// Grid-stride loop over one box. 32-bit division where the box allows it.
template <class T>
__device__ void copy_box(const box_item& it) {
  const T* __restrict__ src = static_cast<const T*>(it.src);
  T* __restrict__ dst = static_cast<T*>(it.dst);
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto n = static_cast<std::size_t>(it.count);
  if (n <= 0x7fffffffu) {
    for (auto i = static_cast<std::uint32_t>(first); i < n; i += static_cast<std::uint32_t>(stride)) {
      offset_pair o = box_offsets<std::uint32_t>(it.box, i);
      dst[o.dst] = src[o.src];
    }
  } else {
    for (std::size_t i = first; i < n; i += stride) {
      offset_pair o = box_offsets<std::uint64_t>(it.box, i);
      dst[o.dst] = src[o.src];
    }
  }
}

// __grid_constant__: the items are read in place from the parameter space, not
// copied per thread, although blockIdx.y indexes them.
__global__ void copy_boxes_kernel(const __grid_constant__ box_batch batch) {
  const box_item& it = batch.items[blockIdx.y];
  switch (it.element_size) {
    case 1:
      return copy_box<std::uint8_t>(it);
    case 2:
      return copy_box<std::uint16_t>(it);
    case 4:
      return copy_box<std::uint32_t>(it);
    case 8:
      return copy_box<uint2>(it);
    case 16:
      return copy_box<uint4>(it);
  }
}

/// Fills with 16-byte words where the buffer allows, then the tail element by element.
template <class T>
__global__ void fill_kernel(T* dst, std::int64_t count, uint4 pattern, T value,
                            std::int64_t vectors) {
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto* d4 = reinterpret_cast<uint4*>(dst);
  for (std::size_t i = first; i < static_cast<std::size_t>(vectors); i += stride)
    d4[i] = pattern;
  std::size_t head = static_cast<std::size_t>(vectors) * (16 / sizeof(T));
  for (std::size_t i = head + first; i < static_cast<std::size_t>(count); i += stride)
    dst[i] = value;
}

int default_threads(int threads) {
  return threads > 0 ? threads : 256;
}

} // namespace

namespace detail {

void enqueue_planned_copies(const planned_copy* copies, int count, int threads,
                            cudaStream_t stream) {
  threads = default_threads(threads);
  box_batch batch{};
  int used = 0;
  std::int64_t largest = 0;
  auto flush = [&] {
    if (used == 0)
      return;
    int per_box = grid_stride_blocks(static_cast<std::size_t>(largest), threads);
    // Enough x blocks to fill the device across all boxes, none idle on small ones.
    per_box = std::max(1, std::min(per_box, per_box * 4 / used + 1));
    copy_boxes_kernel<<<dim3(per_box, used), threads, 0, stream>>>(batch);
    CAF_CUDA_CHECK(cudaGetLastError());
    used = 0;
    largest = 0;
  };
  for (int i = 0; i < count; ++i) {
    std::int64_t n = box_count(copies[i].plan.box);
    if (n == 0)
      continue;
    box_item& it = batch.items[used++];
    it.src = copies[i].src;
    it.dst = copies[i].dst;
    it.box = copies[i].plan.box;
    it.count = n;
    it.element_size = static_cast<int>(copies[i].plan.element_size);
    largest = std::max(largest, n);
    if (used == max_boxes_per_launch)
      flush();
  }
  flush();
}

} // namespace detail

namespace {

detail::planned_copy plan_copy(const strided_copy_args& a) {
  check_box(a.box, a.element_size, a.src_elements, a.dst_elements, "strided_copy");
  if (box_count(a.box) > 0 && (a.src == nullptr || a.dst == nullptr))
    throw std::invalid_argument("strided_copy: null source or destination pointer");
  detail::planned_copy p;
  p.src = a.src;
  p.dst = a.dst;
  p.plan = widen_box(collapse_box(a.box), a.element_size,
                     reinterpret_cast<std::uintptr_t>(a.src),
                     reinterpret_cast<std::uintptr_t>(a.dst));
  return p;
}

} // namespace

void launch_strided_copy(const strided_copy_args& a, cudaStream_t stream) {
  detail::planned_copy p = plan_copy(a);
  detail::enqueue_planned_copies(&p, 1, a.threads, stream);
}

void launch_strided_copies(const std::vector<strided_copy_args>& copies, cudaStream_t stream) {
  std::vector<detail::planned_copy> planned;
  planned.reserve(copies.size());
  for (const auto& c : copies) // every box checked before anything is enqueued
    planned.push_back(plan_copy(c));
  int threads = copies.empty() ? 0 : copies.front().threads;
  detail::enqueue_planned_copies(planned.data(), static_cast<int>(planned.size()), threads,
                                 stream);
}

void launch_fill(const fill_args& a, cudaStream_t stream) {
  if (a.element_size != 1 && a.element_size != 2 && a.element_size != 4 && a.element_size != 8)
    throw std::invalid_argument("fill: element size " + std::to_string(a.element_size)
                                + " bytes is not supported; use 1, 2, 4 or 8");
  if (a.count < 0)
    throw std::invalid_argument("fill: negative count " + std::to_string(a.count));
  if (a.count == 0)
    return;
  if (a.dst == nullptr || reinterpret_cast<std::uintptr_t>(a.dst) % a.element_size != 0)
    throw std::invalid_argument("fill: destination is null or not aligned to its "
                                + std::to_string(a.element_size) + "-byte elements");
  unsigned char pattern_bytes[16];
  for (std::size_t i = 0; i < 16; ++i) // little-endian: byte i of value is byte i of an element
    pattern_bytes[i] = static_cast<unsigned char>(a.value >> (8 * (i % a.element_size)));
  uint4 pattern;
  std::memcpy(&pattern, pattern_bytes, 16);
  bool aligned = reinterpret_cast<std::uintptr_t>(a.dst) % 16 == 0;
  std::int64_t vectors
    = aligned ? a.count * static_cast<std::int64_t>(a.element_size) / 16 : 0;
  int threads = default_threads(a.threads);
  int blocks = detail::grid_stride_blocks(
    static_cast<std::size_t>(aligned ? std::max<std::int64_t>(vectors, 1) : a.count), threads);
  detail::dispatch_width(a.element_size, [&](auto zero) {
    using T = decltype(zero);
    T value;
    std::memcpy(&value, pattern_bytes, sizeof(T));
    fill_kernel<T><<<blocks, threads, 0, stream>>>(static_cast<T*>(a.dst), a.count, pattern,
                                                   value, vectors);
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
