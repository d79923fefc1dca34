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

TEST_CASE("Gelu-20 with the exact (erf) form becomes FusedGelu; the tanh form stays") {
  for (std::string approximate : {"none", "tanh"}) {
    graph g;
    int x = g.add_value("x", datatype::fp32, {2, 5}, true);
    int y = g.add_value("y", datatype::fp32, {2, 5}, true);
    g.inputs.push_back(x);
    g.outputs.push_back(y);
    auto& n = g.add_node("Gelu", "gelu", {x}, {y});
    if (approximate != "none")
      n.set_s("approximate", approximate);
    fuse_gelu(g);
    REQUIRE(g.nodes.size() == 1);
    CHECK(g.nodes[0].op == (approximate == "none" ? "FusedGelu" : "Gelu"));
    if (approximate != "none")
      continue;
    // FusedGelu against Gelu-20's definition, 0.5 x (1 + erf(x / sqrt(2))).
    std::vector<float> in{-3.0f, -1.0f, -0.5f, 0.0f, 0.25f, 0.5f, 1.0f, 2.0f, 3.0f, 10.0f};
    std::string bytes(reinterpret_cast<const char*>(in.data()), in.size() * sizeof(float));
    auto got = interpret(g, {bytes});
    REQUIRE(got.size() == 1);
    std::vector<float> want;
    for (float v : in) want.push_back(0.5f * v * (1.0f + std::erf(v / std::sqrt(2.0f))));
    CHECK(relative_error(got[0], want) < 1e-6);
  }
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
