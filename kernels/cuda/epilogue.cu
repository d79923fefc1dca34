#include "cuda/epilogue.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

namespace caf_serving::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

struct epilogue_params {
  const void* input;
  const void* bias;
  const void* residual;
  void* output;
  std::size_t count;
  std::size_t channels;
  std::size_t inner;
  bool vectorized; // 8 elements per step; see launch_epilogue for when
};

template <activation Act>
__device__ __forceinline__ float activate(float x) {
  if constexpr (Act == activation::relu) {
    return fmaxf(x, 0.0f);
  } else if constexpr (Act == activation::gelu_erf) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else if constexpr (Act == activation::gelu_tanh) {
    float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else {
    return x;
  }
}

// One body for every fused variant: the activation is a template parameter, bias and
// residual are uniform run-time branches (they cost nothing next to the memory traffic).
template <class T, activation Act>
__global__ void epilogue_kernel(epilogue_params p) {
  const T* in = static_cast<const T*>(p.input);
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* out = static_cast<T*>(p.output);
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.vectorized) {
    for (std::size_t v = first; v < p.count / 8; v += stride) {
      std::size_t i = v * 8;
      float x[8];
      detail::load8(in + i, x);
      if (bias) {
        std::size_t c = (i / p.inner) % p.channels;
        if (p.inner == 1) { // 8 consecutive channels
          float b[8];
          detail::load8(bias + c, b);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            x[j] += b[j];
        } else { // inner is a multiple of 8: one channel for all 8
          float b = to_f32(bias[c]);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            x[j] += b;
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
        x[j] = activate<Act>(x[j]);
      if (res) {
        float r[8];
        detail::load8(res + i, r);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          x[j] += r[j];
      }
      detail::store8(out + i, x);
    }
  } else {
    for (std::size_t i = first; i < p.count; i += stride) {
      float x = to_f32(in[i]);
      if (bias)
        x += to_f32(bias[(i / p.inner) % p.channels]);
      x = activate<Act>(x);
      if (res)
        x += to_f32(res[i]);
      out[i] = from_f32<T>(x);
    }
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_epilogue(const epilogue_args& a, cudaStream_t stream) {
  if (a.count == 0)
    return;
  epilogue_params p{a.input, a.bias, a.residual, a.output, a.count,
                    a.layout.channels, a.layout.inner, false};
  bool bias_vector_ok = a.bias == nullptr
                        || (a.layout.inner == 1 && a.layout.channels % 8 == 0
                            && aligned16(a.bias))
                        || a.layout.inner % 8 == 0;
  p.vectorized = a.count % 8 == 0 && bias_vector_ok && aligned16(a.input)
                 && aligned16(a.output) && (a.residual == nullptr || aligned16(a.residual));
  int threads = a.threads > 0 ? a.threads : 256;
  int blocks = detail::grid_stride_blocks(p.vectorized ? a.count / 8 : a.count, threads);
  detail::dispatch_dtype(a.type, [&](auto tag) {
    using T = decltype(tag);
    switch (a.act) {
      case activation::none:
        epilogue_kernel<T, activation::none><<<blocks, threads, 0, stream>>>(p);
        break;
      case activation::relu:
        epilogue_kernel<T, activation::relu><<<blocks, threads, 0, stream>>>(p);
        break;
      case activation::gelu_erf:
        epilogue_kernel<T, activation::gelu_erf><<<blocks, threads, 0, stream>>>(p);
        break;
      case activation::gelu_tanh:
        epilogue_kernel<T, activation::gelu_tanh><<<blocks, threads, 0, stream>>>(p);
        break;
    }
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
