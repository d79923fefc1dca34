// launch_unary, launch_where and launch_cast (launch_binary is in
// elementwise_binary.cu). The operators are in cpu/elementwise_math.hpp.
#include "cuda/elementwise.hpp"

#include "cuda/check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/elementwise_device.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

namespace caf_serving::kernels {
namespace {

using namespace detail::ew;

template <dtype D>
using type_constant = std::integral_constant<dtype, D>;

/// Calls `f` with the dtype as a compile-time constant.
template <class F>
void dispatch_any_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      return f(type_constant<dtype::f32>{});
    case dtype::f16:
      return f(type_constant<dtype::f16>{});
    case dtype::bf16:
      return f(type_constant<dtype::bf16>{});
    case dtype::i64:
      return f(type_constant<dtype::i64>{});
    case dtype::i32:
      return f(type_constant<dtype::i32>{});
    case dtype::i8:
      return f(type_constant<dtype::i8>{});
    case dtype::u8:
      return f(type_constant<dtype::u8>{});
    case dtype::boolean:
      return f(type_constant<dtype::boolean>{});
  }
  throw std::invalid_argument("element-wise: unknown element type");
}

/// A flat loop over `count` elements, 8 per thread and step: `chunk_body(c)` when the
/// buffers are aligned for vectors, then `element_body(i)` for the tail (or for all
/// of them when they are not).
template <class ChunkBody, class ElementBody>
__device__ __forceinline__ void flat_loop(std::size_t count, bool vectorized,
                                          ChunkBody&& chunk_body, ElementBody&& element_body) {
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t chunks = vectorized ? count / chunk : 0;
  for (std::size_t c = first; c < chunks; c += stride)
    chunk_body(c);
  for (std::size_t i = chunks * chunk + first; i < count; i += stride)
    element_body(i);
}

int flat_blocks(std::size_t count, bool vectorized, int threads) {
  return detail::grid_stride_blocks(vectorized ? (count + chunk - 1) / chunk : count, threads);
}

// ---- unary -----------------------------------------------------------------------------

template <dtype D, unary_op Op>
__device__ __forceinline__ storage_t<D> unary_one(storage_t<D> v, const unary_params& p) {
  using t = traits<D>;
  if constexpr (D == dtype::boolean)
    return t::store(!t::load(v)); // logical_not
  else if constexpr (is_floating(D))
    return t::store(apply_unary(Op, t::load(v), p));
  else
    return t::store(apply_unary_int(Op, t::load(v)));
}

template <dtype D, unary_op Op>
__global__ void unary_kernel(unary_params p, const void* in_ptr, void* out_ptr,
                             std::size_t count, bool vectorized) {
  using s = storage_t<D>;
  const s* in = static_cast<const s*>(in_ptr);
  s* out = static_cast<s*>(out_ptr);
  flat_loop(
    count, vectorized,
    [&](std::size_t c) {
      s v[chunk];
      load_chunk(in + c * chunk, v);
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        v[j] = unary_one<D, Op>(v[j], p);
      store_chunk(out + c * chunk, v);
    },
    [&](std::size_t i) { out[i] = unary_one<D, Op>(in[i], p); });
}

template <unary_op Op>
using unary_constant = std::integral_constant<unary_op, Op>;

/// Calls `f` with the operator as a compile-time constant (identity is a copy and
/// never gets here).
template <class F>
void dispatch_unary_op(unary_op op, F&& f) {
  switch (op) {
#define CAF_EW_UNARY(name)                                                             \
  case unary_op::name:                                                                 \
    return f(unary_constant<unary_op::name>{});
    CAF_EW_UNARY(neg)
    CAF_EW_UNARY(abs)
    CAF_EW_UNARY(sqrt)
    CAF_EW_UNARY(reciprocal)
    CAF_EW_UNARY(exp)
    CAF_EW_UNARY(log)
    CAF_EW_UNARY(erf)
    CAF_EW_UNARY(tanh)
    CAF_EW_UNARY(sigmoid)
    CAF_EW_UNARY(relu)
    CAF_EW_UNARY(leaky_relu)
    CAF_EW_UNARY(elu)
    CAF_EW_UNARY(gelu_erf)
    CAF_EW_UNARY(gelu_tanh)
    CAF_EW_UNARY(silu)
    CAF_EW_UNARY(hard_sigmoid)
    CAF_EW_UNARY(hard_swish)
    CAF_EW_UNARY(clip)
    CAF_EW_UNARY(softplus)
    CAF_EW_UNARY(floor)
    CAF_EW_UNARY(ceil)
    CAF_EW_UNARY(round)
    CAF_EW_UNARY(sin)
    CAF_EW_UNARY(cos)
    CAF_EW_UNARY(logical_not)
#undef CAF_EW_UNARY
    case unary_op::identity:
      break;
  }
}

// ---- where -----------------------------------------------------------------------------

struct where_flat_params {
  const std::uint8_t* condition;
  const void* x;
  const void* y;
  void* output;
  std::size_t count;
  bool scalar[3]; // condition, x, y: one element, read once
  bool vectorized;
};

// Where only moves elements, so it is instantiated per element size (S is an
// unsigned integer of that size), not per type.
template <class S>
__global__ void where_flat_kernel(where_flat_params p) {
  const S* x = static_cast<const S*>(p.x);
  const S* y = static_cast<const S*>(p.y);
  S* out = static_cast<S*>(p.output);
  std::uint8_t c0 = p.condition[0];
  S x0 = x[0], y0 = y[0];
  flat_loop(
    p.count, p.vectorized,
    [&](std::size_t c) {
      std::uint8_t cv[chunk];
      S xv[chunk], yv[chunk];
      if (p.scalar[0])
        fill_chunk(c0, cv);
      else
        load_chunk(p.condition + c * chunk, cv);
      if (p.scalar[1])
        fill_chunk(x0, xv);
      else
        load_chunk(x + c * chunk, xv);
      if (p.scalar[2])
        fill_chunk(y0, yv);
      else
        load_chunk(y + c * chunk, yv);
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        xv[j] = cv[j] != 0 ? xv[j] : yv[j];
      store_chunk(out + c * chunk, xv);
    },
    [&](std::size_t i) {
      bool take_x = (p.scalar[0] ? c0 : p.condition[i]) != 0;
      out[i] = take_x ? (p.scalar[1] ? x0 : x[i]) : (p.scalar[2] ? y0 : y[i]);
    });
}

template <class S, class Index>
__global__ void where_strided_kernel(broadcast_layout<3, Index> l, const std::uint8_t* condition,
                                     const void* x_ptr, const void* y_ptr, void* out_ptr,
                                     Index count, bool vector_store) {
  const S* x = static_cast<const S*>(x_ptr);
  const S* y = static_cast<const S*>(y_ptr);
  S* out = static_cast<S*>(out_ptr);
  Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  Index chunks = (count + chunk - 1) / chunk;
  for (Index c = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    Index i0 = c * chunk;
    Index n = count - i0 < Index{chunk} ? count - i0 : Index{chunk};
    broadcast_cursor<3, Index> cursor;
    cursor.seek(l, i0);
    S ov[chunk];
    if (n == Index{chunk} && cursor.inner + chunk <= cursor.inner_shape) { // within one row
      std::uint8_t cv[chunk];
      S yv[chunk];
      load_operand_chunk(condition, cursor.offsets[0], cursor.inner_step[0], cv);
      load_operand_chunk(x, cursor.offsets[1], cursor.inner_step[1], ov);
      load_operand_chunk(y, cursor.offsets[2], cursor.inner_step[2], yv);
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        ov[j] = cv[j] != 0 ? ov[j] : yv[j];
    } else {
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        if (static_cast<Index>(j) < n) {
          ov[j] = condition[cursor.offsets[0]] != 0 ? x[cursor.offsets[1]] : y[cursor.offsets[2]];
          if (static_cast<Index>(j) + 1 < n)
            cursor.next(l, i0 + j + 1);
        }
    }
    if (vector_store && n == Index{chunk}) {
      store_chunk(out + i0, ov);
    } else {
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        if (static_cast<Index>(j) < n)
          out[i0 + j] = ov[j];
    }
  }
}

template <class S>
void launch_where_sized(const where_args& a, const broadcast_layout<3>& l, std::int64_t count,
                        int threads, cudaStream_t stream) {
  auto condition = static_cast<const std::uint8_t*>(a.condition);
  if (is_flat(l)) {
    where_flat_params p{condition, a.x, a.y, a.output, static_cast<std::size_t>(count),
                        {l.strides[0][0] == 0, l.strides[1][0] == 0, l.strides[2][0] == 0},
                        false};
    p.vectorized = (p.scalar[0] || chunk_aligned<std::uint8_t>(a.condition))
                   && (p.scalar[1] || chunk_aligned<S>(a.x))
                   && (p.scalar[2] || chunk_aligned<S>(a.y)) && chunk_aligned<S>(a.output);
    where_flat_kernel<S><<<flat_blocks(p.count, p.vectorized, threads), threads, 0, stream>>>(p);
    return;
  }
  bool vector_store = chunk_aligned<S>(a.output);
  int blocks = detail::grid_stride_blocks((static_cast<std::size_t>(count) + chunk - 1) / chunk,
                                          threads);
  if (fits_32bit(l))
    where_strided_kernel<S, std::uint32_t><<<blocks, threads, 0, stream>>>(
      narrow<std::uint32_t>(l), condition, a.x, a.y, a.output, static_cast<std::uint32_t>(count),
      vector_store);
  else
    where_strided_kernel<S, std::uint64_t><<<blocks, threads, 0, stream>>>(
      narrow<std::uint64_t>(l), condition, a.x, a.y, a.output, static_cast<std::uint64_t>(count),
      vector_store);
}

// ---- cast ------------------------------------------------------------------------------

template <dtype From, dtype To>
__device__ __forceinline__ storage_t<To> cast_one(storage_t<From> v) {
  using to = traits<To>;
  if constexpr (From == To) {
    return v;
  } else if constexpr (is_floating(From)) {
    float f = traits<From>::load(v);
    if constexpr (is_floating(To))
      return to::store(f);
    else if constexpr (To == dtype::boolean)
      return to::store(f != 0.0f); // NaN is nonzero: true
    else
      return float_to_int<storage_t<To>>(f);
  } else { // integers and bool (0 or 1, whatever the byte)
    std::int64_t x = From == dtype::boolean ? (v != 0 ? 1 : 0) : static_cast<std::int64_t>(v);
    if constexpr (is_floating(To))
      return to::store(static_cast<float>(x)); // through f32, as ONNX Runtime does
    else if constexpr (To == dtype::boolean)
      return to::store(x != 0);
    else
      return int_to_int<storage_t<To>>(x);
  }
}

template <dtype From, dtype To>
__global__ void cast_kernel(const void* in_ptr, void* out_ptr, std::size_t count,
                            bool vectorized) {
  using in_t = storage_t<From>;
  using out_t = storage_t<To>;
  const in_t* in = static_cast<const in_t*>(in_ptr);
  out_t* out = static_cast<out_t*>(out_ptr);
  flat_loop(
    count, vectorized,
    [&](std::size_t c) {
      in_t v[chunk];
      out_t o[chunk];
      load_chunk(in + c * chunk, v);
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        o[j] = cast_one<From, To>(v[j]);
      store_chunk(out + c * chunk, o);
    },
    [&](std::size_t i) { out[i] = cast_one<From, To>(in[i]); });
}

} // namespace

void launch_unary(const unary_args& a, cudaStream_t stream) {
  require_unary_supported(a.op, a.type);
  if (a.count == 0)
    return;
  if (!a.input || !a.output)
    throw std::invalid_argument("unary: input and output must be device pointers");
  if (a.op == unary_op::identity) {
    if (a.input != a.output)
      CAF_CUDA_CHECK(cudaMemcpyAsync(a.output, a.input, a.count * dtype_size(a.type),
                                     cudaMemcpyDeviceToDevice, stream));
    return;
  }
  int threads = a.threads > 0 ? a.threads : 256;
  dispatch_any_type(a.type, [&](auto type) {
    constexpr dtype D = decltype(type)::value;
    dispatch_unary_op(a.op, [&](auto op) {
      constexpr unary_op Op = decltype(op)::value;
      if constexpr (unary_supported(Op, D)) {
        bool vectorized = chunk_aligned<storage_t<D>>(a.input) && chunk_aligned<storage_t<D>>(a.output);
        unary_kernel<D, Op><<<flat_blocks(a.count, vectorized, threads), threads, 0, stream>>>(
          a.params, a.input, a.output, a.count, vectorized);
      }
    });
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

void launch_where(const where_args& a, cudaStream_t stream) {
  require_valid_layout(a.layout, "where");
  auto l = collapse(a.layout);
  std::int64_t count = element_count(l);
  if (count == 0)
    return;
  if (!a.condition || !a.x || !a.y || !a.output)
    throw std::invalid_argument("where: condition, x, y and output must be device pointers");
  int threads = a.threads > 0 ? a.threads : 256;
  switch (dtype_size(a.type)) {
    case 1:
      launch_where_sized<std::uint8_t>(a, l, count, threads, stream);
      break;
    case 2:
      launch_where_sized<std::uint16_t>(a, l, count, threads, stream);
      break;
    case 4:
      launch_where_sized<std::uint32_t>(a, l, count, threads, stream);
      break;
    default:
      launch_where_sized<std::uint64_t>(a, l, count, threads, stream);
  }
  CAF_CUDA_CHECK(cudaGetLastError());
}

void launch_cast(const cast_args& a, cudaStream_t stream) {
  if (a.count == 0)
    return;
  if (!a.input || !a.output)
    throw std::invalid_argument("cast: input and output must be device pointers");
  if (a.from == a.to) {
    if (a.input != a.output)
      CAF_CUDA_CHECK(cudaMemcpyAsync(a.output, a.input, a.count * dtype_size(a.from),
                                     cudaMemcpyDeviceToDevice, stream));
    return;
  }
  int threads = a.threads > 0 ? a.threads : 256;
  dispatch_any_type(a.from, [&](auto from) {
    dispatch_any_type(a.to, [&](auto to) {
      constexpr dtype From = decltype(from)::value, To = decltype(to)::value;
      if constexpr (From != To) {
        bool vectorized = chunk_aligned<storage_t<From>>(a.input)
                          && chunk_aligned<storage_t<To>>(a.output);
        cast_kernel<From, To><<<flat_blocks(a.count, vectorized, threads), threads, 0, stream>>>(
          a.input, a.output, a.count, vectorized);
      }
    });
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
