#include "cuda/convert.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"

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

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

void launch_convert(const convert_args& a, cudaStream_t stream) {
  bool ok = (a.from == dtype::f32) != (a.to == dtype::f32);
  if (!ok)
    throw std::invalid_argument(std::string("convert: cannot convert ") + dtype_name(a.from)
                                + " to " + dtype_name(a.to)
                                + "; supported are f32 to f16/bf16 and back");
  if (a.count == 0)
    return;
  bool vectorized = aligned16(a.input) && aligned16(a.output);
  int threads = a.threads > 0 ? a.threads : 256;
  int blocks = detail::grid_stride_blocks(vectorized ? (a.count + 15) / 16 : a.count, threads);
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
