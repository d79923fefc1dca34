/// The one table of kernel checks.
///
/// Each entry is one operation or fused pattern with its datatypes, the sizes it is
/// checked at (including ragged ones that do not divide the kernels' tiles or vector
/// widths), the size it is benchmarked at, and a tolerance whose `why` says where
/// that tolerance comes from. The GPU test (`cuda/kernels.test.cpp`) runs every case
/// at every sweep size and launch configuration against the unfused CPU references;
/// the benchmarks (`bench/kernels_bench.cpp`) time the same cases at their bench sizes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "check/kernel_cases_elementwise.hpp"
#include "check/kernel_cases_data.hpp"
#include "cpu/types.hpp"

namespace caf_serving::kernels {

enum class op {
  epilogue,       ///< act(x + bias) + residual, or act(x + bias + residual)
  add_layer_norm, ///< LayerNorm(x + residual)
  softmax,        ///< row softmax with a mask
  attention,      ///< fused multi-head attention
  gather,         ///< requests -> batch buffer
  scatter,        ///< batch buffer -> requests
  convert,        ///< f32 <-> f16/bf16
  softmax_top_k,  ///< softmax then top-k per row
  binary,         ///< element-wise, broadcast (kernel_cases_elementwise.hpp)
  unary,          ///< element-wise
  where,          ///< element-wise select, broadcast
  cast,           ///< every pair of dtypes
  permute,        ///< Transpose (check/kernel_cases_data.hpp)
  strided_copy,   ///< Slice, Split, Concat, Expand, Pad as boxes
  gather_axis,    ///< ONNX Gather along an axis
  reduce,         ///< Reduce* over adjacent axes
};

const char* op_name(op o);

/// How a softmax case's additive or boolean mask lines up with its rows.
enum class softmax_mask_shape {
  rows,    ///< [2, cols]: row r reads mask row r % 2 (the second one masks everything)
  /// The rows are attention scores [batch, heads, seq] x cols keys, and the mask is
  /// read in place through strides (mask_strides in cpu/types.hpp):
  padding, ///< [batch, 1, 1, keys]; batch row 1 masks every key
  causal,  ///< [seq, keys]: -inf above the diagonal (rows past it fully masked when seq > keys)
  full,    ///< [batch, heads, seq, keys]
};

/// The additive mask of an attention case, read by the kernel in place through
/// strides (attention_mask in cuda/attention.hpp): values in [-2, 2] and -inf.
enum class attention_mask_shape {
  none,
  padding,        ///< [batch, 1, 1, seq], holes as well; batch row 1 masks every key
  causal,         ///< [seq, seq]: -inf above the diagonal
  /// [batch, 1, seq, seq], as GPT-2's graph writes it: causal and left padding,
  /// batch row 1 padded by 5 keys, so its first 5 query rows see no key
  padding_causal,
  per_head,       ///< [batch, heads, seq, seq]
};

/// Sizes of one run. Each op reads the fields it needs:
/// epilogue rows/cols/inner (cols = channels; inner = spatial size per channel, 1 for
/// a GEMM's [rows, cols] output); add_layer_norm, softmax rows/cols (with a broadcast
/// mask also batch/heads/seq, rows = batch * heads * seq); attention
/// batch/heads/seq; gather and scatter rows = requests, cols = largest request's
/// bytes; convert rows = elements; softmax_top_k rows/cols/k.
struct case_size {
  std::size_t rows = 1;
  std::size_t cols = 1;
  std::size_t inner = 1;
  std::size_t batch = 1;
  std::size_t heads = 1;
  std::size_t seq = 1;
  std::size_t k = 1;
  std::vector<std::int64_t> shape;  ///< N-d ops (check/kernel_cases_data.hpp)
  std::vector<std::int64_t> params; ///< N-d ops: what data_case says per op
};

case_size matrix(std::size_t rows, std::size_t cols);
case_size nchw(std::size_t n, std::size_t channels, std::size_t spatial);
case_size heads(std::size_t batch, std::size_t heads, std::size_t seq);
case_size top_k(std::size_t rows, std::size_t cols, std::size_t k);
/// Attention scores [batch, heads, queries, keys] as softmax rows x cols.
case_size scores(std::size_t batch, std::size_t heads, std::size_t queries, std::size_t keys);

/// |got - want| <= abs + rel * |want| for every element; NaN never passes.
struct tolerance {
  double abs = 0;
  double rel = 0;
};

struct kernel_case {
  std::string name;
  op operation = op::epilogue;
  dtype type = dtype::f32;           ///< for convert: the source type
  dtype convert_to = dtype::f32;     ///< convert and cast only
  activation act = activation::none; ///< epilogue only
  activation_params act_params;      ///< epilogue only: the activation's alpha, beta
  bool bias = false;                 ///< epilogue only
  bool residual = false;             ///< epilogue and add_layer_norm
  bool residual_first = false;       ///< epilogue: act(x + bias + residual) (FusedConv's)
  mask_kind mask = mask_kind::none;  ///< softmax only
  /// softmax with an additive mask: the mask's type, f32 or `type` (a mask stored
  /// in half like the scores: the CUDA backend's attention at precision fp16/bf16)
  dtype mask_type = dtype::f32;
  softmax_mask_shape mask_shape = softmax_mask_shape::rows; ///< softmax only
  int head_dim = 64;                 ///< attention only
  bool padded = false;               ///< attention: random per-sequence key lengths
  attention_mask_shape attention_mask = attention_mask_shape::none; ///< attention only
  /// attention: the mask's element type, f32 or the case's type; f32 with
  /// padding_causal writes torch's finfo(float32).min instead of -inf
  dtype attention_mask_type = dtype::f32;
  /// attention: Q, K, V and O laid out [batch, seq, heads, dim] (the executor's
  /// [B, S, H*D]) instead of [batch, heads, seq, dim]
  bool heads_interleaved = false;
  elementwise_spec elementwise;      ///< binary, unary, where only
  data_case data;                    ///< permute, strided_copy, gather_axis, reduce
  tolerance tol;
  std::string why; ///< why the tolerance is what it is
  std::vector<case_size> sweep;
  std::vector<case_size> bench; ///< sizes for the benchmarks; empty: not benchmarked
};

/// The table.
const std::vector<kernel_case>& kernel_cases();

} // namespace caf_serving::kernels
