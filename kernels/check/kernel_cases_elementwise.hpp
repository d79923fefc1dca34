/// The element-wise part of the kernel table (`check/kernel_cases.hpp`): what a
/// binary, unary, Where or Cast case computes and on which operand shapes.
///
/// An element-wise case takes its sizes from the table's `case_size` fields; its
/// `broadcast_pattern` says how they become the operands' ONNX shapes, one pattern
/// per broadcast the target models use (`pattern_shapes`).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/elementwise_math.hpp"

namespace caf_serving::kernels {

struct case_size;
struct kernel_case;

/// Operand shapes of an element-wise case, from `case_size` fields
/// b(atch) h(eads) s(eq) r(ows) c(ols) i(nner):
enum class broadcast_pattern {
  same,           ///< every operand [r, c]
  misaligned,     ///< [r, c], every buffer one element past a 16-byte boundary
  row_bias,       ///< [b, s, c] + [c]: a bias over the hidden size (BERT, ViT)
  attention_mask, ///< [b, h, s, s] + [b, 1, 1, s]: padding mask (Where: condition [b,1,1,s], y scalar)
  causal_mask,    ///< [b, h, s, s] + [s, s] (Where: condition [1, 1, s, s], y scalar; GPT-2)
  scalar_a,       ///< [] op [r, c]
  scalar_b,       ///< [r, c] op [] (Where: x [r, c], y [], condition [r, c])
  squeeze_excite, ///< [b, c, r, i] * [b, c, 1, 1] (EfficientNet, MobileNetV3)
  outer,          ///< [r, 1] op [1, c]: both operands broadcast
  rank6,          ///< [b, 1, h, 3, 1, c] op [1, 2, 1, 3, s, 1]: six dims, none merge
};

const char* pattern_name(broadcast_pattern p);

/// What an element-wise case computes (beyond `kernel_case::type`, and
/// `kernel_case::convert_to` for Cast).
struct elementwise_spec {
  binary_op binary = binary_op::add;   ///< binary only
  unary_op unary = unary_op::identity; ///< unary only
  unary_params params;                 ///< unary only
  broadcast_pattern pattern = broadcast_pattern::same;
  float lo = -4.0f; ///< range of random floating-point inputs (integers: see extremes)
  float hi = 4.0f;
  float quantum = 0;     ///< > 0: inputs are multiples of it (ties for Round, equal pairs)
  bool nonzero = false;  ///< the second operand (Div's divisor) is kept at |x| >= 1/4
  bool extremes = false; ///< integers: full-range values, 0, -1, MIN, MAX among them
};

/// The ONNX shapes of the operands (binary: a, b; Where: condition, x, y; unary and
/// Cast: one) and the output of a case at `size`.
struct pattern_shapes_result {
  std::vector<std::vector<std::int64_t>> operands;
  std::vector<std::int64_t> output;
};
pattern_shapes_result pattern_shapes(const kernel_case& c, const case_size& size);

/// Appends the element-wise cases to the table.
void add_elementwise_cases(std::vector<kernel_case>& table);

} // namespace caf_serving::kernels
