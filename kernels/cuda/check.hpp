/// One check for every CUDA runtime call: `CAF_CUDA_CHECK(cudaMalloc(...))` throws
/// `cuda_error` naming the call, file, line and CUDA's own error text.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace caf_serving::kernels {

/// A failed CUDA (or cuBLAS) call.
struct cuda_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess)
    return;
  throw cuda_error(std::string(call) + " failed at " + file + ":" + std::to_string(line)
                   + ": " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

} // namespace caf_serving::kernels

#define CAF_CUDA_CHECK(call)                                                           \
  ::caf_serving::kernels::cuda_check((call), #call, __FILE__, __LINE__)
