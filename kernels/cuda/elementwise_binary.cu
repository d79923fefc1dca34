// launch_binary: Add Sub Mul Div Pow Max Min, And Or Xor, and the comparisons, with
// broadcasting. The operators themselves are in cpu/elementwise_math.hpp.
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

template <dtype D, binary_op Op>
struct binary_fn {
  using in = storage_t<D>;
  using out = storage_t<binary_output_type(Op, D)>;
  using compute = typename traits<D>::compute;
  static __device__ __forceinline__ out apply(in a, in b) {
    compute x = traits<D>::load(a), y = traits<D>::load(b);
    if constexpr (is_comparison(Op))
      return traits<dtype::boolean>::store(apply_compare<compute>(Op, x, y));
    else
      return traits<D>::store(apply_binary<compute>(Op, x, y));
  }
};

struct flat_params {
  const void* a;
  const void* b;
  void* output;
  std::size_t count;
  bool a_scalar; // one element, read once
  bool b_scalar;
  bool vectorized; // every buffer aligned for chunk loads and stores
};

// Both operands contiguous or single elements: chunks of 8 with vector loads and
// stores, then the (count % 8) tail, or everything element by element when a
// buffer is not aligned.
template <dtype D, binary_op Op>
__global__ void binary_flat_kernel(flat_params p) {
  using fn = binary_fn<D, Op>;
  using in = typename fn::in;
  using out = typename fn::out;
  const in* a = static_cast<const in*>(p.a);
  const in* b = static_cast<const in*>(p.b);
  out* o = static_cast<out*>(p.output);
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  in a0 = a[0], b0 = b[0];
  std::size_t chunks = p.vectorized ? p.count / chunk : 0;
  for (std::size_t c = first; c < chunks; c += stride) {
    in av[chunk], bv[chunk];
    if (p.a_scalar)
      fill_chunk(a0, av);
    else
      load_chunk(a + c * chunk, av);
    if (p.b_scalar)
      fill_chunk(b0, bv);
    else
      load_chunk(b + c * chunk, bv);
    out ov[chunk];
#pragma unroll
    for (int j = 0; j < chunk; ++j)
      ov[j] = fn::apply(av[j], bv[j]);
    store_chunk(o + c * chunk, ov);
  }
  for (std::size_t i = chunks * chunk + first; i < p.count; i += stride)
    o[i] = fn::apply(p.a_scalar ? a0 : a[i], p.b_scalar ? b0 : b[i]);
}

// Any broadcast: each thread takes 8 consecutive outputs and finds its operands'
// offsets for the first by division; within one row it loads each operand as a
// chunk, across rows it steps the cursor element by element.
template <dtype D, binary_op Op, class Index>
__global__ void binary_strided_kernel(broadcast_layout<2, Index> l, const void* a_ptr,
                                      const void* b_ptr, void* out_ptr, Index count,
                                      bool vector_store) {
  using fn = binary_fn<D, Op>;
  using in = typename fn::in;
  using out = typename fn::out;
  const in* a = static_cast<const in*>(a_ptr);
  const in* b = static_cast<const in*>(b_ptr);
  out* o = static_cast<out*>(out_ptr);
  Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  Index chunks = (count + chunk - 1) / chunk;
  for (Index c = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    Index i0 = c * chunk;
    Index n = count - i0 < Index{chunk} ? count - i0 : Index{chunk};
    broadcast_cursor<2, Index> cursor;
    cursor.seek(l, i0);
    out ov[chunk];
    if (n == Index{chunk} && cursor.inner + chunk <= cursor.inner_shape) {
      // The chunk stays within one row of the innermost dim (the common case for
      // [B,S,H]+[H], masks and squeeze-excite): each operand is one element, a
      // vector, or a fixed stride.
      in av[chunk], bv[chunk];
      load_operand_chunk(a, cursor.offsets[0], cursor.inner_step[0], av);
      load_operand_chunk(b, cursor.offsets[1], cursor.inner_step[1], bv);
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        ov[j] = fn::apply(av[j], bv[j]);
    } else {
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        if (static_cast<Index>(j) < n) {
          ov[j] = fn::apply(a[cursor.offsets[0]], b[cursor.offsets[1]]);
          if (static_cast<Index>(j) + 1 < n)
            cursor.next(l, i0 + j + 1);
        }
    }
    if (vector_store && n == Index{chunk}) {
      store_chunk(o + i0, ov);
    } else {
#pragma unroll
      for (int j = 0; j < chunk; ++j)
        if (static_cast<Index>(j) < n)
          o[i0 + j] = ov[j];
    }
  }
}

template <binary_op Op>
using op_constant = std::integral_constant<binary_op, Op>;

template <class F>
void dispatch_op(binary_op op, F&& f) {
  switch (op) {
    case binary_op::add:
      return f(op_constant<binary_op::add>{});
    case binary_op::sub:
      return f(op_constant<binary_op::sub>{});
    case binary_op::mul:
      return f(op_constant<binary_op::mul>{});
    case binary_op::div:
      return f(op_constant<binary_op::div>{});
    case binary_op::pow:
      return f(op_constant<binary_op::pow>{});
    case binary_op::max:
      return f(op_constant<binary_op::max>{});
    case binary_op::min:
      return f(op_constant<binary_op::min>{});
    case binary_op::logical_and:
      return f(op_constant<binary_op::logical_and>{});
    case binary_op::logical_or:
      return f(op_constant<binary_op::logical_or>{});
    case binary_op::logical_xor:
      return f(op_constant<binary_op::logical_xor>{});
    case binary_op::equal:
      return f(op_constant<binary_op::equal>{});
    case binary_op::less:
      return f(op_constant<binary_op::less>{});
    case binary_op::less_or_equal:
      return f(op_constant<binary_op::less_or_equal>{});
    case binary_op::greater:
      return f(op_constant<binary_op::greater>{});
    case binary_op::greater_or_equal:
      return f(op_constant<binary_op::greater_or_equal>{});
  }
}

template <dtype D>
using type_constant = std::integral_constant<dtype, D>;

/// The types binary operators take (require_binary_supported ran first).
template <class F>
void dispatch_binary_type(dtype t, F&& f) {
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
    case dtype::boolean:
      return f(type_constant<dtype::boolean>{});
    case dtype::i8:
    case dtype::u8:
      break;
  }
  throw std::invalid_argument(std::string("binary: ") + dtype_name(t) + " is not supported");
}

} // namespace

void launch_binary(const binary_args& args, cudaStream_t stream) {
  require_binary_supported(args.op, args.type);
  require_valid_layout(args.layout, "binary");
  auto l = collapse(args.layout);
  std::int64_t count = element_count(l);
  if (count == 0)
    return;
  if (!args.a || !args.b || !args.output)
    throw std::invalid_argument("binary: a, b and output must all be device pointers");
  int threads = args.threads > 0 ? args.threads : 256;
  dispatch_binary_type(args.type, [&](auto type) {
    constexpr dtype D = decltype(type)::value;
    dispatch_op(args.op, [&](auto op) {
      constexpr binary_op Op = decltype(op)::value;
      if constexpr (binary_supported(Op, D)) {
        using fn = binary_fn<D, Op>;
        if (is_flat(l)) {
          flat_params p{args.a, args.b, args.output, static_cast<std::size_t>(count),
                        l.strides[0][0] == 0, l.strides[1][0] == 0, false};
          p.vectorized = (p.a_scalar || chunk_aligned<typename fn::in>(args.a))
                         && (p.b_scalar || chunk_aligned<typename fn::in>(args.b))
                         && chunk_aligned<typename fn::out>(args.output);
          std::size_t work = p.vectorized ? (p.count + chunk - 1) / chunk : p.count;
          int blocks = detail::grid_stride_blocks(work, threads);
          binary_flat_kernel<D, Op><<<blocks, threads, 0, stream>>>(p);
        } else {
          bool vector_store = chunk_aligned<typename fn::out>(args.output);
          std::size_t chunks = (static_cast<std::size_t>(count) + chunk - 1) / chunk;
          int blocks = detail::grid_stride_blocks(chunks, threads);
          if (fits_32bit(l))
            binary_strided_kernel<D, Op, std::uint32_t><<<blocks, threads, 0, stream>>>(
              narrow<std::uint32_t>(l), args.a, args.b, args.output,
              static_cast<std::uint32_t>(count), vector_store);
          else
            binary_strided_kernel<D, Op, std::uint64_t><<<blocks, threads, 0, stream>>>(
              narrow<std::uint64_t>(l), args.a, args.b, args.output,
              static_cast<std::uint64_t>(count), vector_store);
        }
      }
    });
  });
  CAF_CUDA_CHECK(cudaGetLastError());
}

} // namespace caf_serving::kernels
