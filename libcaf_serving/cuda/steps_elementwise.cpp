/// The element-wise device steps: the binary operators with broadcasting (Add Sub
/// Mul Div Pow Max Min, the comparisons, And Or Xor), the unary math and
/// activations (Neg Abs Sqrt ... Gelu HardSwish Clip, Not), Where and Cast, over
/// the launchers of kernels/cuda/elementwise.hpp (docs/cuda-elementwise-kernels.md).
///
/// The ONNX types map onto the kernels' (fp32 fp16 bf16 int64 int32 int8 uint8
/// bool); a node whose types the kernel does not define for its operator (fp64,
/// Relu on integers, Pow with an exponent of another type), whose shapes are not
/// all known or do not broadcast, or whose output has more than 6 dims stays a
/// host step. Those checks come before `b.dry()`, so a dry run chooses exactly as
/// a real build does. The broadcast layout is made once from the bucket's fixed
/// shapes and captured in the launch: nothing is allocated per batch.
///
/// steps_core.cpp's epilogue step comes first for fp32 Relu and same-shape fp32
/// Add; these steps take the rest.

#include "cuda/steps.hpp"

#include "cpu/half.hpp"
#include "cuda/elementwise.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace caf_serving::cuda {

namespace {

namespace k = caf_serving::kernels;

/// The kernels' type of an ONNX value type; nothing for one they do not have.
std::optional<k::dtype> kernel_type(datatype t) {
  switch (t) {
    case datatype::fp32: return k::dtype::f32;
    case datatype::fp16: return k::dtype::f16;
    case datatype::bf16: return k::dtype::bf16;
    case datatype::int64: return k::dtype::i64;
    case datatype::int32: return k::dtype::i32;
    case datatype::int8: return k::dtype::i8;
    case datatype::uint8: return k::dtype::u8;
    case datatype::bool_: return k::dtype::boolean;
    default: return std::nullopt;
  }
}

/// The kernels' type of value `v`, when it is present, its shape is fully known
/// and the kernels have its type.
std::optional<k::dtype> known_type(const step_builder& b, int v) {
  if (v < 0) return std::nullopt;
  const auto& val = b.g.values[v];
  if (!val.shape_known) return std::nullopt;
  for (auto d : val.shape)
    if (d < 0) return std::nullopt;
  return kernel_type(val.dtype);
}

/// The broadcast layout of `inputs` onto `out`, or nothing when they do not
/// broadcast or the output has more dims than the kernels take.
template <int N>
std::optional<k::broadcast_layout<N>> layout_of(const step_builder& b, int out,
                                                const std::array<int, N>& inputs) {
  std::array<dims_t, N> shapes;
  for (int i = 0; i < N; ++i) shapes[i] = b.shape(inputs[i]);
  try {
    auto l = k::make_broadcast_layout<N>(b.shape(out), shapes);
    k::require_valid_layout(l, "element-wise step");
    return l;
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

std::optional<k::binary_op> binary_op_of(const std::string& op) {
  static const std::pair<const char*, k::binary_op> names[] = {
    {"Add", k::binary_op::add},
    {"Sub", k::binary_op::sub},
    {"Mul", k::binary_op::mul},
    {"Div", k::binary_op::div},
    {"Pow", k::binary_op::pow},
    {"Max", k::binary_op::max},
    {"Min", k::binary_op::min},
    {"And", k::binary_op::logical_and},
    {"Or", k::binary_op::logical_or},
    {"Xor", k::binary_op::logical_xor},
    {"Equal", k::binary_op::equal},
    {"Less", k::binary_op::less},
    {"LessOrEqual", k::binary_op::less_or_equal},
    {"Greater", k::binary_op::greater},
    {"GreaterOrEqual", k::binary_op::greater_or_equal},
  };
  for (const auto& [name, op_] : names)
    if (op == name) return op_;
  return std::nullopt;
}

/// Two inputs of one type the operator has, broadcast onto the output.
std::optional<gpu_step> binary_step(step_builder& b, const onnx::node& n) {
  auto op = binary_op_of(n.op);
  const int x = step_builder::in(n, 0), w = step_builder::in(n, 1), y = step_builder::out(n, 0);
  if (!op || n.inputs.size() != 2 || n.outputs.size() != 1) return std::nullopt; // Max/Min of 1 or 3+
  auto tx = known_type(b, x), tw = known_type(b, w), ty = known_type(b, y);
  if (!tx || !tw || !ty || *tx != *tw || !k::binary_supported(*op, *tx)
      || *ty != k::binary_output_type(*op, *tx))
    return std::nullopt;
  auto layout = layout_of<2>(b, y, {x, w});
  if (!layout) return std::nullopt;
  if (b.dry()) return b.planned("binary");
  k::binary_args a;
  a.op = *op;
  a.type = *tx;
  a.layout = *layout;
  a.a = b.ptrs[x];
  a.b = b.ptrs[w];
  a.output = b.ptrs[y];
  bool empty = k::element_count(a.layout) == 0;
  return gpu_step{"binary", false, [a, empty](cudaStream_t s) {
    if (!empty) k::launch_binary(a, s);
  }};
}

std::optional<k::unary_op> unary_op_of(const onnx::node& n) {
  static const std::pair<const char*, k::unary_op> names[] = {
    {"Neg", k::unary_op::neg},
    {"Abs", k::unary_op::abs},
    {"Sqrt", k::unary_op::sqrt},
    {"Reciprocal", k::unary_op::reciprocal},
    {"Exp", k::unary_op::exp},
    {"Log", k::unary_op::log},
    {"Erf", k::unary_op::erf},
    {"Tanh", k::unary_op::tanh},
    {"Sigmoid", k::unary_op::sigmoid},
    {"Relu", k::unary_op::relu},
    {"LeakyRelu", k::unary_op::leaky_relu},
    {"Elu", k::unary_op::elu},
    {"HardSigmoid", k::unary_op::hard_sigmoid},
    {"HardSwish", k::unary_op::hard_swish},
    {"Softplus", k::unary_op::softplus},
    {"Clip", k::unary_op::clip},
    {"Floor", k::unary_op::floor},
    {"Ceil", k::unary_op::ceil},
    {"Round", k::unary_op::round},
    {"Sin", k::unary_op::sin},
    {"Cos", k::unary_op::cos},
    {"Not", k::unary_op::logical_not},
  };
  if (n.op == "Gelu") {
    auto approximate = n.get_s("approximate", "none");
    if (approximate == "none") return k::unary_op::gelu_erf;
    if (approximate == "tanh") return k::unary_op::gelu_tanh;
    return std::nullopt;
  }
  for (const auto& [name, op] : names)
    if (n.op == name) return op;
  return std::nullopt;
}

/// A Clip bound: the attribute (opset < 11), the constant input (11 on), or
/// `absent` without either; nothing for a runtime bound or one that is not a
/// floating-point scalar.
std::optional<float> clip_bound(const step_builder& b, const onnx::node& n, size_t input,
                                const char* attribute, float absent) {
  int v = step_builder::in(n, input);
  if (v < 0) return n.get_f(attribute, absent);
  const auto& val = b.g.values[v];
  if (!val.constant || val.constant->elements() != 1) return std::nullopt;
  if (val.dtype == datatype::fp32) return val.constant->as<float>()[0];
  if (val.dtype == datatype::fp16) return k::to_float(val.constant->as<k::fp16_bits>()[0]);
  if (val.dtype == datatype::bf16) return k::to_float(val.constant->as<k::bf16_bits>()[0]);
  return std::nullopt;
}

/// The unary operator's attributes as the kernel's parameters; nothing for a
/// Clip whose bounds are not floating-point constants.
std::optional<k::unary_params> unary_params_of(const step_builder& b, const onnx::node& n,
                                               k::unary_op op) {
  auto p = k::default_params(op);
  if (op == k::unary_op::leaky_relu || op == k::unary_op::elu || op == k::unary_op::hard_sigmoid)
    p.alpha = n.get_f("alpha", p.alpha);
  if (op == k::unary_op::hard_sigmoid) p.beta = n.get_f("beta", p.beta);
  if (op == k::unary_op::clip) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    auto lo = clip_bound(b, n, 1, "min", -inf), hi = clip_bound(b, n, 2, "max", inf);
    if (!lo || !hi) return std::nullopt;
    p.lo = *lo;
    p.hi = *hi;
  }
  return p;
}

/// One input and an output of the same type and shape.
std::optional<gpu_step> unary_step(step_builder& b, const onnx::node& n) {
  auto op = unary_op_of(n);
  const int x = step_builder::in(n, 0), y = step_builder::out(n, 0);
  if (!op || n.outputs.size() != 1) return std::nullopt;
  auto tx = known_type(b, x), ty = known_type(b, y);
  if (!tx || !ty || *tx != *ty || !k::unary_supported(*op, *tx) || b.shape(x) != b.shape(y))
    return std::nullopt;
  auto params = unary_params_of(b, n, *op);
  if (!params) return std::nullopt;
  if (b.dry()) return b.planned("unary");
  k::unary_args a;
  a.op = *op;
  a.type = *tx;
  a.params = *params;
  a.input = b.ptrs[x];
  a.output = b.ptrs[y];
  a.count = static_cast<size_t>(onnx::element_count(b.shape(y)));
  return gpu_step{"unary", false, [a](cudaStream_t s) {
    if (a.count > 0) k::launch_unary(a, s);
  }};
}

/// A boolean condition choosing between two inputs of the output's type.
std::optional<gpu_step> where_step(step_builder& b, const onnx::node& n) {
  const int c = step_builder::in(n, 0), x = step_builder::in(n, 1), w = step_builder::in(n, 2),
            y = step_builder::out(n, 0);
  auto tc = known_type(b, c), tx = known_type(b, x), tw = known_type(b, w), ty = known_type(b, y);
  if (!tc || !tx || !tw || !ty || *tc != k::dtype::boolean || *tx != *ty || *tw != *ty)
    return std::nullopt;
  auto layout = layout_of<3>(b, y, {c, x, w});
  if (!layout) return std::nullopt;
  if (b.dry()) return b.planned("where");
  k::where_args a;
  a.type = *ty;
  a.layout = *layout;
  a.condition = b.ptrs[c];
  a.x = b.ptrs[x];
  a.y = b.ptrs[w];
  a.output = b.ptrs[y];
  bool empty = k::element_count(a.layout) == 0;
  return gpu_step{"where", false, [a, empty](cudaStream_t s) {
    if (!empty) k::launch_where(a, s);
  }};
}

/// A conversion between two of the kernels' types (the same type: a copy);
/// CastLike's second input gives only the type.
std::optional<gpu_step> cast_step(step_builder& b, const onnx::node& n) {
  const int x = step_builder::in(n, 0), y = step_builder::out(n, 0);
  auto tx = known_type(b, x), ty = known_type(b, y);
  if (!tx || !ty || b.shape(x) != b.shape(y)) return std::nullopt;
  if (b.dry()) return b.planned("cast");
  k::cast_args a;
  a.from = *tx;
  a.to = *ty;
  a.input = b.ptrs[x];
  a.output = b.ptrs[y];
  a.count = static_cast<size_t>(onnx::element_count(b.shape(y)));
  return gpu_step{"cast", false, [a](cudaStream_t s) {
    if (a.count > 0) k::launch_cast(a, s);
  }};
}

} // namespace

/// Every element-wise operator the operator registry has (an operator it lacks,
/// such as Xor today, joins once it does: until then the importer refuses it).
std::vector<device_kernel> elementwise_steps() {
  std::vector<device_kernel> steps;
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "And", "Or", "Xor",
                         "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
    if (onnx::find_operator(op)) steps.push_back({op, {}, "binary", any_type(binary_step)});
  for (const char* op : {"Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Tanh",
                         "Sigmoid", "Relu", "LeakyRelu", "Elu", "HardSigmoid", "HardSwish",
                         "Softplus", "Clip", "Floor", "Ceil", "Round", "Sin", "Cos", "Not", "Gelu"})
    if (onnx::find_operator(op)) steps.push_back({op, {}, "unary", any_type(unary_step)});
  steps.push_back({"Where", {}, "where", any_type(where_step)});
  steps.push_back({"Cast", {}, "cast", any_type(cast_step)});
  steps.push_back({"CastLike", {}, "cast", any_type(cast_step)});
  return steps;
}

} // namespace caf_serving::cuda
