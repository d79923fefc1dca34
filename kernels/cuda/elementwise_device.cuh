// Device pieces shared by the element-wise kernels (elementwise.cu,
// elementwise_binary.cu); not part of any public header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/elementwise_math.hpp"

namespace caf_serving::kernels::detail::ew {

/// Elements per thread and step: one 16-byte vector of f16/bf16, two of f32/i32,
/// four of i64, one 8-byte vector of bool/i8/u8.
inline constexpr int chunk = 8;

/// Device storage of each dtype, the type it computes in, and the conversions
/// between the two (f16/bf16 round to nearest even on the way out).
template <dtype D>
struct traits;

template <>
struct traits<dtype::f32> {
  using storage = float;
  using compute = float;
  static __device__ __forceinline__ float load(float v) {
    return v;
  }
  static __device__ __forceinline__ float store(float c) {
    return c;
  }
};

template <>
struct traits<dtype::f16> {
  using storage = __half;
  using compute = float;
  static __device__ __forceinline__ float load(__half v) {
    return __half2float(v);
  }
  static __device__ __forceinline__ __half store(float c) {
    return __float2half_rn(c);
  }
};

template <>
struct traits<dtype::bf16> {
  using storage = __nv_bfloat16;
  using compute = float;
  static __device__ __forceinline__ float load(__nv_bfloat16 v) {
    return __bfloat162float(v);
  }
  static __device__ __forceinline__ __nv_bfloat16 store(float c) {
    return __float2bfloat16_rn(c);
  }
};

template <class I>
struct integer_traits {
  using storage = I;
  using compute = I;
  static __device__ __forceinline__ I load(I v) {
    return v;
  }
  static __device__ __forceinline__ I store(I c) {
    return c;
  }
};

template <>
struct traits<dtype::i64> : integer_traits<std::int64_t> {};
template <>
struct traits<dtype::i32> : integer_traits<std::int32_t> {};
template <>
struct traits<dtype::i8> : integer_traits<std::int8_t> {};
template <>
struct traits<dtype::u8> : integer_traits<std::uint8_t> {};

template <>
struct traits<dtype::boolean> {
  using storage = std::uint8_t;
  using compute = bool;
  static __device__ __forceinline__ bool load(std::uint8_t v) {
    return v != 0;
  }
  static __device__ __forceinline__ std::uint8_t store(bool c) {
    return c ? 1 : 0;
  }
};

template <dtype D>
using storage_t = typename traits<D>::storage;

/// The alignment a chunk of `S` needs for its vector loads and stores.
template <class S>
constexpr std::size_t chunk_alignment() {
  return sizeof(S) * chunk >= 16 ? 16 : sizeof(S) * chunk;
}

template <class S>
bool chunk_aligned(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) % chunk_alignment<S>()) == 0;
}

/// Loads `chunk` consecutive elements with 8- or 16-byte vector loads.
template <class S>
__device__ __forceinline__ void load_chunk(const S* p, S (&v)[chunk]) {
  constexpr int bytes = sizeof(S) * chunk;
  if constexpr (bytes < 16) {
    static_assert(bytes == 8);
    uint2 r = *reinterpret_cast<const uint2*>(p);
    memcpy(v, &r, bytes);
  } else {
    uint4 r[bytes / 16];
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i)
      r[i] = reinterpret_cast<const uint4*>(p)[i];
    memcpy(v, r, bytes);
  }
}

/// Stores `chunk` consecutive elements with 8- or 16-byte vector stores.
template <class S>
__device__ __forceinline__ void store_chunk(S* p, const S (&v)[chunk]) {
  constexpr int bytes = sizeof(S) * chunk;
  if constexpr (bytes < 16) {
    static_assert(bytes == 8);
    uint2 r;
    memcpy(&r, v, bytes);
    *reinterpret_cast<uint2*>(p) = r;
  } else {
    uint4 r[bytes / 16];
    memcpy(r, v, bytes);
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i)
      reinterpret_cast<uint4*>(p)[i] = r[i];
  }
}

/// Every element of a chunk the same (a broadcast scalar operand).
template <class S>
__device__ __forceinline__ void fill_chunk(S value, S (&v)[chunk]) {
#pragma unroll
  for (int j = 0; j < chunk; ++j)
    v[j] = value;
}

/// Loads the chunk of one operand that starts at `offset` and steps `inner_stride`
/// per element (the chunk does not wrap the innermost dim): one broadcast element,
/// vector loads where it is contiguous and aligned, else element by element.
template <class S, class Index>
__device__ __forceinline__ void load_operand_chunk(const S* base, Index offset,
                                                   Index inner_stride, S (&v)[chunk]) {
  const S* p = base + offset;
  if (inner_stride == 0) {
    fill_chunk(*p, v);
  } else if (inner_stride == 1
             && reinterpret_cast<std::uintptr_t>(p) % chunk_alignment<S>() == 0) {
    load_chunk(p, v);
  } else {
#pragma unroll
    for (int j = 0; j < chunk; ++j)
      v[j] = p[static_cast<Index>(j) * inner_stride];
  }
}

/// 32-bit indices when the element count (plus a chunk of slack for the cursor's
/// last step) and every operand's reach fit: 64-bit division costs several times more.
template <int N>
bool fits_32bit(const broadcast_layout<N>& l) {
  constexpr std::int64_t limit = std::int64_t{1} << 32;
  if (element_count(l) + 2 * chunk >= limit)
    return false;
  for (int k = 0; k < N; ++k)
    if (operand_extent(l, k) >= limit)
      return false;
  return true;
}

/// Whether every operand of the collapsed layout `l` is contiguous or one element,
/// so that the flat (vectorised) kernels apply.
template <int N>
bool is_flat(const broadcast_layout<N>& l) {
  if (l.rank != 1)
    return false;
  for (int k = 0; k < N; ++k)
    if (l.strides[k][0] > 1)
      return false;
  return true;
}

} // namespace caf_serving::kernels::detail::ew
