/// Every fused operation against its unfused reference: the fixtures' graphs
/// run by the reference interpreter before and after the passes, and the
/// engine's kernels against the reference kernels on random shapes.

#include "onnx/passes.hpp"

#include "engine_kernels.hpp"
#include "onnx/importer.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/testing.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;
namespace fs = std::filesystem;

namespace {

const fs::path fixtures = CAF_SERVING_ONNX_FIXTURES;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The fixture's reference inputs (batch 2), in the graph's input order.
std::vector<std::string> reference_inputs(const std::string& model, const graph& g) {
  std::vector<std::string> out(g.inputs.size());
  std::istringstream lines(read_all(fixtures / "reference" / model / "manifest.txt"));
  std::string kind, name, type, dims, file;
  while (lines >> kind >> name >> type >> dims >> file)
    for (size_t i = 0; i < g.inputs.size(); ++i)
      if (kind == "input" && g.values[g.inputs[i]].name == name)
        out[i] = read_all(fixtures / "reference" / model / file);
  return out;
}

/// Runs an optimized/specialized graph with the reference kernels only.
std::vector<std::vector<float>> interpret(const graph& g, const std::vector<std::string>& inputs) {
  std::vector<std::vector<float>> outs;
  for (const auto& o : run_reference_graph(g, inputs))
    outs.push_back(as_floats(o));
  return outs;
}

int count_ops(const graph& g, const std::string& op) {
  int n = 0;
  for (const auto& nd : g.nodes)
    n += nd.op == op;
  return n;
}

/// Fused vs unfused on the fixture's inputs at batch 2 and at batch 1 (first row).
graph check_fusion(const std::string& model) {
  CAPTURE(model);
  auto g = import_model(fixtures / "models" / model / "1" / "model.onnx");
  REQUIRE_MESSAGE(g, g.error().message);
  auto inputs = reference_inputs(model, *g);
  graph last;
  for (int64_t batch : {2, 1}) {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<std::string> data;
    for (size_t i = 0; i < g->inputs.size(); ++i) {
      auto s = g->values[g->inputs[i]].shape;
      s[0] = batch;
      shapes.push_back(s);
      data.push_back(inputs[i].substr(0, inputs[i].size() / 2 * batch));
    }
    auto plain = specialize(*g, shapes);
    REQUIRE_MESSAGE(plain, plain.error().message);
    auto fused = optimize(*g, shapes);
    REQUIRE_MESSAGE(fused, fused.error().message);
    CHECK(fused->nodes.size() <= plain->nodes.size());
    auto a = interpret(*plain, data);
    auto b = interpret(*fused, data);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i)
      CHECK(relative_error(b[i], a[i]) < 1e-5);
    last = *fused;
  }
  return last;
}

} // namespace

TEST_CASE("LayerNorm: the decomposed pattern and LayerNormalization become FusedLayerNorm") {
  auto g13 = check_fusion("pattern_layernorm_opset13");
  CHECK(count_ops(g13, "FusedLayerNorm") == 1);
  CHECK(count_ops(g13, "ReduceMean") == 0);
  auto g17 = check_fusion("pattern_layernorm_opset17");
  CHECK(count_ops(g17, "FusedLayerNorm") == 1);
}

TEST_CASE("opset 18 and 21 patterns fuse: ReduceMean-18's axes input, a transformer block") {
  // The LayerNorm written out with ReduceMean-18, which takes its axes as an input.
  auto g18 = check_fusion("pattern_layernorm_opset18");
  CHECK(count_ops(g18, "FusedLayerNorm") == 1);
  CHECK(count_ops(g18, "ReduceMean") == 0);
  // tools/opset_fixtures.py's encoder block at opset 21: attention, both LayerNorms, GELU.
  auto g21 = check_fusion("opset21_transformer");
  CHECK(count_ops(g21, "FusedAttention") == 1);
  CHECK(count_ops(g21, "FusedLayerNorm") == 2);
  CHECK(count_ops(g21, "Softmax") == 0);
  CHECK(count_ops(g21, "Erf") == 0);
}

TEST_CASE("erf-GELU becomes FusedGelu") {
  auto g = check_fusion("pattern_gelu_opset13");
  CHECK(count_ops(g, "FusedGelu") == 1);
  CHECK(count_ops(g, "Erf") == 0);
}

TEST_CASE("BERT: attention, LayerNorm, GELU and MatMul epilogues fuse") {
  for (std::string m : {"bert_2layer_opset13", "bert_2layer_opset17"}) {
    auto g = check_fusion(m);
    CHECK(count_ops(g, "FusedAttention") == 2);
    CHECK(count_ops(g, "FusedLayerNorm") == 5);
    CHECK(count_ops(g, "Softmax") == 0);
    CHECK(count_ops(g, "Erf") == 0);
    CHECK(count_ops(g, "FusedMatMul") == 12);
  }
  auto d = check_fusion("distilbert_2layer_opset13");
  CHECK(count_ops(d, "FusedAttention") == 2);
}

TEST_CASE("torch's SDPA, as the dynamo exporter and TorchScript write it, becomes FusedAttention") {
  // tools/pattern_fixtures.py: Q and K each scaled by sqrt(scale), the dynamo
  // exporter's K^T through Reshape/Transpose/Reshape, Where(IsNaN(p), 0, p)
  // after the softmax; padding and causal masks. The references' second row is
  // masked throughout: TorchScript's -inf mask makes it NaN, which the guard
  // (and FusedAttention's nan_to_zero) turns into 0.
  for (std::string kind : {"padding", "causal"})
    for (std::string exporter : {"dynamo", "torchscript17"}) {
      auto g = check_fusion("pattern_attention_" + kind + "_" + exporter);
      CHECK(count_ops(g, "FusedAttention") == 1);
      CHECK(count_ops(g, "FusedLayerNorm") == 1);
      CHECK(count_ops(g, "Softmax") == 0);
      CHECK(count_ops(g, "IsNaN") == 0);
      CHECK(count_ops(g, "Transpose") == 0);
      for (const auto& n : g.nodes)
        if (n.op == "FusedAttention") {
          CHECK(n.get_i("num_heads", 0) == 4);
          CHECK(n.get_f("scale", 0) == doctest::Approx(1 / std::sqrt(8.0f)));
          CHECK(n.get_i("nan_to_zero", 0) == 1);
        }
    }
}

namespace {

/// The dynamo fixture's graph with `change` applied, optimized at batch 1 and
/// checked against the unfused graph on the reference inputs' first row.
graph near_miss(const std::function<void(graph&)>& change,
                const std::string& model = "pattern_attention_padding_dynamo") {
  auto g = import_model(fixtures / "models" / model / "1" / "model.onnx");
  REQUIRE_MESSAGE(g, g.error().message);
  change(*g);
  auto inputs = reference_inputs(model, *g);
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> data;
  for (size_t i = 0; i < g->inputs.size(); ++i) {
    auto s = g->values[g->inputs[i]].shape;
    s[0] = 1;
    shapes.push_back(s);
    data.push_back(inputs[i].substr(0, inputs[i].size() / 2));
  }
  auto plain = specialize(*g, shapes);
  REQUIRE_MESSAGE(plain, plain.error().message);
  auto fused = optimize(*g, shapes);
  REQUIRE_MESSAGE(fused, fused.error().message);
  auto a = interpret(*plain, data), b = interpret(*fused, data);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    CHECK(relative_error(b[i], a[i]) < 1e-5);
  return *fused;
}

/// The node that reads `v` as input `slot`, with operator `op`.
node* reader(graph& g, int v, const std::string& op, size_t slot) {
  for (auto& n : g.nodes)
    if (n.op == op && n.inputs.size() > slot && n.inputs[slot] == v)
      return &n;
  return nullptr;
}

} // namespace

TEST_CASE("near misses of the SDPA pattern stay unfused and correct") {
  // The unchanged graph fuses (so that each change below is what stops it).
  CHECK(count_ops(near_miss([](graph&) {}), "FusedAttention") == 1);
  SUBCASE("K scaled per key, not by a scalar: does not factor out of Q K^T") {
    auto g = near_miss([](graph& g) {
      for (auto& n : g.nodes)
        if (n.op == "Mul" && reader(g, n.outputs[0], "MatMul", 1)) {
          auto t = make_tensor(datatype::fp32, {8});
          for (int i = 0; i < 8; ++i) t->as_mut<float>()[i] = 0.25f + 0.1f * i;
          n.inputs[1] = g.add_constant("per_key_scale", t);
        }
    });
    CHECK(count_ops(g, "FusedAttention") == 0);
    CHECK(count_ops(g, "Softmax") == 1);
  }
  SUBCASE("a mask that broadcasts the scores to more rows than the batch") {
    auto g = near_miss([](graph& g) {
      for (auto& n : g.nodes)
        if (n.op == "Add" && reader(g, n.outputs[0], "Softmax", 0)) {
          auto t = make_tensor(datatype::fp32, {2, 1, 8, 8});
          for (int64_t i = 0; i < t->elements(); ++i) t->as_mut<float>()[i] = (i % 3) * -1.0f;
          n.inputs[1] = g.add_constant("wide_mask", t);
        }
    });
    CHECK(count_ops(g, "FusedAttention") == 0);
  }
  SUBCASE("the softmax's NaN replaced by 1, not 0") {
    auto g = near_miss([](graph& g) {
      for (auto& n : g.nodes)
        if (n.op == "Where" && n.inputs.size() == 3 && reader(g, n.outputs[0], "MatMul", 0)) {
          auto one = make_tensor(datatype::fp32, {});
          one->as_mut<float>()[0] = 1.0f;
          n.inputs[1] = g.add_constant("one", one);
        }
    });
    CHECK(count_ops(g, "FusedAttention") == 0);
  }
}

TEST_CASE("torchvision's ViT attention (nn.MultiheadAttention, packed in-projection) becomes "
          "FusedAttention") {
  // tools/pattern_fixtures.py's vit_block, TorchScript opset 17: attention in
  // [S, B, E] order, Q, K and V gathered from one packed projection.
  auto g = check_fusion("pattern_mha_vit_torchscript17");
  CHECK(count_ops(g, "FusedAttention") == 1);
  CHECK(count_ops(g, "FusedLayerNorm") == 2);
  for (std::string gone : {"Softmax", "MatMul", "Transpose", "Gather", "Squeeze", "Unsqueeze",
                           "Mul"})
    CHECK_MESSAGE(count_ops(g, gone) == 0, gone);
  for (const auto& n : g.nodes) {
    if (n.op == "FusedAttention") {
      CHECK(n.get_i("num_heads", 0) == 4);
      CHECK(n.get_f("scale", 0) == doctest::Approx(1 / std::sqrt(8.0f)));
      CHECK(g.values[n.inputs[0]].shape == std::vector<int64_t>{1, 8, 32});
    }
    // The in-projection's bias went into its matmul, on [B, S, E] rows.
    if (n.op == "FusedMatMul" && g.values[n.outputs[0]].shape.back() == 96)
      CHECK(n.inputs.size() > 2);
  }
}

namespace {

/// The Gathers of the packed Q, K and V projections, in the graph's order.
std::vector<node*> packed_gathers(graph& g) {
  auto prod = g.producers();
  std::vector<node*> out;
  for (auto& n : g.nodes)
    if (n.op == "Gather" && prod[n.inputs[0]] >= 0 && g.nodes[prod[n.inputs[0]]].op == "Squeeze")
      out.push_back(&n);
  return out;
}

} // namespace

TEST_CASE("near misses of the ViT attention pattern stay unfused and correct") {
  const std::string vit = "pattern_mha_vit_torchscript17";
  CHECK(count_ops(near_miss([](graph&) {}, vit), "FusedAttention") == 1);
  SUBCASE("Q and K gathered from each other's parts") {
    auto g = near_miss([](graph& g) {
      auto parts = packed_gathers(g);
      REQUIRE(parts.size() == 3);
      std::swap(parts[0]->inputs[1], parts[1]->inputs[1]);
    }, vit);
    CHECK(count_ops(g, "FusedAttention") == 0);
    CHECK(count_ops(g, "Softmax") == 1);
  }
  SUBCASE("the attention weights are an output of the graph too") {
    auto g = near_miss([](graph& g) {
      for (auto& n : g.nodes)
        if (n.op == "Softmax")
          g.outputs.push_back(n.outputs[0]);
    }, vit);
    CHECK(count_ops(g, "FusedAttention") == 0);
  }
  SUBCASE("an additive mask on the scores") {
    auto g = near_miss([](graph& g) {
      for (size_t i = 0; i < g.nodes.size(); ++i)
        if (g.nodes[i].op == "Softmax") {
          auto t = make_tensor(datatype::fp32, {8});
          for (int64_t j = 0; j < 8; ++j) t->as_mut<float>()[j] = j % 3 == 0 ? -2.0f : 0.0f;
          int mask = g.add_constant("mask", t);
          int scores = g.nodes[i].inputs[0];
          int masked = g.add_value("masked", datatype::fp32);
          g.nodes[i].inputs[0] = masked;
          g.nodes.insert(g.nodes.begin() + static_cast<long>(i),
                         node{"Add", "mask_add", {scores, mask}, {masked}, {}});
          break;
        }
    }, vit);
    CHECK(count_ops(g, "FusedAttention") == 0);
    CHECK(count_ops(g, "Softmax") == 1);
  }
}

namespace {

/// GELU's tanh approximation in double: the test's own model of it.
double gelu_tanh_double(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

/// -6 to 6 in 64 steps, where GELU's two forms differ most (|x| < 4).
std::vector<float> gelu_inputs() {
  std::vector<float> in;
  for (int i = 0; i < 64; ++i)
    in.push_back(-6.0f + 12.0f * static_cast<float>(i) / 63.0f);
  return in;
}

std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

} // namespace

TEST_CASE("Gelu-20 becomes FusedGelu (erf form) or FusedGeluTanh (tanh form)") {
  for (std::string approximate : {"none", "tanh"}) {
    CAPTURE(approximate);
    graph g;
    int x = g.add_value("x", datatype::fp32, {64}, true);
    int y = g.add_value("y", datatype::fp32, {64}, true);
    g.inputs.push_back(x);
    g.outputs.push_back(y);
    auto& n = g.add_node("Gelu", "gelu", {x}, {y});
    if (approximate != "none")
      n.set_s("approximate", approximate);
    fuse_gelu(g);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == (approximate == "none" ? "FusedGelu" : "FusedGeluTanh"));
    // The fused node against Gelu-20's definitions, computed in double here.
    auto in = gelu_inputs();
    auto got = interpret(g, {bytes_of(in)});
    REQUIRE(got.size() == 1);
    std::vector<float> want;
    for (float v : in)
      want.push_back(static_cast<float>(
        approximate == "none" ? 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))
                              : gelu_tanh_double(v)));
    CHECK(relative_error(got[0], want) < 1e-6);
  }
}

namespace {

/// A graph of element-wise nodes over one fp32 input x of [4, 16], written
/// node by node: the orderings of GELU's tanh form that exporters write.
struct chain {
  graph g;
  int x;
  int count = 0;

  chain() {
    x = g.add_value("x", datatype::fp32, {4, 16}, true);
    g.inputs.push_back(x);
    g.opset = 17;
  }
  int c(float v) {
    auto t = make_tensor(datatype::fp32, {});
    std::memcpy(t->bytes.data(), &v, sizeof v);
    return g.add_constant("c" + std::to_string(count++), t);
  }
  int op(const char* o, std::vector<int> ins) {
    std::string id = std::to_string(count++);
    int y = g.add_value("v" + id, datatype::fp32, {4, 16}, true);
    g.add_node(o, std::string(o) + id, std::move(ins), {y});
    return y;
  }
  int mul(int a, int b) { return op("Mul", {a, b}); }
  int add(int a, int b) { return op("Add", {a, b}); }
};

constexpr float sqrt_2_over_pi = 0.7978845608f;

/// torch.onnx.export of transformers' NewGELUActivation (GPT-2):
/// (x * 0.5) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))).
int gpt2_gelu(chain& ch, int x, float cubic = 0.044715f, float half = 0.5f) {
  int h = ch.mul(x, ch.c(half));
  int p = ch.op("Pow", {x, ch.c(3.0f)});
  int inner = ch.add(x, ch.mul(p, ch.c(cubic)));
  int t = ch.op("Tanh", {ch.mul(inner, ch.c(sqrt_2_over_pi))});
  return ch.mul(h, ch.add(t, ch.c(1.0f)));
}

/// Runs `ch` (outputs set) before and after fuse_gelu; checks the fused one
/// against the unfused one and against the formula in double; returns the
/// fused graph.
graph fused_and_checked(const chain& ch) {
  graph g = ch.g;
  fuse_gelu(g);
  auto in = gelu_inputs();
  auto before = interpret(ch.g, {bytes_of(in)});
  auto after = interpret(g, {bytes_of(in)});
  REQUIRE(before.size() == after.size());
  CHECK(relative_error(after[0], before[0]) < 1e-6);
  std::vector<float> want;
  for (float v : in)
    want.push_back(static_cast<float>(gelu_tanh_double(v)));
  if (count_ops(g, "FusedGeluTanh") == 1)
    CHECK(relative_error(after[0], want) < 1e-6);
  return g;
}

} // namespace

TEST_CASE("GELU's tanh form becomes FusedGeluTanh in every ordering exporters write") {
  SUBCASE("GPT-2 as torch exports it") {
    chain ch;
    ch.g.outputs.push_back(gpt2_gelu(ch, ch.x));
    auto g = fused_and_checked(ch);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == "FusedGeluTanh");
    CHECK(g.nodes[0].inputs == std::vector<int>{ch.x});
  }
  SUBCASE("x*x*x, constants first, and x * (1 + tanh) * 0.5") {
    chain ch;
    int cube = ch.mul(ch.mul(ch.x, ch.x), ch.x);
    int inner = ch.add(ch.mul(ch.c(0.044715f), cube), ch.x);
    int t = ch.op("Tanh", {ch.mul(ch.c(sqrt_2_over_pi), inner)});
    int m = ch.mul(ch.x, ch.add(ch.c(1.0f), t));
    ch.g.outputs.push_back(ch.mul(m, ch.c(0.5f)));
    auto g = fused_and_checked(ch);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == "FusedGeluTanh");
  }
  SUBCASE("x * (x*x), the scale as a Div, and x * (0.5 * (1 + tanh))") {
    chain ch;
    int cube = ch.mul(ch.x, ch.mul(ch.x, ch.x));
    int inner = ch.add(ch.x, ch.mul(cube, ch.c(0.044715f)));
    int t = ch.op("Tanh", {ch.op("Div", {inner, ch.c(1.0f / sqrt_2_over_pi)})});
    int half = ch.mul(ch.c(0.5f), ch.add(t, ch.c(1.0f)));
    ch.g.outputs.push_back(ch.mul(ch.x, half));
    auto g = fused_and_checked(ch);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == "FusedGeluTanh");
  }
  SUBCASE("transformers' FastGELU: x * sqrt(2/pi) * (1 + 0.044715 * x * x), 0.5 * x first") {
    chain ch;
    int poly = ch.add(ch.c(1.0f), ch.mul(ch.mul(ch.c(0.044715f), ch.x), ch.x));
    int t = ch.op("Tanh", {ch.mul(ch.mul(ch.x, ch.c(sqrt_2_over_pi)), poly)});
    ch.g.outputs.push_back(ch.mul(ch.mul(ch.c(0.5f), ch.x), ch.add(ch.c(1.0f), t)));
    auto g = fused_and_checked(ch);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == "FusedGeluTanh");
  }
  SUBCASE("constants written to fewer digits (0.7978846, 0.0447) still match") {
    chain ch;
    int h = ch.mul(ch.x, ch.c(0.5f));
    int inner = ch.add(ch.x, ch.mul(ch.op("Pow", {ch.x, ch.c(3.0f)}), ch.c(0.0447f)));
    int t = ch.op("Tanh", {ch.mul(inner, ch.c(0.7978846f))});
    ch.g.outputs.push_back(ch.mul(h, ch.add(t, ch.c(1.0f))));
    graph g = ch.g;
    fuse_gelu(g);
    CHECK(count_ops(g, "FusedGeluTanh") == 1);
  }
  SUBCASE("two GELUs in a row: the second reads the first's output") {
    chain ch;
    ch.g.outputs.push_back(gpt2_gelu(ch, gpt2_gelu(ch, ch.x)));
    graph g = ch.g;
    fuse_gelu(g);
    REQUIRE(g.nodes.size() == 2);
    CHECK(g.nodes[0].op == "FusedGeluTanh");
    CHECK(g.nodes[1].op == "FusedGeluTanh");
    CHECK(g.nodes[1].inputs[0] == g.nodes[0].outputs[0]);
  }
}

TEST_CASE("tanh chains that are not GELU's, or whose parts are read elsewhere, stay") {
  auto unfused = [](const chain& ch) {
    auto g = fused_and_checked(ch);
    CHECK(count_ops(g, "FusedGeluTanh") == 0);
    CHECK(count_ops(g, "Tanh") == 1);
    CHECK(g.nodes.size() == ch.g.nodes.size());
  };
  SUBCASE("another cubic coefficient (0.05, 0.045)") {
    for (float cubic : {0.05f, 0.045f}) {
      chain ch;
      ch.g.outputs.push_back(gpt2_gelu(ch, ch.x, cubic));
      unfused(ch);
    }
  }
  SUBCASE("another outer factor (0.6)") {
    chain ch;
    ch.g.outputs.push_back(gpt2_gelu(ch, ch.x, 0.044715f, 0.6f));
    unfused(ch);
  }
  SUBCASE("x^3 with a second reader") {
    chain ch;
    int out = gpt2_gelu(ch, ch.x);
    ch.g.outputs.push_back(out);
    for (const auto& n : ch.g.nodes)
      if (n.op == "Pow")
        ch.g.outputs.push_back(n.outputs[0]);
    unfused(ch);
  }
  SUBCASE("1 + tanh read by another node too") {
    chain ch;
    int out = gpt2_gelu(ch, ch.x);
    int one_plus = -1;
    for (const auto& n : ch.g.nodes)
      if (n.op == "Add" && n.inputs[1] != ch.x && n.inputs[0] != ch.x)
        one_plus = n.outputs[0];
    REQUIRE(one_plus >= 0);
    ch.g.outputs.push_back(ch.add(out, ch.mul(one_plus, ch.c(2.0f))));
    unfused(ch);
  }
  SUBCASE("two different values where GELU has x") {
    chain ch;
    int y = ch.op("Relu", {ch.x});
    int h = ch.mul(y, ch.c(0.5f)); // 0.5 y, not 0.5 x
    int inner = ch.add(ch.x, ch.mul(ch.op("Pow", {ch.x, ch.c(3.0f)}), ch.c(0.044715f)));
    int t = ch.op("Tanh", {ch.mul(inner, ch.c(sqrt_2_over_pi))});
    ch.g.outputs.push_back(ch.mul(h, ch.add(t, ch.c(1.0f))));
    auto g = fused_and_checked(ch);
    CHECK(count_ops(g, "FusedGeluTanh") == 0);
  }
}

TEST_CASE("GPT-2's MLP: Gemm, Reshape, tanh GELU become one FusedGemm with activation GeluTanh") {
  // transformers' Conv1D exports as Gemm over [B*S, K], then a Reshape to [B, S, N].
  std::mt19937 rng(11);
  const int64_t rows = 6, k = 8, n = 16;
  graph g;
  g.opset = 17;
  int a = g.add_value("a", datatype::fp32, {rows, k}, true);
  g.inputs.push_back(a);
  auto w = random_floats(k * n, rng), bias = random_floats(n, rng);
  auto wt = make_tensor(datatype::fp32, {k, n});
  std::memcpy(wt->bytes.data(), w.data(), w.size() * sizeof(float));
  auto bt = make_tensor(datatype::fp32, {n});
  std::memcpy(bt->bytes.data(), bias.data(), bias.size() * sizeof(float));
  auto st = make_tensor(datatype::int64, {3});
  std::vector<int64_t> to{2, rows / 2, n};
  std::memcpy(st->bytes.data(), to.data(), to.size() * sizeof(int64_t));
  int gemm = g.add_value("gemm", datatype::fp32);
  g.add_node("Gemm", "gemm", {a, g.add_constant("w", wt), g.add_constant("b", bt)}, {gemm});
  int shaped = g.add_value("shaped", datatype::fp32);
  g.add_node("Reshape", "reshape", {gemm, g.add_constant("shape", st)}, {shaped});
  chain ch;
  ch.g = g;
  ch.x = shaped;
  int y = gpt2_gelu(ch, shaped);
  ch.g.outputs.push_back(y);
  auto fused = optimize(ch.g, {{rows, k}});
  REQUIRE_MESSAGE(fused, fused.error().message);
  CHECK(count_ops(*fused, "Tanh") == 0);
  CHECK(count_ops(*fused, "FusedGeluTanh") == 0);
  REQUIRE(count_ops(*fused, "FusedGemm") == 1);
  for (const auto& nd : fused->nodes)
    if (nd.op == "FusedGemm")
      CHECK(nd.get_s("activation", "") == "GeluTanh");
  REQUIRE(fused->nodes.back().op == "Reshape");
  CHECK(fused->values[fused->outputs[0]].shape == std::vector<int64_t>{2, rows / 2, n});
  // Against the product and the formula in double.
  auto in = random_floats(rows * k, rng, 2.0f);
  auto got = interpret(*fused, {bytes_of(in)});
  REQUIRE(got.size() == 1);
  std::vector<float> want;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = bias[c];
      for (int64_t i = 0; i < k; ++i)
        acc += double(in[r * k + i]) * w[i * n + c];
      want.push_back(static_cast<float>(gelu_tanh_double(acc)));
    }
  CHECK(relative_error(got[0], want) < 1e-5);
}

TEST_CASE("Transpose pairs: cancelled, composed, or kept where the middle is read elsewhere") {
  // x [2, 3, 4, 5] -> Transpose(first) -> Transpose(second) -> Relu; the
  // second reader of the middle value, where asked for, is a graph output.
  struct pair_case {
    std::vector<int64_t> first, second;
    bool middle_read_elsewhere;
    int transposes_left;
  };
  for (const auto& c : std::vector<pair_case>{{{0, 2, 1, 3}, {0, 2, 1, 3}, false, 0},
                                              {{0, 2, 1, 3}, {0, 1, 3, 2}, false, 1},
                                              {{3, 2, 1, 0}, {}, false, 0}, // default perm
                                              {{0, 2, 1, 3}, {0, 2, 1, 3}, true, 2}}) {
    CAPTURE(c.transposes_left);
    graph g;
    g.opset = 17;
    int x = g.add_value("x", datatype::fp32, {2, 3, 4, 5}, true);
    g.inputs.push_back(x);
    int mid = g.add_value("mid", datatype::fp32);
    g.add_node("Transpose", "t1", {x}, {mid}).set_ints("perm", c.first);
    int y = g.add_value("y", datatype::fp32);
    auto& t2 = g.add_node("Transpose", "t2", {mid}, {y});
    if (!c.second.empty())
      t2.set_ints("perm", c.second);
    int out = g.add_value("out", datatype::fp32);
    g.add_node("Relu", "relu", {y}, {out});
    g.outputs.push_back(out);
    if (c.middle_read_elsewhere)
      g.outputs.push_back(mid);
    auto plain = specialize(g, {{2, 3, 4, 5}});
    REQUIRE_MESSAGE(plain, plain.error().message);
    graph fused = *plain;
    cancel_transposes(fused);
    CHECK(count_ops(fused, "Transpose") == c.transposes_left);
    CHECK(fused.values[fused.outputs[0]].shape == plain->values[plain->outputs[0]].shape);
    std::vector<float> in(120);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = static_cast<float>(i) - 60.0f;
    auto a = interpret(*plain, {bytes_of(in)});
    auto b = interpret(fused, {bytes_of(in)});
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i)
      CHECK(a[i] == b[i]);
  }
}

TEST_CASE("a Reshape to its own shape between two Transposes goes, and the pair cancels") {
  // GPT-2's attention output after the decoder rewrite: Transpose, Reshape to
  // the same [B, N, S, hd], Transpose back.
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {2, 3, 4, 5}, true);
  g.inputs.push_back(x);
  int t1 = g.add_value("t1", datatype::fp32), r = g.add_value("r", datatype::fp32),
      t2 = g.add_value("t2", datatype::fp32), out = g.add_value("out", datatype::fp32);
  g.add_node("Transpose", "t1", {x}, {t1}).set_ints("perm", {0, 2, 1, 3});
  auto st = make_tensor(datatype::int64, {4});
  std::vector<int64_t> same{2, 4, 3, 5};
  std::memcpy(st->bytes.data(), same.data(), same.size() * sizeof(int64_t));
  g.add_node("Reshape", "same_shape", {t1, g.add_constant("shape", st)}, {r});
  g.add_node("Transpose", "t2", {r}, {t2}).set_ints("perm", {0, 2, 1, 3});
  g.add_node("Relu", "relu", {t2}, {out});
  g.outputs.push_back(out);
  auto plain = specialize(g, {{2, 3, 4, 5}});
  REQUIRE_MESSAGE(plain, plain.error().message);
  graph fused = *plain;
  cancel_transposes(fused);
  REQUIRE(fused.nodes.size() == 1);
  CHECK(fused.nodes[0].op == "Relu");
  CHECK(fused.nodes[0].inputs[0] == x);
  std::vector<float> in(120);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<float>(i % 7) - 3.0f;
  CHECK(interpret(fused, {bytes_of(in)}) == interpret(*plain, {bytes_of(in)}));
}

TEST_CASE("ResNet: BatchNorm folds into Conv, bias/ReLU/residual into FusedConv") {
  for (std::string m : {"resnet_narrow_opset13", "resnet_narrow_opset17",
                        "resnet_bottleneck_opset17"}) {
    auto g = check_fusion(m);
    CHECK(count_ops(g, "Relu") == 0);
    CHECK(count_ops(g, "Add") == 0);
  }
}

TEST_CASE("engine kernels match the reference kernels on several shapes") {
  std::mt19937 rng(7);
  for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {7, 33}, {64, 768}}) {
    CAPTURE(rows);
    CAPTURE(width);
    auto x = random_floats(rows * width, rng, 3.0f);
    auto gm = random_floats(width, rng), bt = random_floats(width, rng);
    std::vector<float> want(x.size()), got(x.size());
    node n{"FusedLayerNorm", "ln", {0, 1, 2}, {3}, {}};
    n.set_f("epsilon", 1e-5f);
    run_reference(n, {{datatype::fp32, {rows, width}, x.data()}, {datatype::fp32, {width}, gm.data()},
                      {datatype::fp32, {width}, bt.data()}},
                  {{datatype::fp32, {rows, width}, want.data()}});
    kernels::cpu::layer_norm_args a;
    a.x = x.data(); a.gamma = gm.data(); a.beta = bt.data(); a.y = got.data();
    a.rows = rows; a.width = width; a.threads = 2;
    kernels::cpu::engine_layer_norm(a);
    CHECK(relative_error(got, want) < 1e-5);

    node gl{"FusedGelu", "gelu", {0, 1}, {2}, {}};
    run_reference(gl, {{datatype::fp32, {rows, width}, x.data()}, {datatype::fp32, {width}, bt.data()}},
                  {{datatype::fp32, {rows, width}, want.data()}});
    kernels::cpu::engine_gelu(x.data(), bt.data(), width, rows * width, got.data(), 2);
    CHECK(relative_error(got, want) < 1e-6);

    node gt{"FusedGeluTanh", "gelu_tanh", {0, 1}, {2}, {}};
    run_reference(gt, {{datatype::fp32, {rows, width}, x.data()}, {datatype::fp32, {width}, bt.data()}},
                  {{datatype::fp32, {rows, width}, want.data()}});
    kernels::cpu::engine_gelu_tanh(x.data(), bt.data(), width, rows * width, got.data(), 2);
    CHECK(relative_error(got, want) < 1e-6);
  }
  for (auto [b, s, h, d] : std::vector<std::array<int64_t, 4>>{{1, 4, 1, 8}, {2, 16, 4, 16},
                                                                {3, 37, 2, 64}}) {
    CAPTURE(s);
    int64_t hd = h * d;
    auto q = random_floats(b * s * hd, rng), k = random_floats(b * s * hd, rng),
         v = random_floats(b * s * hd, rng);
    std::vector<float> mask(b * s, 0.0f);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = s - i; j < s; ++j) mask[i * s + j] = -1e9f;
    std::vector<float> want(q.size()), got(q.size());
    node n{"FusedAttention", "attn", {0, 1, 2, 3}, {4}, {}};
    n.set_i("num_heads", h);
    n.set_f("scale", 0.125f);
    std::vector<int64_t> qs{b, s, hd};
    run_reference(n, {{datatype::fp32, qs, q.data()}, {datatype::fp32, qs, k.data()},
                      {datatype::fp32, qs, v.data()}, {datatype::fp32, {b, 1, 1, s}, mask.data()}},
                  {{datatype::fp32, qs, want.data()}});
    kernels::cpu::attention_args a;
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.mask = mask.data(); a.out = got.data();
    a.mask_strides[0] = s; a.mask_strides[3] = 1;
    a.batch = b; a.seq = s; a.heads = h; a.head_dim = d; a.scale = 0.125f; a.threads = 2;
    kernels::cpu::engine_attention(a);
    CHECK(relative_error(got, want) < 1e-5);
  }
}

TEST_CASE("engine_gelu_tanh against the formula in double: every tail width, both tails of x") {
  // Widths 1 to 40 take every masked (AVX-512) and scalar (AVX2) tail; x from
  // -12 to 12 reaches exp's clamp (below about -10) and tanh's saturation.
  for (int64_t width = 1; width <= 40; ++width) {
    CAPTURE(width);
    const int64_t rows = 3;
    std::vector<float> x(rows * width), bias(width), got(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = -12.0f + 24.0f * static_cast<float>(i) / static_cast<float>(x.size());
    for (int64_t i = 0; i < width; ++i)
      bias[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
    for (bool with_bias : {false, true}) {
      kernels::cpu::engine_gelu_tanh(x.data(), with_bias ? bias.data() : nullptr, width,
                                     rows * width, got.data(), 1);
      for (size_t i = 0; i < x.size(); ++i) {
        double v = double(x[i]) + (with_bias ? bias[i % width] : 0.0);
        double want = gelu_tanh_double(static_cast<float>(v));
        // About 2e-6 relative from exp's argument, a float of up to 88 (1e-7
        // of it); GELU's tail below -3 is under 4e-3 and counts absolutely.
        CHECK(std::fabs(got[i] - want) <= 4e-6 * std::fabs(want) + 1e-7);
      }
    }
  }
}

TEST_CASE("memory plan: a chain reuses buffers and never overlaps live values") {
  graph g;
  int x = g.add_value("x", datatype::fp32, {1024}, true);
  g.inputs.push_back(x);
  int prev = x;
  std::vector<int> vals;
  for (int i = 0; i < 6; ++i) {
    int y = g.add_value("y" + std::to_string(i), datatype::fp32, {1024}, true);
    g.add_node("Relu", "r" + std::to_string(i), {prev}, {y});
    vals.push_back(y);
    prev = y;
  }
  g.outputs.push_back(prev);
  memory_plan_config cfg;
  cfg.external = [&](int v) { return v == x || v == prev; };
  auto plan = plan_memory(g, cfg);
  CHECK(plan.unshared_bytes == 5 * 4096);
  CHECK(plan.arena_bytes == 2 * 4096); // a node's input and output are live together
  for (size_t i = 0; i + 1 < 5; ++i)
    CHECK(plan.offsets[vals[i]] != plan.offsets[vals[i + 1]]);
  CHECK(plan.offsets[prev] == -1);
}

TEST_CASE("the importer names the operator, node and opset it cannot run") {
  CHECK(std::is_sorted(supported_operators().begin(), supported_operators().end()));
  auto bad = import_model_bytes("garbage", "x.onnx");
  REQUIRE(!bad);
  CHECK(bad.error().message.find("not a valid ONNX file") != std::string::npos);
  auto missing = import_model(fixtures / "no_such_file.onnx");
  REQUIRE(!missing);
  CHECK(missing.error().message.find("cannot open") != std::string::npos);
}
