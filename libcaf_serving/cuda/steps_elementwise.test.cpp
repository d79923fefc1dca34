/// Which element-wise nodes become device steps (steps_elementwise.cpp), as dry
/// runs of the step selection: no device needed. The numerics run on a GPU in
/// tests/gpu/cuda_backend.test.cpp against ONNX Runtime.

#include "cuda/dry_run_testing.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <string>

using namespace caf_serving;
using namespace caf_serving::cuda;
namespace fs = std::filesystem;

namespace {

const fs::path fixtures = CAF_SERVING_ONNX_FIXTURES;

long steps_of(const std::string& name, const std::string& kernel) {
  return cuda::testing::steps_of(fixtures, name, kernel);
}

using cuda::testing::chosen;

/// A one-node graph of `op` over inputs of `types`/`shapes` to an output of `out`/`out_shape`.
std::string node_of(const std::string& op, std::vector<datatype> types,
                    std::vector<std::vector<int64_t>> shapes, datatype out,
                    std::vector<int64_t> out_shape) {
  return chosen([&](onnx::graph& g) {
    std::vector<int> ins;
    for (size_t i = 0; i < types.size(); ++i)
      ins.push_back(g.add_value("x" + std::to_string(i), types[i], shapes[i], true));
    int y = g.add_value("y", out, out_shape, true);
    g.add_node(op, "n", ins, {y});
  });
}

int scalar_f32(onnx::graph& g, const std::string& name, float v) {
  auto t = onnx::make_tensor(datatype::fp32, {});
  t->as_mut<float>()[0] = v;
  return g.add_constant(name, t);
}

} // namespace

TEST_CASE("the element-wise fixtures run on the device at every bucket") {
  for (const char* name : {"op_abs", "op_ceil", "op_clip", "op_cos", "op_elu", "op_exp",
                           "op_floor", "op_hardsigmoid",
                           "op_hardswish", "op_leakyrelu", "op_log", "op_neg", "op_reciprocal",
                           "op_round", "op_sigmoid", "op_sin", "op_softplus", "op_tanh"}) {
    std::string fixture = name;
    CAPTURE(fixture);
    CHECK(steps_of(fixture, "unary") == 1);
  }
  // Gelu (erf) becomes FusedGelu and Gelu's tanh form FusedGeluTanh, the core epilogue's;
  // fp16 Gelu is a unary step.
  CHECK(steps_of("op_gelu", "epilogue") == 1);
  CHECK(steps_of("op_gelu_tanh", "epilogue") == 1);
  CHECK(node_of("Gelu", {datatype::fp16}, {{2, 3}}, datatype::fp16, {2, 3}) == "unary");
  CHECK(steps_of("op_min", "binary") == 1); // [B,3,4] with [B,1,4]
  CHECK(steps_of("op_max", "host:Max") == 1); // three inputs: the kernel takes two
}

TEST_CASE("binary operators take every type the kernel has, with broadcasting") {
  using dt = datatype;
  // Broadcast shapes; the fp32 same-shape Add is the core epilogue's.
  CHECK(node_of("Add", {dt::fp32, dt::fp32}, {{2, 3, 4}, {4}}, dt::fp32, {2, 3, 4}) == "binary");
  CHECK(node_of("Add", {dt::fp32, dt::fp32}, {{2, 3}, {2, 3}}, dt::fp32, {2, 3}) == "epilogue");
  CHECK(node_of("Add", {dt::fp16, dt::fp16}, {{2, 3}, {2, 3}}, dt::fp16, {2, 3}) == "binary");
  CHECK(node_of("Mul", {dt::bf16, dt::bf16}, {{2, 1, 4}, {3, 1}}, dt::bf16, {2, 3, 4}) == "binary");
  CHECK(node_of("Sub", {dt::int64, dt::int64}, {{}, {5}}, dt::int64, {5}) == "binary");
  CHECK(node_of("Div", {dt::int32, dt::int32}, {{5}, {5}}, dt::int32, {5}) == "binary");
  CHECK(node_of("Pow", {dt::fp32, dt::fp32}, {{2, 3}, {}}, dt::fp32, {2, 3}) == "binary");
  CHECK(node_of("Max", {dt::fp32, dt::fp32}, {{4}, {4}}, dt::fp32, {4}) == "binary");
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}) {
    CAPTURE(op);
    CHECK(node_of(op, {dt::int64, dt::int64}, {{1, 4}, {3, 1}}, dt::bool_, {3, 4}) == "binary");
  }
  CHECK(node_of("Equal", {dt::bool_, dt::bool_}, {{4}, {4}}, dt::bool_, {4}) == "binary");
  CHECK(node_of("And", {dt::bool_, dt::bool_}, {{1, 1, 4}, {2, 1, 1}}, dt::bool_, {2, 1, 4})
        == "binary");
  CHECK(node_of("Or", {dt::bool_, dt::bool_}, {{4}, {4}}, dt::bool_, {4}) == "binary");
}

TEST_CASE("binary nodes the kernel refuses stay host steps") {
  using dt = datatype;
  CHECK(node_of("Add", {dt::fp64, dt::fp64}, {{4}, {4}}, dt::fp64, {4}) == "host:Add");
  CHECK(node_of("Add", {dt::int8, dt::int8}, {{4}, {4}}, dt::int8, {4}) == "host:Add");
  CHECK(node_of("And", {dt::int32, dt::int32}, {{4}, {4}}, dt::int32, {4}) == "host:And");
  CHECK(node_of("Less", {dt::bool_, dt::bool_}, {{4}, {4}}, dt::bool_, {4}) == "host:Less");
  // Pow with an exponent of another type (opset 12 allows it).
  CHECK(node_of("Pow", {dt::fp32, dt::int64}, {{4}, {}}, dt::fp32, {4}) == "host:Pow");
  // Seven dims.
  CHECK(node_of("Mul", {dt::fp32, dt::fp32}, {{2, 2, 2, 2, 2, 2, 2}, {2}}, dt::fp32,
                {2, 2, 2, 2, 2, 2, 2})
        == "host:Mul");
  // A shape not yet known.
  CHECK(node_of("Mul", {dt::fp32, dt::fp32}, {{-1, 4}, {4}}, dt::fp32, {-1, 4}) == "host:Mul");
}

TEST_CASE("unary operators, Where and Cast") {
  using dt = datatype;
  CHECK(node_of("Tanh", {dt::fp16}, {{2, 3}}, dt::fp16, {2, 3}) == "unary");
  CHECK(node_of("HardSigmoid", {dt::bf16}, {{2, 3}}, dt::bf16, {2, 3}) == "unary");
  CHECK(node_of("Relu", {dt::fp32}, {{2, 3}}, dt::fp32, {2, 3}) == "epilogue");
  CHECK(node_of("Relu", {dt::fp16}, {{2, 3}}, dt::fp16, {2, 3}) == "unary");
  CHECK(node_of("Relu", {dt::int32}, {{2, 3}}, dt::int32, {2, 3}) == "host:Relu");
  CHECK(node_of("Abs", {dt::int64}, {{2}}, dt::int64, {2}) == "unary");
  CHECK(node_of("Sqrt", {dt::int64}, {{2}}, dt::int64, {2}) == "host:Sqrt");
  CHECK(node_of("Not", {dt::bool_}, {{2}}, dt::bool_, {2}) == "unary");
  CHECK(node_of("Exp", {dt::fp64}, {{2}}, dt::fp64, {2}) == "host:Exp");

  CHECK(node_of("Where", {dt::bool_, dt::fp32, dt::fp32}, {{1, 1, 4, 4}, {2, 3, 4, 4}, {}},
                dt::fp32, {2, 3, 4, 4})
        == "where");
  CHECK(node_of("Where", {dt::bool_, dt::int64, dt::int64}, {{4}, {4}, {4}}, dt::int64, {4})
        == "where");
  CHECK(node_of("Where", {dt::uint8, dt::fp32, dt::fp32}, {{4}, {4}, {4}}, dt::fp32, {4})
        == "host:Where");
  CHECK(node_of("Where", {dt::bool_, dt::fp64, dt::fp64}, {{4}, {4}, {4}}, dt::fp64, {4})
        == "host:Where");

  for (auto [from, to] : {std::pair{dt::int64, dt::fp32}, {dt::fp32, dt::fp16}, {dt::bool_, dt::fp32},
                          {dt::fp32, dt::bool_}, {dt::uint8, dt::bf16}, {dt::int32, dt::int8}}) {
    CAPTURE(static_cast<int>(from));
    CAPTURE(static_cast<int>(to));
    CHECK(node_of("Cast", {from}, {{2, 3}}, to, {2, 3}) == "cast");
  }
  CHECK(node_of("Cast", {dt::fp32}, {{2, 3}}, dt::fp64, {2, 3}) == "host:Cast");
  CHECK(node_of("Cast", {dt::int16}, {{2, 3}}, dt::fp32, {2, 3}) == "host:Cast");
  CHECK(steps_of("type_half_casts", "host:Cast") == 0);
}

TEST_CASE("Clip's bounds must be known at load") {
  auto clip = [](bool runtime_max) {
    return chosen([=](onnx::graph& g) {
      int x = g.add_value("x", datatype::fp32, {2, 3}, true);
      int lo = scalar_f32(g, "lo", 0.0f);
      int hi = runtime_max ? g.add_value("hi", datatype::fp32, {}, true) : scalar_f32(g, "hi", 6.0f);
      int y = g.add_value("y", datatype::fp32, {2, 3}, true);
      g.add_node("Clip", "c", {x, lo, hi}, {y});
    });
  };
  CHECK(clip(false) == "unary");
  CHECK(clip(true) == "host:Clip");
  // No bounds at all: the identity of Clip.
  CHECK(chosen([](onnx::graph& g) {
          int x = g.add_value("x", datatype::fp16, {4}, true);
          int y = g.add_value("y", datatype::fp16, {4}, true);
          g.add_node("Clip", "c", {x}, {y});
        })
        == "unary");
}
