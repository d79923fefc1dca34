#include "cuda/convert.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace caf_serving::kernels {
namespace {

// 8 elements per step when both buffers are 16-byte aligned; the tail (count % 8)
// and unaligned buffers take the scalar loop.
template <class From, class To>
__global__ void convert_kernel(convert_args a, bool vectorized) {
  const From* in = static_cast<const From*>(a.input);
  To* out = static_cast<To*>(a.output);
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t vector_end = vectorized ? a.count / 8 * 8 : 0;
  // Two vectors per thread and step, both loads issued before either store: twice
  // the bytes in flight, which the widening direction (2-byte reads, 4-byte writes)
  // needs to approach the copy bandwidth.
  std::size_t vectors = vector_end / 8;
  for (std::size_t v = first; v < vectors; v += 2 * stride) {
    float x[8], y[8];
    bool second = v + stride < vectors;
    detail::load8(in + v * 8, x);
    if (second)
      detail::load8(in + (v + stride) * 8, y);
    detail::store8(out + v * 8, x);
    if (second)
      detail::store8(out + (v + stride) * 8, y);
  }
  for (std::size_t i = vector_end + first; i < a.count; i += stride)
    out[i] = detail::from_f32<To>(detail::to_f32(in[i]));
}

// fp16/bf16 -> f32, the direction that writes twice what it reads. Each thread moves
// chunks of 4 elements: an 8-byte load and a 16-byte store, so that every load and
// every store instruction of a warp covers one contiguous span (256 and 512 bytes)
// with no holes. (Loading 16 bytes and storing two float4s leaves each store
// instruction writing half of each 32-byte sector, and the widening direction then
// stalled at ~61% of the copy bandwidth while narrowing reached 97%.) `chunks_per_step`
// chunks per thread are loaded before any is stored.
constexpr int chunks_per_step = 4;

template <class From>
__global__ void widen_kernel(const From* in, float* out, std::size_t count) {
  const uint2* in4 = reinterpret_cast<const uint2*>(in);
  float4* out4 = reinterpret_cast<float4*>(out);
  std::size_t chunks = count / 4;
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t c = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; c + (chunks_per_step - 1) * stride < chunks; c += chunks_per_step * stride) {
    uint2 raw[chunks_per_step];
#pragma unroll
    for (int u = 0; u < chunks_per_step; ++u)
      raw[u] = in4[c + u * stride];
#pragma unroll
    for (int u = 0; u < chunks_per_step; ++u) {
      float2 lo = detail::unpack2<From>(raw[u].x), hi = detail::unpack2<From>(raw[u].y);
      out4[c + u * stride] = make_float4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  for (; c < chunks; c += stride) {
    uint2 raw = in4[c];
    float2 lo = detail::unpack2<From>(raw.x), hi = detail::unpack2<From>(raw.y);
    out4[c] = make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  std::size_t tail = chunks * 4 + static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tail < count) // at most 3 elements, one per thread of the first block
    out[tail] = detail::to_f32(in[tail]);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_convert(const convert_args& a, cudaStream_t stream) {
  auto half = [](dtype t) { return t == dtype::f16 || t == dtype::bf16; };
  bool ok = (a.from == dtype::f32 && half(a.to)) || (half(a.from) && a.to == dtype::f32);
  if (!ok)
    throw std::invalid_argument(std::string("convert: cannot convert ") + dtype_name(a.from)
                                + " to " + dtype_name(a.to)
                                + "; supported are f32 to f16/bf16 and back (launch_cast converts "
                                  "between every pair)");
  if (a.count == 0)
    return;
  bool vectorized = aligned16(a.input) && aligned16(a.output);
  int threads = a.threads > 0 ? a.threads : 256;
  int blocks = detail::grid_stride_blocks(vectorized ? (a.count + 15) / 16 : a.count, threads);
  if (a.from != dtype::f32 && vectorized) {
    std::size_t steps = (a.count / 4 + chunks_per_step - 1) / chunks_per_step;
    int widen_blocks = detail::grid_stride_blocks(std::max<std::size_t>(steps, 1), threads);
    if (a.from == dtype::f16)
      widen_kernel<<<widen_blocks, threads, 0, stream>>>(static_cast<const __half*>(a.input),
                                                         static_cast<float*>(a.output), a.count);
    else
      widen_kernel<<<widen_blocks, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a.input), static_cast<float*>(a.output), a.count);
    CAF_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (a.from == dtype::f32 && a.to == dtype::f16)
    convert_kernel<float, __half><<<blocks, threads, 0, stream>>>(a, vectorized);
  else if (a.from == dtype::f32)
    convert_kernel<float, __nv_bfloat16><<<blocks, threads, 0, stream>>>(a, vectorized);
  else if (a.from == dtype::f16)
    convert_kernel<__half, float><<<blocks, threads, 0, stream>>>(a, vectorized);
  else
    convert_kernel<__nv_bfloat16, float><<<blocks, threads, 0, stream>>>(a, vectorized);
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
