// Device helpers shared by the kernels in this folder (not part of any public header).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cpu/types.hpp"

namespace caf_serving::kernels::detail {

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// Two fp16/bf16 values (one 32-bit word) as floats, with one paired conversion.
template <class T>
__device__ __forceinline__ float2 unpack2(unsigned word) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  }
}

/// Two floats as one 32-bit word of fp16/bf16 (round to nearest even), converted as
/// a pair (one F2FP instruction instead of two conversions and a permute).
template <class T>
__device__ __forceinline__ unsigned pack2(float a, float b) {
  unsigned word;
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(a, b);
    word = *reinterpret_cast<const unsigned*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    word = *reinterpret_cast<const unsigned*>(&h);
  }
  return word;
}

/// 8 fp16/bf16 values (16 bytes) as floats.
template <class T>
__device__ __forceinline__ void unpack8(uint4 raw, float (&out)[8]) {
  unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = unpack2<T>(w[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

/// 8 floats as 8 fp16/bf16 values (16 bytes).
template <class T>
__device__ __forceinline__ uint4 pack8(const float (&in)[8]) {
  return make_uint4(pack2<T>(in[0], in[1]), pack2<T>(in[2], in[3]), pack2<T>(in[4], in[5]),
                    pack2<T>(in[6], in[7]));
}

/// Loads 8 consecutive elements (16 or 32 bytes, 16-byte aligned) as floats.
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    float4 a = reinterpret_cast<const float4*>(p)[0];
    float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    unpack8<T>(raw, out);
  }
}

/// Stores 8 floats as consecutive elements of `T` (16-byte aligned).
template <class T>
__device__ __forceinline__ void store8(T* p, const float (&in)[8]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
  } else {
    *reinterpret_cast<uint4*>(p) = pack8<T>(in);
  }
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the whole block; `scratch` holds at least 32 floats. Every thread gets
/// the result. Ends with a barrier, so `scratch` can be reused at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}

/// Maps a floating-point dtype to the device storage type and calls `f` with a value
/// of it. The fused kernels take only these; any other type is an invalid argument.
template <class F>
void dispatch_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      f(float{});
      return;
    case dtype::f16:
      f(__half{});
      return;
    case dtype::bf16:
      f(__nv_bfloat16{});
      return;
    case dtype::i64:
    case dtype::i32:
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
      break;
  }
  throw std::invalid_argument(std::string("element type ") + dtype_name(t)
                              + " is not supported by this kernel; it takes f32, f16 or bf16");
}

/// Blocks for a grid-stride loop over `work` items: enough to fill the device
/// several times over, never more than the work needs.
int grid_stride_blocks(std::size_t work, int threads);

} // namespace caf_serving::kernels::detail
