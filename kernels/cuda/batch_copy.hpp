/// The serving edges: gather requests' tensors into one contiguous batch buffer,
/// and scatter a batch's output back to per-request buffers, in one launch each.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace caf_serving::kernels {

/// Request i's `request_bytes[i]` bytes live at `batch_offsets[i]` in the batch
/// buffer (offsets may leave gaps, e.g. to keep every request 16-byte aligned). The
/// three arrays live in device memory, so a captured CUDA graph can be replayed with
/// new requests by rewriting them.
struct batch_copy_args {
  void* const* request_buffers = nullptr;     ///< device array of `request_count` pointers
  const std::size_t* request_bytes = nullptr; ///< device array of `request_count` sizes
  const std::size_t* batch_offsets = nullptr; ///< device array of `request_count` offsets
  void* batch = nullptr;
  int request_count = 0;       ///< at most 65535
  std::size_t max_request_bytes = 0; ///< sizes the grid; the largest request
  int threads = 0;             ///< threads per block; 0 picks the default
};

/// Copies every request buffer into its place in the batch buffer.
void launch_gather(const batch_copy_args& args, cudaStream_t stream);

/// Copies each request's part of the batch buffer back to its request buffer.
void launch_scatter(const batch_copy_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
