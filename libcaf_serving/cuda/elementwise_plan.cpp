#include "cuda/elementwise_plan.hpp"

#include "cpu/half.hpp"

#include <array>
#include <map>
#include <limits>
#include <stdexcept>
#include <utility>

namespace caf_serving::cuda {

namespace k = caf_serving::kernels;

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

namespace {

using dims_t = std::vector<int64_t>;

/// The kernels' type of value `v`, when it is present, its shape is fully known
/// and the kernels have its type.
std::optional<k::dtype> known_type(const onnx::graph& g, int v) {
  if (v < 0) return std::nullopt;
  const auto& val = g.values[v];
  if (!val.shape_known) return std::nullopt;
  for (auto d : val.shape)
    if (d < 0) return std::nullopt;
  return kernel_type(val.dtype);
}

int in(const onnx::node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }
int out(const onnx::node& n, size_t i) { return i < n.outputs.size() ? n.outputs[i] : -1; }

/// The broadcast layout of `inputs` onto `y`, or nothing when they do not
/// broadcast or the output has more dims than the kernels take.
template <int N>
std::optional<k::broadcast_layout<N>> layout_of(const onnx::graph& g, int y,
                                                const std::array<int, N>& inputs) {
  std::array<dims_t, N> shapes;
  for (int i = 0; i < N; ++i) shapes[i] = g.values[inputs[i]].shape;
  try {
    auto l = k::make_broadcast_layout<N>(g.values[y].shape, shapes);
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
std::optional<float> clip_bound(const onnx::graph& g, const onnx::node& n, size_t input,
                                const char* attribute, float absent) {
  int v = in(n, input);
  if (v < 0) return n.get_f(attribute, absent);
  const auto& val = g.values[v];
  if (!val.constant || val.constant->elements() != 1) return std::nullopt;
  if (val.dtype == datatype::fp32) return val.constant->as<float>()[0];
  if (val.dtype == datatype::fp16) return k::to_float(val.constant->as<k::fp16_bits>()[0]);
  if (val.dtype == datatype::bf16) return k::to_float(val.constant->as<k::bf16_bits>()[0]);
  return std::nullopt;
}

/// The unary operator's attributes as the kernel's parameters; nothing for a
/// Clip whose bounds are not floating-point constants.
std::optional<k::unary_params> unary_params_of(const onnx::graph& g, const onnx::node& n,
                                               k::unary_op op) {
  auto p = k::default_params(op);
  if (op == k::unary_op::leaky_relu || op == k::unary_op::elu || op == k::unary_op::hard_sigmoid)
    p.alpha = n.get_f("alpha", p.alpha);
  if (op == k::unary_op::hard_sigmoid) p.beta = n.get_f("beta", p.beta);
  if (op == k::unary_op::clip) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    auto lo = clip_bound(g, n, 1, "min", -inf), hi = clip_bound(g, n, 2, "max", inf);
    if (!lo || !hi) return std::nullopt;
    p.lo = *lo;
    p.hi = *hi;
  }
  return p;
}

/// Two inputs of one type the operator has, broadcast onto the output.
std::optional<elementwise_plan> plan_binary(const onnx::graph& g, const onnx::node& n,
                                            k::binary_op op) {
  const int x = in(n, 0), w = in(n, 1), y = out(n, 0);
  if (n.inputs.size() != 2 || n.outputs.size() != 1) return std::nullopt; // Max/Min of 1 or 3+
  auto tx = known_type(g, x), tw = known_type(g, w), ty = known_type(g, y);
  if (!tx || !tw || !ty || *tx != *tw || !k::binary_supported(op, *tx)
      || *ty != k::binary_output_type(op, *tx))
    return std::nullopt;
  auto layout = layout_of<2>(g, y, {x, w});
  if (!layout) return std::nullopt;
  elementwise_plan p;
  p.kernel = "binary";
  p.binary = op;
  p.type = *tx;
  p.binary_layout = *layout;
  p.inputs = {x, w};
  return p;
}

/// One input and an output of the same type and shape.
std::optional<elementwise_plan> plan_unary(const onnx::graph& g, const onnx::node& n,
                                           k::unary_op op) {
  const int x = in(n, 0), y = out(n, 0);
  if (n.outputs.size() != 1) return std::nullopt;
  auto tx = known_type(g, x), ty = known_type(g, y);
  if (!tx || !ty || *tx != *ty || !k::unary_supported(op, *tx)
      || g.values[x].shape != g.values[y].shape)
    return std::nullopt;
  auto params = unary_params_of(g, n, op);
  if (!params) return std::nullopt;
  elementwise_plan p;
  p.kernel = "unary";
  p.unary = op;
  p.type = *tx;
  p.params = *params;
  p.inputs = {x};
  return p;
}

/// A boolean condition choosing between two inputs of the output's type.
std::optional<elementwise_plan> plan_where(const onnx::graph& g, const onnx::node& n) {
  const int c = in(n, 0), x = in(n, 1), w = in(n, 2), y = out(n, 0);
  auto tc = known_type(g, c), tx = known_type(g, x), tw = known_type(g, w), ty = known_type(g, y);
  if (!tc || !tx || !tw || !ty || *tc != k::dtype::boolean || *tx != *ty || *tw != *ty)
    return std::nullopt;
  auto layout = layout_of<3>(g, y, {c, x, w});
  if (!layout) return std::nullopt;
  elementwise_plan p;
  p.kernel = "where";
  p.type = *ty;
  p.where_layout = *layout;
  p.inputs = {c, x, w};
  return p;
}

/// A conversion between two of the kernels' types (the same type: a copy);
/// CastLike's second input gives only the type. A Cast to FLOAT16 or BFLOAT16
/// inside the graph has an fp32 output holding the values rounded to the half's
/// precision (onnx/ops_elementwise.cpp's run_cast): two casts, through the half type.
std::optional<elementwise_plan> plan_cast(const onnx::graph& g, const onnx::node& n) {
  const int x = in(n, 0), y = out(n, 0);
  auto tx = known_type(g, x), ty = known_type(g, y);
  if (!tx || !ty || g.values[x].shape != g.values[y].shape) return std::nullopt;
  elementwise_plan p;
  const int64_t to = n.op == "Cast" ? n.get_i("to", 1) : 1;
  if (*ty == k::dtype::f32 && (to == 10 || to == 16)) {
    p.via = to == 10 ? k::dtype::f16 : k::dtype::bf16;
    auto count = static_cast<size_t>(onnx::element_count(g.values[y].shape));
    if (count > max_cast_scratch_bytes / k::dtype_size(*p.via)) return std::nullopt;
  }
  p.kernel = "cast";
  p.type = *tx;
  p.to = *ty;
  p.inputs = {x};
  return p;
}

} // namespace

std::optional<elementwise_plan> plan_elementwise(const onnx::graph& g, const onnx::node& n) {
  // The operators with planners of their own; the binary and unary ones share one.
  using planner = std::optional<elementwise_plan> (*)(const onnx::graph&, const onnx::node&);
  static const std::map<std::string, planner> own{
    {"Cast", &plan_cast}, {"CastLike", &plan_cast}, {"Where", &plan_where}};
  std::optional<elementwise_plan> p;
  auto planned = own.find(n.op);
  if (auto op = binary_op_of(n.op))
    p = plan_binary(g, n, *op);
  else if (planned != own.end())
    p = planned->second(g, n);
  else if (auto uop = unary_op_of(n))
    p = plan_unary(g, n, *uop);
  if (!p) return std::nullopt;
  p->output = out(n, 0);
  p->count = static_cast<size_t>(onnx::element_count(g.values[p->output].shape));
  return p;
}

} // namespace caf_serving::cuda
