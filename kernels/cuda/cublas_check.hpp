/// Lets CAF_CUDA_CHECK take cuBLAS calls too (one check macro for both libraries).
#pragma once

#include <cublas_v2.h>

#include "cuda/check.hpp"

namespace caf_serving::kernels {

inline void cuda_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS)
    return;
  throw cuda_error(std::string(call) + " failed at " + file + ":" + std::to_string(line)
                   + ": " + cublasGetStatusName(status) + ": " + cublasGetStatusString(status));
}

} // namespace caf_serving::kernels
