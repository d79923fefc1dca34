#pragma once
/// CAF_CUDA_CHECK (kernels/cuda/check.hpp) for cuBLASLt and cuDNN calls too: one
/// macro records the call, file and line for every library the executor uses.

#include "cuda/cublas_check.hpp"

#include <cudnn.h>

namespace caf_serving::kernels {

inline void cuda_check(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS)
    return;
  throw cuda_error(std::string(call) + " failed at " + file + ":" + std::to_string(line)
                   + ": " + cudnnGetErrorString(status));
}

} // namespace caf_serving::kernels
