/// Index arithmetic of the data-movement and reduction kernels (`cuda/permute`,
/// `cuda/strided_copy`, `cuda/gather_axis`, `cuda/reduce`), shared by the device code
/// and the CPU references so that the CPU tests run the very arithmetic the GPU does.
///
/// Two halves:
///   - plans, built on the host (`data_layout.cpp`): they check the arguments (throwing
///     `std::invalid_argument` with what was wrong), normalise a request to the fewest
///     dimensions (dropping size-1 dims, merging dims that stay adjacent) and widen
///     elements to 16-byte vectors where the layout and the pointers allow;
///   - `CAF_KERNELS_HD` functions that map a thread's linear index to element offsets,
///     compiled for the host and, under nvcc, for the device.
///
/// Every size, stride and offset is in elements of the plan's element size.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CAF_KERNELS_HD __host__ __device__ __forceinline__
#else
#define CAF_KERNELS_HD inline
#endif
#if defined(__CUDA_ARCH__) // the device pass only: host compilers warn on the pragma
#define CAF_KERNELS_UNROLL _Pragma("unroll")
#else
#define CAF_KERNELS_UNROLL
#endif

namespace caf_serving::kernels {

/// Dimensions a data-movement or reduction launch takes (ONNX tensors of the target
/// models have at most 5; reshape larger ones first).
inline constexpr int max_rank = 6;

// ---- strided boxes -----------------------------------------------------------------

/// One N-d box: element (i0, .., i{r-1}) moves from `src_offset + sum(i_d *
/// src_strides[d])` to `dst_offset + sum(i_d * dst_strides[d])`. Source strides may be
/// 0 (broadcast, Expand) or negative (Slice with negative steps); destination strides
/// may be negative but not 0 on a dim of size > 1, and the destination elements must be
/// distinct (no two box elements written to one place).
struct strided_box {
  int rank = 0; ///< 0: one element
  std::int64_t dims[max_rank] = {};
  std::int64_t src_strides[max_rank] = {};
  std::int64_t dst_strides[max_rank] = {};
  std::int64_t src_offset = 0;
  std::int64_t dst_offset = 0;
};

/// Elements in `b`.
std::int64_t box_count(const strided_box& b);

/// Where one element of a box comes from and goes to.
struct offset_pair {
  std::int64_t src = 0;
  std::int64_t dst = 0;
};

/// The offsets of the `linear`-th element of `b` in row-major order over `b.dims`.
/// `Index` is the type of the division (32-bit where the box has < 2^31 elements:
/// several times cheaper on the device than 64-bit division).
template <class Index>
CAF_KERNELS_HD offset_pair box_offsets(const strided_box& b, Index linear) {
  offset_pair o{b.src_offset, b.dst_offset};
  CAF_KERNELS_UNROLL
  for (int d = max_rank - 1; d >= 0; --d) {
    if (d < b.rank) {
      Index size = static_cast<Index>(b.dims[d]);
      Index c = linear % size;
      linear /= size;
      o.src += static_cast<std::int64_t>(c) * b.src_strides[d];
      o.dst += static_cast<std::int64_t>(c) * b.dst_strides[d];
    }
  }
  return o;
}

/// A box ready to run: dims of size 1 dropped, dims that stay adjacent on both sides
/// merged, and elements widened to up to 16 bytes where possible.
struct copy_plan {
  strided_box box;
  std::size_t element_size = 0; ///< 1, 2, 4, 8 or 16 bytes
};

/// Checks `box` (rank <= 6, dims >= 0, element size 1/2/4/8, no destination stride 0
/// on a dim > 1) and that no element lies before its buffer's start; where
/// `src_elements`/`dst_elements` are > 0, also that none lies past its end. Throws
/// `std::invalid_argument` naming `who` and the problem.
void check_box(const strided_box& box, std::size_t element_size, std::int64_t src_elements,
               std::int64_t dst_elements, const char* who);

/// `box` with size-1 dims dropped and adjacent dims merged where both strides agree
/// (an empty box becomes rank 1 with dims[0] = 0).
strided_box collapse_box(const strided_box& box);

/// Widens elements of `element_size` bytes to the largest of 16/8/4/2 bytes that the
/// innermost dim (stride 1 on both sides), the other strides, the offsets and the two
/// addresses divide; returns the box unchanged where none does.
copy_plan widen_box(const strided_box& box, std::size_t element_size, std::uintptr_t src,
                    std::uintptr_t dst);

/// Dims of a contiguous row-major tensor.
struct tensor_dims {
  int rank = 0;
  std::int64_t dims[max_rank] = {};
};

/// Row-major strides of `t` in elements.
std::array<std::int64_t, max_rank> contiguous_strides(const tensor_dims& t);

/// The box of ONNX Slice (and of one output of Split) from contiguous `input` into
/// contiguous `output`: on every axis, output index k reads input index
/// `starts[d] + k * steps[d]`. Starts are already resolved and clamped as ONNX says
/// (in [0, dim) where the axis is not empty); steps are nonzero, negative ones walk
/// backwards.
strided_box slice_box(const tensor_dims& input, const std::int64_t* starts,
                      const std::int64_t* steps, const tensor_dims& output);

/// The box writing all of contiguous `input` into contiguous `output` at `offsets`
/// (per dim): Concat (the running offset on its axis) and constant Pad (the leading
/// pads, after the output was filled with the pad value).
strided_box place_box(const tensor_dims& input, const tensor_dims& output,
                      const std::int64_t* offsets);

/// The box of Expand: `input` broadcast to `output` as numpy does (dims aligned on
/// the right, each input dim 1 or equal to the output's). Throws where they do not
/// broadcast.
strided_box expand_box(const tensor_dims& input, const tensor_dims& output);

// ---- permute ---------------------------------------------------------------------------

/// Transpose of a contiguous tensor: output dim i is input dim `perm[i]`.
struct permute_shape {
  int rank = 0;
  std::int64_t dims[max_rank] = {}; ///< the input's dims
  int perm[max_rank] = {};
};

/// A transpose whose innermost source dim moves, run through a tile in shared memory:
/// reads along dim a (source stride 1) and writes along dim b (destination stride 1)
/// are both coalesced. Element (batch, ia, ib) moves from `batch.src + ia +
/// ib * src_stride_b` to `batch.dst + ib + ia * dst_stride_a`, where `batch` ranges
/// over the remaining dims.
struct tile_plan {
  strided_box batch; ///< the dims other than a and b
  std::int64_t a_size = 1;
  std::int64_t b_size = 1;
  std::int64_t src_stride_b = 0;
  std::int64_t dst_stride_a = 0;
};

CAF_KERNELS_HD offset_pair tile_offsets(const tile_plan& t, offset_pair batch, std::int64_t ia,
                                        std::int64_t ib) {
  return {batch.src + ia + ib * t.src_stride_b, batch.dst + ib + ia * t.dst_stride_a};
}

/// How a permute runs: as a plain box copy (the innermost dim stays innermost, so
/// reads and writes are contiguous, and widened to vectors), or through the tile.
struct permute_plan {
  bool tiled = false;
  copy_plan plain; ///< when !tiled
  tile_plan tile;  ///< when tiled; element size in plain.element_size
};

/// Checks `shape` (rank <= 6, dims >= 0, `perm` a permutation) and plans it for
/// buffers at `src` and `dst`.
permute_plan plan_permute(const permute_shape& shape, std::size_t element_size,
                          std::uintptr_t src, std::uintptr_t dst);

// ---- gather along an axis ----------------------------------------------------------

/// The element type of Gather's indices.
enum class index_type {
  i64,
  i32,
};

/// ONNX Gather as [outer, axis_dim, inner] -> [outer, index_count, inner]: output row
/// (o, j) is data row (o, indices[j]).
struct gather_shape {
  std::int64_t outer = 1;
  std::int64_t axis_dim = 1;
  std::int64_t inner = 1;
  std::int64_t index_count = 0; ///< elements of the indices tensor, any shape
};

/// The shape for data of `rank` dims gathered on `axis` (negative counts from the
/// end). Throws for a bad rank or axis.
gather_shape make_gather_shape(int rank, const std::int64_t* dims, int axis,
                               std::int64_t index_count);

/// `index` (negative counts from the end of the axis) as a row of the axis, or -1 if
/// it lies outside [-axis_dim, axis_dim).
template <class I>
CAF_KERNELS_HD std::int64_t resolve_index(I index, std::int64_t axis_dim) {
  auto i = static_cast<std::int64_t>(index);
  if (i < 0)
    i += axis_dim;
  return i >= 0 && i < axis_dim ? i : -1;
}

/// The data row that output row `row` (in [0, outer * index_count)) copies, for the
/// resolved index `resolved` (>= 0).
CAF_KERNELS_HD std::int64_t gather_source_row(const gather_shape& g, std::int64_t row,
                                              std::int64_t resolved) {
  return row / g.index_count * g.axis_dim + resolved;
}

// ---- reductions --------------------------------------------------------------------

enum class reduce_op {
  sum,
  mean,
  max,
  min,
  prod,
  sum_square,
  l2, ///< sqrt of the sum of squares
};

const char* reduce_op_name(reduce_op op);

/// A reduction as [outer, reduced, inner] -> [outer, inner].
struct reduce_shape {
  std::int64_t outer = 1;
  std::int64_t reduced = 1;
  std::int64_t inner = 1;
};

/// The shape reducing `axes` (negative counts from the end; 0 axes reduce nothing,
/// i.e. reduced = 1) of a tensor of `rank` dims. The reduced axes, ignoring dims of
/// size 1, must be adjacent: [A, B, C] over {0, 2} with B > 1 is refused (transpose
/// first or reduce twice), as are repeated and out-of-range axes.
reduce_shape make_reduce_shape(int rank, const std::int64_t* dims, const int* axes,
                               int axis_count);

/// The accumulator before any element: 0, 1 for prod, -inf for max, +inf for min.
template <class Acc>
CAF_KERNELS_HD Acc reduce_identity(reduce_op op) {
  const Acc inf = static_cast<Acc>(INFINITY);
  switch (op) {
    case reduce_op::prod:
      return Acc(1);
    case reduce_op::max:
      return -inf;
    case reduce_op::min:
      return inf;
    default:
      return Acc(0);
  }
}

/// Combines two partial results (max and min propagate NaN, as numpy and ONNX do).
template <class Acc>
CAF_KERNELS_HD Acc reduce_merge(reduce_op op, Acc a, Acc b) {
  switch (op) {
    case reduce_op::prod:
      return a * b;
    case reduce_op::max:
      return (b > a || b != b) ? b : a;
    case reduce_op::min:
      return (b < a || b != b) ? b : a;
    default:
      return a + b;
  }
}

/// Adds one element to an accumulator (squared for sum_square and l2).
template <class Acc>
CAF_KERNELS_HD Acc reduce_step(reduce_op op, Acc acc, Acc x) {
  if (op == reduce_op::sum_square || op == reduce_op::l2)
    return acc + x * x;
  return reduce_merge(op, acc, x);
}

/// The output from the accumulated value over `count` elements.
template <class Acc>
CAF_KERNELS_HD Acc reduce_finish(reduce_op op, Acc acc, std::int64_t count) {
  if (op == reduce_op::mean)
    return acc / static_cast<Acc>(count);
  if (op == reduce_op::l2) {
    if constexpr (sizeof(Acc) == sizeof(float))
      return sqrtf(acc);
    else
      return sqrt(acc);
  }
  return acc;
}

} // namespace caf_serving::kernels
