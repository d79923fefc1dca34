/// store_in_half (storage_plan.hpp): which values a CUDA plan stores in fp16 or
/// bf16, the edge conversions it adds, the weights' half copies; and the same
/// through plan_graph (the memory plan's arena shrinks). No device needed.

#include "cuda/graph_plan.hpp"
#include "cuda/storage_plan.hpp"
#include "core/half.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

onnx::constant_ptr fp32_constant(std::vector<float> v, std::vector<int64_t> shape) {
  auto t = std::make_shared<onnx::tensor_data>();
  t->dtype = datatype::fp32;
  t->shape = std::move(shape);
  t->bytes.resize(v.size() * sizeof(float));
  std::memcpy(t->bytes.data(), v.data(), t->bytes.size());
  return t;
}

/// x [2, 4] fp32, ids [2] int64 -> MatMul(x, w) -> h -> Relu -> y (declared),
/// Cast(ids, FLOAT) -> f, Add(h, f) -> z (a graph output the config does not declare).
struct sample {
  onnx::graph g;
  int x, ids, w, h, y, f, z;
};

sample make_sample() {
  sample s;
  auto& g = s.g;
  s.x = g.add_value("x", datatype::fp32, {2, 4}, true);
  s.ids = g.add_value("ids", datatype::int64, {2, 1}, true);
  s.w = g.add_constant("w", fp32_constant({1.f, 0.1f, -2.5f, 65504.f, 1e-8f, 3.f, 0.f, 1.f},
                                          {4, 2}));
  s.h = g.add_value("h", datatype::fp32, {2, 2}, true);
  s.y = g.add_value("y", datatype::fp32, {2, 2}, true);
  s.f = g.add_value("f", datatype::fp32, {2, 1}, true);
  s.z = g.add_value("z", datatype::fp32, {2, 2}, true);
  g.add_node("MatMul", "mm", {s.x, s.w}, {s.h});
  g.add_node("Relu", "relu", {s.h}, {s.y});
  g.add_node("Cast", "cast", {s.ids}, {s.f}).set_i("to", 1);
  g.add_node("Add", "add", {s.h, s.f}, {s.z});
  g.inputs = {s.x, s.ids};
  g.outputs = {s.y, s.z};
  return s;
}

size_t count_op(const onnx::graph& g, const std::string& op) {
  size_t n = 0;
  for (const auto& node : g.nodes) n += node.op == op;
  return n;
}

} // namespace

TEST_CASE("fp16 storage: values between steps and weights in fp16, fp32 only at the edges") {
  auto s = make_sample();
  auto narrowed = store_in_half(s.g, {datatype::fp16, [&](int v) { return v == s.y; }, nullptr});
  const auto& g = s.g;
  REQUIRE(narrowed.size() == g.values.size());
  // The wire types stay: x and y are fp32 in their I/O slots, ids int64.
  CHECK(g.values[s.x].dtype == datatype::fp32);
  CHECK(g.values[s.y].dtype == datatype::fp32);
  CHECK(g.values[s.ids].dtype == datatype::int64);
  CHECK_FALSE(narrowed[s.x]);
  CHECK_FALSE(narrowed[s.ids]);
  // Between steps, the undeclared output z too, and the Cast's output.
  for (int v : {s.h, s.f, s.z}) {
    CAPTURE(g.values[v].name);
    CHECK(g.values[v].dtype == datatype::fp16);
    CHECK(narrowed[v]);
  }
  CHECK(g.nodes[3].op == "Cast"); // after the input conversion, mm and relu
  CHECK(g.nodes[3].get_i("to", 0) == 10);
  // The weight, rounded to nearest even once.
  REQUIRE(g.values[s.w].constant);
  CHECK(g.values[s.w].dtype == datatype::fp16);
  CHECK(g.values[s.w].constant->dtype == datatype::fp16);
  CHECK(g.values[s.w].constant->bytes.size() == 8 * 2);
  const auto* wh = g.values[s.w].constant->as<uint16_t>();
  CHECK(wh[0] == fp16_from_float(1.f));
  CHECK(wh[1] == fp16_from_float(0.1f));
  CHECK(fp16_to_float(wh[3]) == 65504.f);
  CHECK(wh[4] == 0); // 1e-8 is below fp16's smallest subnormal
  // One conversion per fp32 input (first) and per declared fp32 output (last).
  CHECK(count_op(g, storage_cast_op) == 2);
  const auto& in = g.nodes.front();
  CHECK(in.op == storage_cast_op);
  CHECK(in.inputs == std::vector<int>{s.x});
  CHECK(g.values[in.outputs[0]].dtype == datatype::fp16);
  CHECK(g.nodes[1].inputs[0] == in.outputs[0]); // the MatMul reads the converted x
  const auto& out = g.nodes.back();
  CHECK(out.op == storage_cast_op);
  CHECK(out.outputs == std::vector<int>{s.y});
  CHECK(g.values[out.inputs[0]].dtype == datatype::fp16);
  CHECK(g.nodes[2].outputs[0] == out.inputs[0]); // Relu writes the half copy of y
  // Every node sees one float type besides the conversions' fp32 ends.
  for (size_t i = 1; i + 1 < g.nodes.size(); ++i)
    for (const auto* vs : {&g.nodes[i].inputs, &g.nodes[i].outputs})
      for (int v : *vs) CHECK(g.values[v].dtype != datatype::fp32);
}

TEST_CASE("bf16 storage rounds the weights to bf16; the cache converts each weight once") {
  auto a = make_sample();
  auto b = make_sample();
  b.g.values[b.w].constant = a.g.values[a.w].constant; // one weight shared by two plans
  half_constants cache;
  auto declared = [](int) { return true; };
  store_in_half(a.g, {datatype::bf16, declared, &cache});
  store_in_half(b.g, {datatype::bf16, declared, &cache});
  CHECK(cache.copies.size() == 1);
  CHECK(a.g.values[a.w].constant == b.g.values[b.w].constant);
  CHECK(a.g.values[a.w].constant->as<uint16_t>()[1] == bf16_from_float(0.1f));
  CHECK(a.g.values[a.f].dtype == datatype::bf16);
  // z is declared here: converted back too.
  CHECK(count_op(a.g, storage_cast_op) == 3);
}

TEST_CASE("weights past the half range saturate; infinities and NaN stay what they are") {
  // A mask written as (1 - m) * finfo(float32).min must stay finite: 0 * -inf is NaN.
  const float lowest = std::numeric_limits<float>::lowest();
  const float inf = std::numeric_limits<float>::infinity();
  auto w = fp32_constant({lowest, -lowest, 1e5f, -inf, std::nanf(""), 1.5f}, {6});
  auto h = half_copy(*w, datatype::fp16);
  const auto* f = h->as<uint16_t>();
  CHECK(fp16_to_float(f[0]) == -65504.0f);
  CHECK(fp16_to_float(f[1]) == 65504.0f);
  CHECK(fp16_to_float(f[2]) == 65504.0f);
  CHECK(fp16_to_float(f[3]) == -inf);
  CHECK(std::isnan(fp16_to_float(f[4])));
  CHECK(fp16_to_float(f[5]) == 1.5f);
  CHECK(0.0f * fp16_to_float(f[0]) == 0.0f);
  auto b = half_copy(*w, datatype::bf16);
  const auto* g = b->as<uint16_t>();
  CHECK(std::isfinite(bf16_to_float(g[0])));
  CHECK(bf16_to_float(g[0]) < -3.3e38f);
  CHECK(std::isfinite(bf16_to_float(g[1])));
  CHECK(bf16_to_float(g[3]) == -inf);
  CHECK(std::isnan(bf16_to_float(g[4])));
}

TEST_CASE("plan_graph at fp16 halves the arena and keeps the I/O values fp32") {
  onnx::graph g;
  int x = g.add_value("x", datatype::fp32, {-1, 64}, true);
  int a = g.add_value("a", datatype::fp32);
  int b = g.add_value("b", datatype::fp32);
  int y = g.add_value("y", datatype::fp32);
  g.add_node("Relu", "relu", {x}, {a});
  g.add_node("Neg", "neg", {a}, {b});
  g.add_node("Sigmoid", "sig", {b}, {y});
  g.inputs = {x};
  g.outputs = {y};
  model_config c;
  c.name = "m";
  c.max_batch_size = 8;
  c.inputs = {{"x", datatype::fp32, {64}}};
  c.outputs = {{"y", datatype::fp32, {64}}};
  auto full = plan_graph({&g, &c, {}, 8, 256});
  auto half = plan_graph({&g, &c, {}, 8, 256, datatype::fp16, nullptr});
  REQUIRE(full);
  REQUIRE(half);
  CHECK(full->narrowed.empty());
  CHECK(half->storage == datatype::fp16);
  CHECK(half->memory.arena_bytes > 0);
  CHECK(half->memory.arena_bytes * 2 <= full->memory.arena_bytes + 256);
  CHECK(half->memory.arena_bytes < full->memory.arena_bytes);
  for (size_t v = 0; v < half->g.values.size(); ++v) {
    CAPTURE(half->g.values[v].name);
    if (half->memory.offsets[v] >= 0) CHECK(half->g.values[v].dtype == datatype::fp16);
    else if (!half->g.values[v].constant) CHECK(half->g.values[v].dtype == datatype::fp32);
  }
}

namespace {

/// x [2, 4] -> Relu -> r; FusedMatMul(r, W [4, 3], bias [3]) -> y (declared);
/// the bias also feeds Add(t, bias) -> z (declared), where FusedGemm(r, W2) -> t.
struct gemm_sample {
  onnx::graph g;
  int x, r, w, bias, y, w2, t, z;
};

gemm_sample make_gemm_sample() {
  gemm_sample s;
  auto& g = s.g;
  s.x = g.add_value("x", datatype::fp32, {2, 4}, true);
  s.r = g.add_value("r", datatype::fp32, {2, 4}, true);
  s.w = g.add_constant("w", fp32_constant(std::vector<float>(12, 0.5f), {4, 3}));
  s.bias = g.add_constant("bias", fp32_constant({0.1f, 0.2f, 0.3f}, {3}));
  s.y = g.add_value("y", datatype::fp32, {2, 3}, true);
  s.w2 = g.add_constant("w2", fp32_constant(std::vector<float>(12, 0.25f), {4, 3}));
  s.t = g.add_value("t", datatype::fp32, {2, 3}, true);
  s.z = g.add_value("z", datatype::fp32, {2, 3}, true);
  g.add_node("Relu", "relu", {s.x}, {s.r});
  g.add_node("FusedMatMul", "head", {s.r, s.w, s.bias}, {s.y});
  g.add_node("FusedGemm", "gemm", {s.r, s.w2}, {s.t});
  g.add_node("Add", "add", {s.t, s.bias}, {s.z});
  g.inputs = {s.x};
  g.outputs = {s.y, s.z};
  return s;
}

} // namespace

TEST_CASE("a GEMM writes its declared fp32 output itself: no StorageCast, no half copy") {
  for (auto half : {datatype::fp16, datatype::bf16}) {
    CAPTURE(to_string(half));
    auto s = make_gemm_sample();
    auto declared = [&](int v) { return v == s.y || v == s.z; };
    CHECK(writes_fp32_output(s.g, s.g.nodes[1]));
    CHECK(writes_fp32_output(s.g, s.g.nodes[2]));
    CHECK_FALSE(writes_fp32_output(s.g, s.g.nodes[3])); // Add: not a GEMM
    auto narrowed = store_in_half(s.g, {half, declared, nullptr});
    const auto& g = s.g;
    REQUIRE(narrowed.size() == g.values.size());
    // x's conversion first; z (an Add's) converted last; y none.
    CHECK(count_op(g, storage_cast_op) == 2);
    CHECK(g.nodes.back().outputs == std::vector<int>{s.z});
    const auto& head = g.nodes[2];
    REQUIRE(head.name == "head");
    CHECK(head.outputs == std::vector<int>{s.y});
    CHECK(g.values[s.y].dtype == datatype::fp32);
    CHECK_FALSE(narrowed[s.y]);
    CHECK(g.values[head.inputs[0]].dtype == half);
    CHECK(g.values[head.inputs[1]].dtype == half);
    // The bias D's epilogue adds: an fp32 value of its own holding the original
    // tensor; the Add still reads the shared bias in the half type.
    const int wide_bias = head.inputs[2];
    CHECK(wide_bias != s.bias);
    CHECK(g.values[wide_bias].dtype == datatype::fp32);
    CHECK(g.values[wide_bias].constant->dtype == datatype::fp32);
    CHECK(g.values[wide_bias].constant->as<float>()[1] == 0.2f);
    CHECK_FALSE(narrowed[wide_bias]);
    CHECK(g.values[s.bias].dtype == half);
    CHECK(g.nodes[4].inputs[1] == s.bias);
    // t is read by the Add: the FusedGemm writes it in the half type.
    CHECK(g.values[s.t].dtype == half);
    CHECK(narrowed[s.t]);
  }
}

TEST_CASE("a declared output keeps its StorageCast when its GEMM cannot write fp32") {
  SUBCASE("a computed bias (it would have to be fp32 too)") {
    auto s = make_gemm_sample();
    s.g.nodes[1].inputs[2] = s.r; // shape aside: what matters is that it is no constant
    CHECK_FALSE(writes_fp32_output(s.g, s.g.nodes[1]));
  }
  SUBCASE("weights that are no constant") {
    auto s = make_gemm_sample();
    s.g.nodes[1].inputs[1] = s.r;
    CHECK_FALSE(writes_fp32_output(s.g, s.g.nodes[1]));
  }
  SUBCASE("the output is read inside the graph") {
    auto s = make_gemm_sample();
    s.g.nodes[3].inputs[0] = s.y; // the Add reads y, which must be half for it
    store_in_half(s.g, {datatype::fp16, [&](int v) { return v == s.y || v == s.z; }, nullptr});
    CHECK(count_op(s.g, storage_cast_op) == 3);
    for (const auto& n : s.g.nodes)
      if (n.name == "head") CHECK(s.g.values[n.outputs[0]].dtype == datatype::fp16);
  }
  SUBCASE("an output the config does not declare is narrowed") {
    auto s = make_gemm_sample();
    store_in_half(s.g, {datatype::fp16, [&](int v) { return v == s.z; }, nullptr});
    CHECK(s.g.values[s.y].dtype == datatype::fp16);
    CHECK(count_op(s.g, storage_cast_op) == 2);
  }
}
