/// Element-wise ONNX operators on the device: binary arithmetic, logic and
/// comparisons with NumPy/ONNX broadcasting, unary math and activations, Where, and
/// Cast between every pair of f32 f16 bf16 i64 i32 i8 u8 bool.
///
///   binary_args a;
///   a.op = binary_op::add;
///   a.type = dtype::f16;
///   a.layout = make_broadcast_layout<2>({8, 128, 768}, {{8, 128, 768}, {768}});
///   a.a = x; a.b = bias; a.output = y;
///   launch_binary(a, stream);
///
/// Floating-point types are stored as f32, f16 or bf16 and computed in f32, rounded
/// once to nearest even on the way out. The operators, their edge cases (integer
/// division by zero gives 0, overflow wraps, float Max/Min propagate NaN, Cast
/// saturates float -> integer) and the broadcast layout are defined in
/// `cpu/elementwise_math.hpp`, which the kernels and their CPU references
/// (`cpu/reference_elementwise.hpp`) share.
///
/// Each launcher collapses the layout (adjacent dims contiguous in every operand
/// merge, size-1 dims go) and takes a vectorised path -- 8 elements per thread and
/// step, loaded and stored as 8- to 64-byte vectors -- when every operand is then
/// either contiguous or a single element and the buffers are aligned; otherwise a
/// strided path walks 8 consecutive outputs per thread, dividing the index once
/// (32-bit where every offset fits).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cpu/elementwise_math.hpp"
#include "cpu/types.hpp"

namespace caf_serving::kernels {

struct binary_args {
  binary_op op = binary_op::add;
  dtype type = dtype::f32;    ///< of `a` and `b`; the output is binary_output_type(op, type)
  broadcast_layout<2> layout; ///< output shape; element strides of a (0) and b (1)
  const void* a = nullptr;
  const void* b = nullptr;
  void* output = nullptr; ///< contiguous; may be `a` or `b` only if that has the output's layout
  int threads = 0;        ///< threads per block; 0 picks the default
};

/// Enqueues `output = op(a, b)` on `stream`. Throws `std::invalid_argument` for an
/// operator the type does not have or a bad layout, `cuda_error` if the launch fails.
void launch_binary(const binary_args& args, cudaStream_t stream);

struct unary_args {
  unary_op op = unary_op::identity;
  dtype type = dtype::f32; ///< of input and output
  unary_params params;     ///< alpha, beta, lo/hi where the operator has them
  const void* input = nullptr;
  void* output = nullptr; ///< `count` elements; may be `input`
  std::size_t count = 0;
  int threads = 0;
};

/// Enqueues `output = op(input)` on `stream`. Throws `std::invalid_argument` for an
/// operator the type does not have, `cuda_error` if the launch fails.
void launch_unary(const unary_args& args, cudaStream_t stream);

struct where_args {
  dtype type = dtype::f32;    ///< of x, y and the output (any type)
  broadcast_layout<3> layout; ///< strides of condition (0), x (1), y (2)
  const void* condition = nullptr; ///< bool: one byte per element, nonzero is true
  const void* x = nullptr;
  const void* y = nullptr;
  void* output = nullptr; ///< contiguous; may be x or y only if that has the output's layout
  int threads = 0;
};

/// Enqueues `output = condition ? x : y` on `stream`.
void launch_where(const where_args& args, cudaStream_t stream);

struct cast_args {
  dtype from = dtype::f32;
  dtype to = dtype::f16;
  const void* input = nullptr;
  void* output = nullptr; ///< `count` elements; must not overlap `input` unless from == to
  std::size_t count = 0;
  int threads = 0;
};

/// Enqueues the conversion on `stream`: float -> integer truncates toward zero
/// (saturating; NaN gives 0), anything -> bool is `x != 0`, integer -> integer keeps
/// the low bits, into f16/bf16 rounds to nearest even (integers through f32).
void launch_cast(const cast_args& args, cudaStream_t stream);

} // namespace caf_serving::kernels
