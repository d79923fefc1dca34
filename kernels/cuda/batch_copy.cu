#include "cuda/batch_copy.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

// One body for both directions. blockIdx.y picks the request; the x blocks stride
// over its bytes, 16 at a time when both sides are 16-byte aligned.
template <bool ToBatch>
__global__ void batch_copy_kernel(batch_copy_args a) {
  int req = blockIdx.y;
  std::size_t bytes = a.request_bytes[req];
  auto* batch = static_cast<std::uint8_t*>(a.batch) + a.batch_offsets[req];
  auto* request = static_cast<std::uint8_t*>(a.request_buffers[req]);
  const std::uint8_t* src = ToBatch ? request : batch;
  std::uint8_t* dst = ToBatch ? batch : request;
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t head = 0;
  if (detail::aligned16(src) && detail::aligned16(dst)) {
    head = bytes / 16 * 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (std::size_t i = first; i < bytes / 16; i += stride)
      d[i] = s[i];
  }
  for (std::size_t i = head + first; i < bytes; i += stride)
    dst[i] = src[i];
}

template <bool ToBatch>
void launch(const batch_copy_args& a, cudaStream_t stream) {
  if (a.request_count <= 0 || a.max_request_bytes == 0)
    return;
  if (a.request_count > 65535)
    throw std::invalid_argument("batch copy: " + std::to_string(a.request_count)
                                + " requests exceed the 65535 one launch supports;"
                                  " split the batch");
  int threads = a.threads > 0 ? a.threads : 256;
  // Enough x blocks to fill the device across all requests, none idle on small ones.
  int per_request = detail::grid_stride_blocks((a.max_request_bytes + 15) / 16, threads);
  per_request = std::max(1, std::min(per_request, (per_request * 4) / a.request_count + 1));
  dim3 grid(per_request, a.request_count);
  batch_copy_kernel<ToBatch><<<grid, threads, 0, stream>>>(a);
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace

void launch_gather(const batch_copy_args& a, cudaStream_t stream) {
  launch<true>(a, stream);
}

void launch_scatter(const batch_copy_args& a, cudaStream_t stream) {
  launch<false>(a, stream);
}

} // namespace caf_serving::kernels
