#include "cuda/epilogue.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <type_traits>

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
  float alpha; // the activation's parameters (activation_params)
  float beta;
  bool residual_first; // act(x + bias + residual) instead of act(x + bias) + residual
  bool vectorized;     // 8 elements per step; see launch_epilogue for when
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

// 1 / (1 + e^-x) with the accurate expf (2 ulp; __expf loses ~1 ulp per unit of
// |x|) and the 1-ulp reciprocal: e^-x = inf for x < -88 gives 0, as it should.
__device__ __forceinline__ float sigmoid(float x) {
  return rcp_approx(1.0f + expf(-x));
}

__device__ __forceinline__ float clamp01(float x) {
  return fminf(fmaxf(x, 0.0f), 1.0f);
}

// The activation; `alpha` and `beta` are activation_params, read by those that have
// parameters and compiled away from the others.
template <activation Act>
__device__ __forceinline__ float activate(float x, float alpha, float beta) {
  if constexpr (Act == activation::relu) {
    return fmaxf(x, 0.0f);
  } else if constexpr (Act == activation::gelu_erf) {
    return 0.5f * x * (1.0f + erf_fast(x * 0.70710678118654752f));
  } else if constexpr (Act == activation::gelu_tanh) {
    float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else if constexpr (Act == activation::tanh) {
    return tanhf(x);
  } else if constexpr (Act == activation::sigmoid) {
    return sigmoid(x);
  } else if constexpr (Act == activation::clip) {
    return fminf(fmaxf(x, alpha), beta);
  } else if constexpr (Act == activation::hard_swish) {
    return x * clamp01(fmaf(alpha, x, beta));
  } else if constexpr (Act == activation::hard_sigmoid) {
    return clamp01(fmaf(alpha, x, beta));
  } else if constexpr (Act == activation::swish) {
    return x * sigmoid(alpha * x);
  } else if constexpr (Act == activation::leaky_relu) {
    return x >= 0.0f ? x : alpha * x;
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
  if (p.residual && p.residual_first) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      x[j] = activate<Act>(x[j] + r[j], p.alpha, p.beta);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      x[j] = activate<Act>(x[j], p.alpha, p.beta) + (p.residual ? r[j] : 0.0f);
  }
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
      if (res && p.residual_first)
        x += to_f32(res[i]);
      x = activate<Act>(x, p.alpha, p.beta);
      if (res && !p.residual_first)
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

template <activation Act>
using act_tag = std::integral_constant<activation, Act>;

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_epilogue(const epilogue_args& a, cudaStream_t stream) {
  if (a.count == 0)
    return;
  epilogue_params p{a.input,          a.bias,           a.residual,
                    a.output,         a.count,          a.layout.channels,
                    a.layout.inner,   a.params.alpha,   a.params.beta,
                    a.residual_first, false};
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
    auto launch = [&](auto act) {
      epilogue_kernel<T, decltype(act)::value><<<blocks, threads, 0, stream>>>(p);
    };
    switch (a.act) {
      case activation::none: launch(act_tag<activation::none>{}); break;
      case activation::relu: launch(act_tag<activation::relu>{}); break;
      case activation::gelu_erf: launch(act_tag<activation::gelu_erf>{}); break;
      case activation::gelu_tanh: launch(act_tag<activation::gelu_tanh>{}); break;
      case activation::tanh: launch(act_tag<activation::tanh>{}); break;
      case activation::sigmoid: launch(act_tag<activation::sigmoid>{}); break;
      case activation::clip: launch(act_tag<activation::clip>{}); break;
      case activation::hard_swish: launch(act_tag<activation::hard_swish>{}); break;
      case activation::hard_sigmoid: launch(act_tag<activation::hard_sigmoid>{}); break;
      case activation::swish: launch(act_tag<activation::swish>{}); break;
      case activation::leaky_relu: launch(act_tag<activation::leaky_relu>{}); break;
    }
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
