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

// One MUFU.RCP, nothing else: `rcp.approx.ftz` is within 1 ulp, where `__frcp_rn`
// (correctly rounded) adds a Newton step and a slow path for special values.
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// erf by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7): two MUFU ops and
// six FMAs, against erff's two branchy polynomials; the epilogue is memory-bound
// only while its arithmetic stays this cheap. The approximate reciprocal's 1 ulp
// (~6e-8 relative on t, in [0, 1]) moves y by less than 1e-7, well inside the f32
// tolerance of the check table (1e-5 absolute + 1e-5 relative).
__device__ __forceinline__ float erf_fast(float x) {
  float ax = fabsf(x);
  float t = rcp_approx(1.0f + 0.3275911f * ax);
  float y = t * (0.254829592f
                 + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  return copysignf(1.0f - y * __expf(-ax * ax), x);
}

template <activation Act>
__device__ __forceinline__ float activate(float x) {
  if constexpr (Act == activation::relu) {
    return fmaxf(x, 0.0f);
  } else if constexpr (Act == activation::gelu_erf) {
    return 0.5f * x * (1.0f + erf_fast(x * 0.70710678118654752f));
  } else if constexpr (Act == activation::gelu_tanh) {
    float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else {
    return x;
  }
}

// Bias, activation and residual of the 8 elements from `i` on (a vector), in place.
template <class T, activation Act, class Index>
__device__ __forceinline__ void epilogue_vector(const epilogue_params& p, const T* bias, Index i,
                                                float (&x)[8], const float (&r)[8]) {
  if (bias) {
    auto inner = static_cast<Index>(p.inner);
    auto channels = static_cast<Index>(p.channels);
    if (inner == 1) { // 8 consecutive channels
      float b[8];
      detail::load8(bias + i % channels, b);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        x[j] += b[j];
    } else { // inner is a multiple of 8: one channel for all 8
      float b = to_f32(bias[(i / inner) % channels]);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        x[j] += b;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    x[j] = activate<Act>(x[j]) + (p.residual ? r[j] : 0.0f);
}

// The loops of one variant; `Index` is 32-bit whenever the tensor allows, since the
// bias's channel needs a division and a remainder per vector, which cost ~4x more
// in 64 bits.
template <class T, activation Act, class Index>
__device__ __forceinline__ void epilogue_body(const epilogue_params& p) {
  const T* in = static_cast<const T*>(p.input);
  const T* bias = static_cast<const T*>(p.bias);
  const T* res = static_cast<const T*>(p.residual);
  T* out = static_cast<T*>(p.output);
  auto count = static_cast<Index>(p.count);
  auto inner = static_cast<Index>(p.inner);
  auto channels = static_cast<Index>(p.channels);
  Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.vectorized) {
    // Two vectors per thread and step, all loads issued before any arithmetic, so
    // each thread keeps 32-64 bytes in flight while the GELU of the last step runs.
    Index vectors = count / 8;
    Index v = first;
    for (; v + stride < vectors; v += 2 * stride) {
      float x[2][8], r[2][8];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        detail::load8(in + (v + u * stride) * 8, x[u]);
        if (res)
          detail::load8(res + (v + u * stride) * 8, r[u]);
      }
#pragma unroll
      for (int u = 0; u < 2; ++u)
        epilogue_vector<T, Act>(p, bias, (v + u * stride) * 8, x[u], r[u]);
#pragma unroll
      for (int u = 0; u < 2; ++u)
        detail::store8(out + (v + u * stride) * 8, x[u]);
    }
    if (v < vectors) { // the last vector of an odd count
      float x[8], r[8];
      detail::load8(in + v * 8, x);
      if (res)
        detail::load8(res + v * 8, r);
      epilogue_vector<T, Act>(p, bias, v * 8, x, r);
      detail::store8(out + v * 8, x);
    }
  } else {
    for (Index i = first; i < count; i += stride) {
      float x = to_f32(in[i]);
      if (bias)
        x += to_f32(bias[(i / inner) % channels]);
      x = activate<Act>(x);
      if (res)
        x += to_f32(res[i]);
      out[i] = from_f32<T>(x);
    }
  }
}

// One body for every fused variant: the activation is a template parameter, bias and
// residual are uniform run-time branches (they cost nothing next to the memory traffic).
template <class T, activation Act>
__global__ void epilogue_kernel(epilogue_params p) {
  if (p.count < (std::size_t{1} << 31))
    epilogue_body<T, Act, std::uint32_t>(p);
  else
    epilogue_body<T, Act, std::size_t>(p);
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
