/// GEMM / convolution epilogue for the patterns cuBLASLt and cuDNN cannot fuse:
/// `output = act(input + bias) + residual` (FusedMatMul's order), or with
/// `residual_first` `act(input + bias + residual)` (FusedConv's), in one pass,
/// computed in fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cpu/types.hpp"

namespace caf_serving::kernels {

struct epilogue_args {
  dtype type = dtype::f32;       ///< of input, bias, residual and output alike
  const void* input = nullptr;   ///< the GEMM or convolution result, `count` elements
  const void* bias = nullptr;    ///< `layout.channels` elements, or null for none
  const void* residual = nullptr;///< `count` elements, or null for none
  void* output = nullptr;        ///< `count` elements; may alias `input`
  std::size_t count = 0;
  bias_layout layout;
  activation act = activation::none;
  activation_params params;      ///< alpha, beta of the activations that have them
  bool residual_first = false;   ///< add the residual before the activation, not after
  int threads = 0; ///< threads per block; 0 picks the default
};

/// Enqueues the epilogue on `stream`. Throws `cuda_error` if the launch fails.
void launch_epilogue(const epilogue_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
