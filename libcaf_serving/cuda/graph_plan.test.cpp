#include "cuda/graph_plan.hpp"

#include <doctest/doctest.h>

using namespace caf_serving;
using namespace caf_serving::cuda;

namespace {

/// x -> Relu -> a (output "a") -> Neg -> b (output "b"): two graph outputs.
onnx::graph two_outputs() {
  onnx::graph g;
  int x = g.add_value("x", datatype::fp32, {-1, 16}, true);
  int a = g.add_value("a", datatype::fp32);
  int b = g.add_value("b", datatype::fp32);
  g.add_node("Relu", "relu", {x}, {a});
  g.add_node("Neg", "neg", {a}, {b});
  g.inputs = {x};
  g.outputs = {a, b};
  return g;
}

model_config config_declaring(std::vector<std::string> outputs) {
  model_config c;
  c.name = "m";
  c.max_batch_size = 8;
  c.inputs = {{"x", datatype::fp32, {16}}};
  for (auto& o : outputs)
    c.outputs.push_back({o, datatype::fp32, {16}});
  return c;
}

int value_named(const onnx::graph& g, const std::string& name) {
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].name == name)
      return static_cast<int>(v);
  return -1;
}

} // namespace

TEST_CASE("an output the config does not declare lives in the arena") {
  auto g = two_outputs();
  // Only "b" declared: "a" must get arena bytes (the old plan marked every
  // graph output external, and the pointer table gave "a" no address).
  auto cfg = config_declaring({"b"});
  auto p = plan_graph({&g, &cfg, {}, 4, 256});
  REQUIRE_MESSAGE(p, (p ? "" : p.error().message));
  int a = value_named(p->g, "a"), b = value_named(p->g, "b"), x = value_named(p->g, "x");
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  CHECK(p->memory.offsets[a] >= 0);
  CHECK(p->memory.offsets[b] == -1); // in the I/O slot
  CHECK(p->memory.offsets[x] == -1);
  CHECK(p->memory.arena_bytes >= size_t{4 * 16 * 4});
  CHECK(p->g.values[a].shape == std::vector<int64_t>{4, 16});
}

TEST_CASE("declared outputs and inputs stay outside the arena") {
  auto g = two_outputs();
  auto cfg = config_declaring({"a", "b"});
  auto p = plan_graph({&g, &cfg, {}, 2, 256});
  REQUIRE(p);
  for (const char* name : {"x", "a", "b"})
    CHECK(p->memory.offsets[value_named(p->g, name)] == -1);
  auto io = io_values(p->g, cfg);
  CHECK(io[value_named(p->g, "a")]);
  auto only_a = config_declaring({"a"});
  auto io_a = io_values(p->g, only_a);
  CHECK(io_a[value_named(p->g, "a")]);
  CHECK_FALSE(io_a[value_named(p->g, "b")]);
}

TEST_CASE("input shapes carry the batch only when the model batches") {
  auto cfg = config_declaring({"b"});
  CHECK(input_shapes_at(cfg, 5) == std::vector<std::vector<int64_t>>{{5, 16}});
  cfg.max_batch_size = 0;
  CHECK(input_shapes_at(cfg, 5) == std::vector<std::vector<int64_t>>{{16}});
}
