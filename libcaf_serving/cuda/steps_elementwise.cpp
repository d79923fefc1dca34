/// The element-wise device steps: the binary operators with broadcasting (Add Sub
/// Mul Div Pow Max Min, the comparisons, And Or Xor), the unary math and
/// activations (Neg Abs Sqrt ... Gelu HardSwish Clip, Not), Where and Cast, over
/// the launchers of kernels/cuda/elementwise.hpp (docs/cuda-elementwise-kernels.md).
///
/// The ONNX types map onto the kernels' (fp32 fp16 bf16 int64 int32 int8 uint8
/// bool); a node whose types the kernel does not define for its operator (fp64,
/// Relu on integers, Pow with an exponent of another type), whose shapes are not
/// all known or do not broadcast, or whose output has more than 6 dims stays a
/// host step. The plan (elementwise_plan.hpp) is made before `b.dry()`, so a dry
/// run chooses exactly as a real build does; its broadcast layout comes from the
/// bucket's fixed shapes and is captured in the launch: nothing is allocated per
/// batch.
///
/// steps_core.cpp's epilogue step comes first for fp32 Relu, same-shape fp32 Add
/// and FusedGelu; these steps take the rest.

#include "cuda/steps.hpp"

#include "cuda/elementwise.hpp"
#include "cuda/elementwise_plan.hpp"

namespace caf_serving::cuda {

namespace {

namespace k = caf_serving::kernels;

static_assert(max_cast_scratch_bytes <= workspace_bytes,
              "a rounding Cast's half tensor must fit the workspace");

std::optional<gpu_step> elementwise_step(step_builder& b, const onnx::node& n) {
  auto p = plan_elementwise(b.g, n);
  if (!p) return std::nullopt;
  if (b.dry()) return b.planned(p->kernel);
  const bool empty = p->count == 0;
  void* y = b.ptrs[p->output];
  auto input = [&](size_t i) -> const void* { return b.ptrs[p->inputs[i]]; };
  if (p->kernel == "binary") {
    k::binary_args a;
    a.op = p->binary;
    a.type = p->type;
    a.layout = p->binary_layout;
    a.a = input(0);
    a.b = input(1);
    a.output = y;
    return gpu_step{"binary", false, [a, empty](cudaStream_t s) {
      if (!empty) k::launch_binary(a, s);
    }};
  }
  if (p->kernel == "unary") {
    k::unary_args a;
    a.op = p->unary;
    a.type = p->type;
    a.params = p->params;
    a.input = input(0);
    a.output = y;
    a.count = p->count;
    return gpu_step{"unary", false, [a, empty](cudaStream_t s) {
      if (!empty) k::launch_unary(a, s);
    }};
  }
  if (p->kernel == "where") {
    k::where_args a;
    a.type = p->type;
    a.layout = p->where_layout;
    a.condition = input(0);
    a.x = input(1);
    a.y = input(2);
    a.output = y;
    return gpu_step{"where", false, [a, empty](cudaStream_t s) {
      if (!empty) k::launch_where(a, s);
    }};
  }
  k::cast_args a;
  a.from = p->type;
  a.to = p->to;
  a.input = input(0);
  a.output = y;
  a.count = p->count;
  std::optional<k::cast_args> round;
  if (p->via) { // through the half type, in the workspace (planned to fit)
    round = a;
    a.to = *p->via;
    a.output = b.ctx->workspace;
    round->from = *p->via;
    round->input = b.ctx->workspace;
  }
  return gpu_step{"cast", false, [a, round, empty](cudaStream_t s) {
    if (empty) return;
    k::launch_cast(a, s);
    if (round) k::launch_cast(*round, s);
  }};
}

} // namespace

/// Every element-wise operator the operator registry has (an operator it lacks,
/// such as Xor today, joins once it does: until then the importer refuses it).
std::vector<device_kernel> elementwise_steps() {
  std::vector<device_kernel> steps;
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "And", "Or", "Xor",
                         "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
    if (onnx::find_operator(op)) steps.push_back({op, {}, "binary", any_type(elementwise_step)});
  for (const char* op : {"Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Tanh",
                         "Sigmoid", "Relu", "LeakyRelu", "Elu", "HardSigmoid", "HardSwish",
                         "Softplus", "Clip", "Floor", "Ceil", "Round", "Sin", "Cos", "Not", "Gelu"})
    if (onnx::find_operator(op)) steps.push_back({op, {}, "unary", any_type(elementwise_step)});
  steps.push_back({"Where", {}, "where", any_type(elementwise_step)});
  steps.push_back({"Cast", {}, "cast", any_type(elementwise_step)});
  steps.push_back({"CastLike", {}, "cast", any_type(elementwise_step)});
  return steps;
}

} // namespace caf_serving::cuda
