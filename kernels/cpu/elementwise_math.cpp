#include "cpu/elementwise_math.hpp"

namespace caf_serving::kernels {

const char* binary_op_name(binary_op op) {
  switch (op) {
    case binary_op::add:
      return "Add";
    case binary_op::sub:
      return "Sub";
    case binary_op::mul:
      return "Mul";
    case binary_op::div:
      return "Div";
    case binary_op::pow:
      return "Pow";
    case binary_op::max:
      return "Max";
    case binary_op::min:
      return "Min";
    case binary_op::logical_and:
      return "And";
    case binary_op::logical_or:
      return "Or";
    case binary_op::logical_xor:
      return "Xor";
    case binary_op::equal:
      return "Equal";
    case binary_op::less:
      return "Less";
    case binary_op::less_or_equal:
      return "LessOrEqual";
    case binary_op::greater:
      return "Greater";
    case binary_op::greater_or_equal:
      return "GreaterOrEqual";
  }
  return "?";
}

const char* unary_op_name(unary_op op) {
  switch (op) {
    case unary_op::neg:
      return "Neg";
    case unary_op::abs:
      return "Abs";
    case unary_op::sqrt:
      return "Sqrt";
    case unary_op::reciprocal:
      return "Reciprocal";
    case unary_op::exp:
      return "Exp";
    case unary_op::log:
      return "Log";
    case unary_op::erf:
      return "Erf";
    case unary_op::tanh:
      return "Tanh";
    case unary_op::sigmoid:
      return "Sigmoid";
    case unary_op::relu:
      return "Relu";
    case unary_op::leaky_relu:
      return "LeakyRelu";
    case unary_op::elu:
      return "Elu";
    case unary_op::gelu_erf:
      return "Gelu(erf)";
    case unary_op::gelu_tanh:
      return "Gelu(tanh)";
    case unary_op::silu:
      return "SiLU";
    case unary_op::hard_sigmoid:
      return "HardSigmoid";
    case unary_op::hard_swish:
      return "HardSwish";
    case unary_op::clip:
      return "Clip";
    case unary_op::softplus:
      return "Softplus";
    case unary_op::floor:
      return "Floor";
    case unary_op::ceil:
      return "Ceil";
    case unary_op::round:
      return "Round";
    case unary_op::sin:
      return "Sin";
    case unary_op::cos:
      return "Cos";
    case unary_op::logical_not:
      return "Not";
    case unary_op::identity:
      return "Identity";
  }
  return "?";
}

void require_binary_supported(binary_op op, dtype t) {
  if (binary_supported(op, t))
    return;
  std::string takes = is_logical(op) ? "bool operands (Cast them first)"
                      : op == binary_op::equal
                        ? "f32, f16, bf16, i64, i32 or bool operands"
                        : "f32, f16, bf16, i64 or i32 operands";
  throw std::invalid_argument(std::string("element-wise ") + binary_op_name(op)
                              + " is not defined on " + dtype_name(t) + "; it takes "
                              + takes);
}

void require_unary_supported(unary_op op, dtype t) {
  if (unary_supported(op, t))
    return;
  std::string takes = op == unary_op::logical_not ? "bool (Cast first)"
                      : op == unary_op::neg || op == unary_op::abs
                        ? "f32, f16, bf16, i64 or i32"
                        : "f32, f16 or bf16 (Cast integers first)";
  throw std::invalid_argument(std::string("element-wise ") + unary_op_name(op)
                              + " is not defined on " + dtype_name(t) + "; it takes "
                              + takes);
}

} // namespace caf_serving::kernels
