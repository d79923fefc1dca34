/// The com.microsoft operators of ops_contrib.cpp: how the importer accepts
/// and names them, what it refuses (unknown contrib operators, a missing
/// domain import, attribute values the engine does not implement), and the
/// reference kernels against the ONNX operators they fuse, computed by the
/// engine's own kernels. Their outputs against onnxruntime are checked by the
/// fixtures tools/contrib_fixtures.py writes (onnx.server.test).

#include "onnx/ops_contrib.hpp"

#include "core/external_memory.hpp"
#include "onnx/importer.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx/passes.hpp"
#include "onnx/testing.hpp"
#include "onnx_cpu/cpu_kernels.hpp"

#include "cpu_isa.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <random>
#include <string>
#include <variant>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

struct model_node {
  std::string domain = "com.microsoft";
  std::string op;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs{"Y"};
  std::map<std::string, int64_t> ints;
};

/// A model of one node whose inputs are FP32 graph inputs of shape [2, 3, 4]
/// (INT32 [2] for a name starting with "mask"), importing com.microsoft
/// version `ms_version` (0: not at all).
std::string one_node_model(const model_node& mn, int64_t ms_version = 1) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  if (ms_version) {
    auto* o = m.add_opset_import();
    o->set_domain("com.microsoft");
    o->set_version(ms_version);
  }
  auto* g = m.mutable_graph();
  for (const auto& i : mn.inputs) {
    if (i.empty())
      continue;
    auto* in = g->add_input();
    in->set_name(i);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    bool mask = i.rfind("mask", 0) == 0;
    tt->set_elem_type(mask ? ::onnx::TensorProto::INT32 : ::onnx::TensorProto::FLOAT);
    for (int64_t d : mask ? std::vector<int64_t>{2} : std::vector<int64_t>{2, 3, 4})
      tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  auto* n = g->add_node();
  n->set_op_type(mn.op);
  n->set_domain(mn.domain);
  n->set_name("n0");
  for (const auto& i : mn.inputs)
    n->add_input(i);
  for (const auto& o : mn.outputs)
    n->add_output(o);
  for (const auto& [k, v] : mn.ints) {
    auto* a = n->add_attribute();
    a->set_name(k);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(v);
  }
  g->add_output()->set_name(mn.outputs.at(0));
  return m.SerializeAsString();
}

std::string import_error(const std::string& bytes) {
  auto r = import_model_bytes(bytes, "m.onnx");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

/// Runs one node of `op` on FP32 inputs through inference and the reference
/// kernel; returns every output slot's floats (empty for an omitted one).
std::vector<std::vector<float>> run(const std::string& op,
                                    const std::vector<std::pair<std::vector<int64_t>,
                                                                std::vector<float>>>& inputs,
                                    size_t outputs, const std::map<std::string, attribute>& attrs = {}) {
  graph g;
  g.opset = 17;
  std::vector<int> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(g.add_value("in" + std::to_string(i), datatype::fp32, inputs[i].first, true));
  for (size_t i = 0; i < outputs; ++i)
    outs.push_back(g.add_value("out" + std::to_string(i)));
  auto& n = g.add_node(op, "n0", ins, outs);
  n.attrs = attrs;
  auto inf = infer_shapes(g, n);
  if (auto* e = std::get_if<std::string>(&inf))
    FAIL("inference refused: " << *e);
  const auto& shapes = std::get<std::vector<inferred>>(inf);
  REQUIRE(shapes.size() >= outputs);
  std::vector<std::vector<float>> result(outputs);
  std::vector<tensor_ref> in_refs, out_refs;
  for (const auto& [shape, v] : inputs)
    in_refs.push_back({datatype::fp32, shape, const_cast<float*>(v.data())});
  for (size_t i = 0; i < outputs; ++i) {
    result[i].resize(static_cast<size_t>(element_count(shapes[i].shape)));
    out_refs.push_back({datatype::fp32, shapes[i].shape, result[i].data()});
  }
  run_reference(n, in_refs, out_refs);
  return result;
}

attribute f_attr(float v) {
  attribute a;
  a.kind = attribute::kind_t::f;
  a.f = v;
  return a;
}

attribute i_attr(int64_t v) {
  attribute a;
  a.kind = attribute::kind_t::i;
  a.i = v;
  return a;
}

} // namespace

TEST_CASE("a com.microsoft node imports as com.microsoft.<op>, apart from the engine's fused ops") {
  auto g = import_model_bytes(one_node_model({"com.microsoft", "FusedMatMul", {"A", "B"}}),
                              "m.onnx");
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  REQUIRE(g->nodes.size() == 1);
  CHECK(g->nodes[0].op == "com.microsoft.FusedMatMul");
  CHECK(find_operator(g->nodes[0].op) != nullptr);
  CHECK(find_operator("FusedMatMul") == nullptr); // the engine's own fusion
  CHECK(find_engine_operator("FusedMatMul") != nullptr);
  CHECK(find_operator("com.microsoft.Unknown") == nullptr);
  // onnxruntime's RMSNorm is in the default domain (T5 after the optimizer).
  auto rms = import_model_bytes(
    one_node_model({"", "SimplifiedLayerNormalization", {"A", "B"}}), "m.onnx");
  REQUIRE_MESSAGE(rms.ok(), rms.error().message);
  CHECK(rms->nodes[0].op == "SimplifiedLayerNormalization");
}

TEST_CASE("unknown com.microsoft operators and a missing domain import are refused") {
  auto e = import_error(one_node_model({"com.microsoft", "SparseAttention", {"A"}}));
  CHECK(e.find("'com.microsoft.SparseAttention' in 1 node") != std::string::npos);
  CHECK(e.find("com.microsoft.SkipLayerNormalization") != std::string::npos); // the list
  // The node's operator exists, but the model does not import com.microsoft.
  e = import_error(one_node_model({"com.microsoft", "Gelu", {"A"}}, 0));
  CHECK(e.find("'com.microsoft.Gelu' in 1 node ('n0') (the model does not import the "
               "com.microsoft domain at version 1)") != std::string::npos);
  // Other domains stay refused with the domain shown.
  e = import_error(one_node_model({"com.example", "Gelu", {"A"}}));
  CHECK(e.find("'com.example.Gelu'") != std::string::npos);
}

TEST_CASE("contrib attributes and inputs the engine does not implement are refused at import") {
  auto e = import_error(one_node_model({"com.microsoft", "Attention", {"A", "W", "", "", "past"},
                                        {"Y"}, {{"num_heads", 2}}}));
  CHECK(e.find("node 'n0'") != std::string::npos);
  CHECK(e.find("past/present key-value state") != std::string::npos);
  e = import_error(one_node_model({"com.microsoft", "Attention", {"A", "W"}, {"Y"},
                                   {{"num_heads", 2}, {"do_rotary", 1}}}));
  CHECK(e.find("attribute 'do_rotary' is 1") != std::string::npos);
  e = import_error(one_node_model({"com.microsoft", "MultiHeadAttention", {"Q"}, {"Y"},
                                   {{"num_heads", 2}}}));
  CHECK(e.find("packed query/key/value") != std::string::npos);
  e = import_error(one_node_model({"com.microsoft", "FusedMatMul", {"A", "B"}, {"Y"},
                                   {{"transBatchA", 1}}}));
  CHECK(e.find("attribute 'transBatchA' is 1") != std::string::npos);
}

TEST_CASE("FusedMatMul with transB and alpha is alpha * A x B^T") {
  std::mt19937 rng(1);
  auto a = testing::random_floats(2 * 3 * 4, rng), b = testing::random_floats(5 * 4, rng);
  auto got = run("com.microsoft.FusedMatMul", {{{2, 3, 4}, a}, {{5, 4}, b}}, 1,
                 {{"transB", i_attr(1)}, {"alpha", f_attr(0.5f)}})[0];
  std::vector<float> bt(4 * 5);
  for (int i = 0; i < 5; ++i)
    for (int k = 0; k < 4; ++k) bt[k * 5 + i] = 0.5f * b[i * 4 + k];
  auto want = run("MatMul", {{{2, 3, 4}, a}, {{4, 5}, bt}}, 1)[0];
  CHECK(testing::relative_error(got, want) < 1e-6);
}

TEST_CASE("SkipLayerNormalization is LayerNormalization of input + skip + bias, which it returns") {
  std::mt19937 rng(2);
  auto x = testing::random_floats(2 * 3 * 4, rng), skip = testing::random_floats(2 * 3 * 4, rng);
  auto gamma = testing::random_floats(4, rng), beta = testing::random_floats(4, rng);
  auto bias = testing::random_floats(4, rng);
  auto got = run("com.microsoft.SkipLayerNormalization",
                 {{{2, 3, 4}, x}, {{2, 3, 4}, skip}, {{4}, gamma}, {{4}, beta}, {{4}, bias}}, 4,
                 {{"epsilon", f_attr(1e-5f)}});
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + skip[i] + bias[i % 4];
  auto want = run("LayerNormalization", {{{2, 3, 4}, sum}, {{4}, gamma}, {{4}, beta}}, 1,
                  {{"epsilon", f_attr(1e-5f)}})[0];
  CHECK(testing::relative_error(got[0], want) < 1e-6);
  CHECK(testing::relative_error(got[3], sum) == 0);
  // Without a mean, the simplified one divides by the root mean square alone.
  auto rms = run("com.microsoft.SkipSimplifiedLayerNormalization",
                 {{{2, 3, 4}, x}, {{2, 3, 4}, skip}, {{4}, gamma}}, 1,
                 {{"epsilon", f_attr(1e-5f)}})[0];
  // onnxruntime's default-domain SimplifiedLayerNormalization is the same without the skip.
  std::vector<float> xs(x.size());
  for (size_t i = 0; i < x.size(); ++i) xs[i] = x[i] + skip[i];
  auto plain = run("SimplifiedLayerNormalization", {{{2, 3, 4}, xs}, {{4}, gamma}}, 1,
                   {{"epsilon", f_attr(1e-5f)}})[0];
  CHECK(testing::relative_error(plain, rms) < 1e-6);
  for (int r = 0; r < 6; ++r) {
    double ms = 0;
    for (int i = 0; i < 4; ++i) ms += double(x[r * 4 + i] + skip[r * 4 + i]) * (x[r * 4 + i] + skip[r * 4 + i]) / 4;
    for (int i = 0; i < 4; ++i)
      CHECK(rms[r * 4 + i] == doctest::Approx((x[r * 4 + i] + skip[r * 4 + i]) / std::sqrt(ms + 1e-5) * gamma[i]).epsilon(1e-5));
  }
}

TEST_CASE("Attention with a key-length mask ignores the padded keys") {
  // One head over [1, 3, 2]: with mask_index [2] the third key must not change the output,
  // so changing its input row changes only row 2's own output.
  std::mt19937 rng(3);
  auto x = testing::random_floats(3 * 2, rng), w = testing::random_floats(2 * 6, rng);
  auto x2 = x;
  x2[4] += 5;
  x2[5] -= 3;
  graph g;
  g.opset = 17;
  int xi = g.add_value("x", datatype::fp32, {1, 3, 2}, true);
  int wi = g.add_value("w", datatype::fp32, {2, 6}, true);
  int mi = g.add_value("mask", datatype::int32, {1}, true);
  int y = g.add_value("y");
  auto& n = g.add_node("com.microsoft.Attention", "n0", {xi, wi, -1, mi}, {y});
  n.set_i("num_heads", 1);
  auto inf = infer_shapes(g, n);
  REQUIRE(std::holds_alternative<std::vector<inferred>>(inf));
  CHECK(std::get<std::vector<inferred>>(inf)[0].shape == std::vector<int64_t>{1, 3, 2});
  int32_t len = 2;
  auto run_with = [&](std::vector<float>& in) {
    std::vector<float> out(6);
    run_reference(n, {{datatype::fp32, {1, 3, 2}, in.data()}, {datatype::fp32, {2, 6}, w.data()},
                      {}, {datatype::int32, {1}, &len}},
                  {{datatype::fp32, {1, 3, 2}, out.data()}});
    return out;
  };
  auto a = run_with(x), b = run_with(x2);
  for (int i = 0; i < 4; ++i)
    CHECK(a[i] == b[i]);
  CHECK(a[4] != b[4]);
}

TEST_CASE("the optimizer's BERT: BiasGelu, SkipLayerNormalization and Attention become the "
          "engine's fused ops, with the outputs of the reference kernels") {
  const std::filesystem::path dir = std::filesystem::path(CAF_SERVING_ONNX_FIXTURES);
  const std::string model = "contrib_bert_2layer_ort_optimized";
  auto g = import_model(dir / "models" / model / "1" / "model.onnx");
  REQUIRE_MESSAGE(g.ok(), g.error().message);
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  std::vector<std::string> data(g->inputs.size());
  std::vector<std::vector<int64_t>> shapes;
  std::istringstream lines(read(dir / "reference" / model / "manifest.txt"));
  std::string kind, name, type, dims, file;
  while (lines >> kind >> name >> type >> dims >> file)
    for (size_t i = 0; i < g->inputs.size(); ++i)
      if (kind == "input" && g->values[g->inputs[i]].name == name)
        data[i] = read(dir / "reference" / model / file);
  for (size_t i = 0; i < g->inputs.size(); ++i) {
    auto s = g->values[g->inputs[i]].shape;
    s[0] = 2;
    shapes.push_back(s);
  }
  auto plain = specialize(*g, shapes);
  REQUIRE_MESSAGE(plain.ok(), plain.error().message);
  auto fused = optimize(*g, shapes);
  REQUIRE_MESSAGE(fused.ok(), fused.error().message);
  auto count = [](const graph& x, const std::string& op) {
    int c = 0;
    for (const auto& n : x.nodes) c += n.op == op;
    return c;
  };
  CHECK(count(*plain, "com.microsoft.BiasGelu") == 2);
  CHECK(count(*plain, "com.microsoft.SkipLayerNormalization") == 4);
  CHECK(count(*fused, "com.microsoft.BiasGelu") == 0);
  CHECK(count(*fused, "com.microsoft.SkipLayerNormalization") == 0);
  CHECK(count(*fused, "FusedLayerNorm") == 4);
  // Attention with constant weights and EmbedLayerNormalization's key lengths as mask.
  CHECK(count(*plain, "com.microsoft.Attention") == 2);
  CHECK(count(*fused, "com.microsoft.Attention") == 0);
  CHECK(count(*fused, "FusedAttention") == 2);
  auto a = run_reference_graph(*plain, data), b = run_reference_graph(*fused, data);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    CHECK(testing::relative_error(testing::as_floats(b[i]), testing::as_floats(a[i])) < 1e-5);
}

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int64_t> parse_dims(const std::string& dims) {
  std::vector<int64_t> out;
  std::istringstream in(dims);
  for (std::string d; std::getline(in, d, ',');)
    out.push_back(std::stoll(d));
  return out;
}

/// Runs fixture `name` of tools/genai_fixtures.py (a model, its inputs and
/// onnxruntime's outputs) through specialize() and the reference kernels, and
/// returns the largest relative error over its outputs.
double genai_case_error(const std::string& name) {
  const auto dir = std::filesystem::path(CAF_SERVING_ONNX_FIXTURES) / "genai_ops" / name;
  auto g = import_model(dir / "model.onnx");
  REQUIRE_MESSAGE(g.ok(), name << ": " << g.error().message);
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> inputs, outputs;
  std::istringstream lines(read_file(dir / "manifest.txt"));
  std::string kind, tensor, type, dims, file;
  while (lines >> kind >> tensor >> type >> dims >> file)
    (kind == "input" ? inputs : outputs)[tensor] = {parse_dims(dims), read_file(dir / file)};
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> data;
  for (int v : g->inputs) {
    const auto& in = inputs.at(g->values[v].name);
    shapes.push_back(in.first);
    data.push_back(in.second);
  }
  auto plain = specialize(*g, shapes);
  REQUIRE_MESSAGE(plain.ok(), name << ": " << plain.error().message);
  auto got = run_reference_graph(*plain, data);
  REQUIRE(got.size() == plain->outputs.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& want = outputs.at(plain->values[plain->outputs[i]].name);
    CHECK_MESSAGE(plain->values[plain->outputs[i]].shape == want.first,
                  name << " output " << plain->values[plain->outputs[i]].name);
    auto a = testing::as_floats(got[i]);
    auto b = testing::as_floats(std::vector<uint8_t>(want.second.begin(), want.second.end()));
    REQUIRE(a.size() == b.size());
    double e = testing::relative_error(a, b);
    MESSAGE(name << " output " << plain->values[plain->outputs[i]].name << ": relative error "
                 << e);
    worst = std::max(worst, e);
  }
  return worst;
}

} // namespace

TEST_CASE("onnxruntime-genai's GroupQueryAttention gives onnxruntime's outputs") {
  // Token generation over rows of different past lengths, a first prompt, a prompt chunk
  // after a cached past, interleaved rotary, separate Q/K/V without rotary and with a
  // scale, rotary over part of the head.
  for (const char* name : {"gqa_decode", "gqa_first_prompt", "gqa_chunk", "gqa_interleaved",
                           "gqa_separate_no_rotary", "gqa_partial_rotary"})
    CHECK_MESSAGE(genai_case_error(name) < 1e-5, name);
}

TEST_CASE("MatMulNBits (4 bits) gives onnxruntime's outputs, with and without zero points") {
  for (const char* name : {"matmul_nbits", "matmul_nbits_zp_bias", "matmul_nbits_float_zp"})
    CHECK_MESSAGE(genai_case_error(name) < 1e-5, name);
}

TEST_CASE("SkipSimplifiedLayerNormalization's four outputs and SimplifiedLayerNormalization "
          "give onnxruntime's outputs") {
  CHECK(genai_case_error("simplified_layernorms") < 1e-5);
}

TEST_CASE("GroupQueryAttention and MatMulNBits refuse what the engine does not implement") {
  model_node gqa{"com.microsoft", "GroupQueryAttention",
                 {"q", "", "", "pk", "pv", "mask_s", "mask_t"}, {"Y", "pk_out", "pv_out"},
                 {{"num_heads", 2}, {"kv_num_heads", 1}, {"local_window_size", 4}}};
  CHECK(import_error(one_node_model(gqa)).find("local_window_size") != std::string::npos);
  gqa.ints = {{"num_heads", 2}, {"kv_num_heads", 1}, {"smooth_softmax", 1}};
  CHECK(import_error(one_node_model(gqa)).find("smooth_softmax") != std::string::npos);
  gqa.ints = {{"num_heads", 2}, {"kv_num_heads", 1}};
  gqa.inputs = {"q", "", "", "pk", "pv", "mask_s", "mask_t", "", "", "mask_pos"};
  CHECK(import_error(one_node_model(gqa)).find("position_ids") != std::string::npos);
  model_node nbits{"com.microsoft", "MatMulNBits", {"a", "b", "s"}, {"Y"},
                   {{"K", 4}, {"N", 3}, {"bits", 8}, {"block_size", 16}}};
  CHECK(import_error(one_node_model(nbits)).find("bits") != std::string::npos);
  nbits.ints["bits"] = 4;
  nbits.inputs = {"a", "b", "s", "", "mask_g"};
  CHECK(import_error(one_node_model(nbits)).find("g_idx") != std::string::npos);
}

namespace {

/// PagedGroupQueryAttention with `N` query heads, `kv` kv heads of `head`
/// floats, its attention by `attend`, against GroupQueryAttention over the
/// same past as tensors. Rows with 0, 5 and 37 cached positions in blocks of 4
/// positions, scattered over a pool of two layers (the node reads layer 1);
/// decoding one token and prefilling four.
void check_paged_against_gqa(int64_t N, int64_t kv, int64_t head, paged_row_attention attend) {
  CAPTURE(N);
  CAPTURE(kv);
  CAPTURE(head);
  const int64_t bt = 4, layers = 2, layer = 1, B = 3;
  const std::vector<int64_t> context{0, 5, 37};
  const int64_t P = 37, positions = 64, half = 4;
  std::mt19937 rng(35);
  auto cos = testing::random_floats(positions * half, rng);
  auto sin = testing::random_floats(positions * half, rng);
  auto past_k = testing::random_floats(B * kv * P * head, rng);
  auto past_v = testing::random_floats(B * kv * P * head, rng);
  const int64_t width = (P + bt - 1) / bt, blocks = B * width + 5;
  const int64_t block_floats = layers * 2 * kv * bt * head;
  std::vector<float> pool(blocks * block_floats, 1e6f); // what no row may read
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(B * width, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i * bt < context[b]; ++i)
      table[b * width + i] = ids[b * width + i];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < kv; ++h)
      for (int64_t j = 0; j < context[b]; ++j)
        for (int kind = 0; kind < 2; ++kind) {
          const auto& past = kind == 0 ? past_k : past_v;
          float* at = pool.data() + table[b * width + j / bt] * block_floats
                      + (((layer * 2 + kind) * kv + h) * bt + j % bt) * head;
          std::copy_n(&past[((b * kv + h) * P + j) * head], head, at);
        }
  const uint64_t handle = new_external_memory_handle();
  bind_external_memory(handle, {pool.data(), pool.size()});
  std::vector<int32_t> context32(context.begin(), context.end());

  for (int64_t S : {1, 4}) {
    CAPTURE(S);
    auto query = testing::random_floats(B * S * N * head, rng);
    auto key = testing::random_floats(B * S * kv * head, rng);
    auto value = testing::random_floats(B * S * kv * head, rng);
    // GroupQueryAttention over the left-aligned past, as onnxruntime computes it.
    graph g;
    g.opset = 17;
    int q = g.add_value("q", datatype::fp32, {B, S, N * head}, true);
    int k = g.add_value("k", datatype::fp32, {B, S, kv * head}, true);
    int v = g.add_value("v", datatype::fp32, {B, S, kv * head}, true);
    int pk = g.add_value("pk", datatype::fp32, {B, kv, P, head}, true);
    int pv = g.add_value("pv", datatype::fp32, {B, kv, P, head}, true);
    int sl = g.add_value("seqlens", datatype::int32, {B}, true);
    int tl = g.add_value("total", datatype::int32, {}, true);
    int c = g.add_value("cos", datatype::fp32, {positions, half}, true);
    int s = g.add_value("sin", datatype::fp32, {positions, half}, true);
    int y = g.add_value("y"), ok = g.add_value("ok"), ov = g.add_value("ov");
    auto& gqa = g.add_node("com.microsoft.GroupQueryAttention", "gqa",
                           {q, k, v, pk, pv, sl, tl, c, s}, {y, ok, ov});
    gqa.set_i("num_heads", N);
    gqa.set_i("kv_num_heads", kv);
    gqa.set_i("do_rotary", 1);
    std::vector<int32_t> seqlens(B);
    for (int64_t b = 0; b < B; ++b)
      seqlens[b] = static_cast<int32_t>(context[b] + S - 1);
    int32_t total = static_cast<int32_t>(P + S);
    const int64_t present = P + S;
    std::vector<float> y_ref(B * S * N * head), k_ref(B * kv * present * head),
      v_ref(k_ref.size());
    run_reference(gqa,
                  {{datatype::fp32, {B, S, N * head}, query.data()},
                   {datatype::fp32, {B, S, kv * head}, key.data()},
                   {datatype::fp32, {B, S, kv * head}, value.data()},
                   {datatype::fp32, {B, kv, P, head}, past_k.data()},
                   {datatype::fp32, {B, kv, P, head}, past_v.data()},
                   {datatype::int32, {B}, seqlens.data()}, {datatype::int32, {}, &total},
                   {datatype::fp32, {positions, half}, cos.data()},
                   {datatype::fp32, {positions, half}, sin.data()}},
                  {{datatype::fp32, {B, S, N * head}, y_ref.data()},
                   {datatype::fp32, {B, kv, present, head}, k_ref.data()},
                   {datatype::fp32, {B, kv, present, head}, v_ref.data()}});

    node paged{paged_gqa_op, "paged", {}, {}, {}};
    paged.set_i("num_heads", N);
    paged.set_i("kv_num_heads", kv);
    paged.set_i("do_rotary", 1);
    paged.set_i("layer", layer);
    paged.set_i("layers", layers);
    paged.set_i("block_tokens", bt);
    paged.set_i("kv_pool", static_cast<int64_t>(handle));
    std::vector<tensor_ref> in{{datatype::fp32, {B, S, N * head}, query.data()},
                               {datatype::fp32, {B, S, kv * head}, key.data()},
                               {datatype::fp32, {B, S, kv * head}, value.data()},
                               {datatype::int32, {B, width}, table.data()},
                               {datatype::int32, {B, 1}, context32.data()},
                               {datatype::fp32, {positions, half}, cos.data()},
                               {datatype::fp32, {positions, half}, sin.data()}};
    std::vector<float> y_got(y_ref.size()), k_got(B * kv * S * head), v_got(k_got.size());
    std::vector<tensor_ref> out{{datatype::fp32, {B, S, N * head}, y_got.data()},
                                {datatype::fp32, {B, kv, S, head}, k_got.data()},
                                {datatype::fp32, {B, kv, S, head}, v_got.data()}};
    // As the CPU backend splits it: row 0, then rows 1 and 2.
    run_paged_gqa_rows(paged, in, out, paged_gqa_rows{0, 1, attend});
    run_paged_gqa_rows(paged, in, out, paged_gqa_rows{1, B, attend});
    for (size_t i = 0; i < y_ref.size(); ++i)
      REQUIRE_MESSAGE(y_got[i] == doctest::Approx(y_ref[i]).epsilon(1e-5), "element " << i);
    // The new positions are GroupQueryAttention's present at [ctx, ctx + S), rotated alike.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < kv; ++h)
        for (int64_t j = 0; j < S; ++j)
          for (int64_t d = 0; d < head; ++d) {
            size_t got = ((b * kv + h) * S + j) * head + d;
            size_t want = ((b * kv + h) * present + context[b] + j) * head + d;
            REQUIRE(k_got[got] == k_ref[want]);
            REQUIRE(v_got[got] == v_ref[want]);
          }
    // The whole node through the registry's reference kernel, too: the same
    // arithmetic where `attend` is the reference, within rounding otherwise.
    std::vector<float> y_whole(y_ref.size());
    out[0].data = y_whole.data();
    run_reference(paged, in, out);
    if (attend == paged_row_reference)
      CHECK(y_whole == y_got);
    else
      for (size_t i = 0; i < y_ref.size(); ++i)
        REQUIRE(y_got[i] == doctest::Approx(y_whole[i]).epsilon(1e-5));
    // A context beyond the block table is an error, not a read past it.
    auto too_long = context32;
    too_long[2] = static_cast<int32_t>(width * bt + 1);
    in[4].data = too_long.data();
    CHECK_THROWS_AS(run_paged_gqa_rows(paged, in, out, 0, B), std::runtime_error);
    in[4].data = context32.data();
  }
  unbind_external_memory(handle);
}

} // namespace

TEST_CASE("PagedGroupQueryAttention over scattered cache blocks gives GroupQueryAttention's "
          "outputs over the same past as tensors") {
  check_paged_against_gqa(4, 2, 16, paged_row_reference);
  const int64_t N = 4, kv = 2, head = 16, bt = 4, layers = 2, layer = 1, B = 3, P = 37;
  const int64_t width = (P + bt - 1) / bt;
  std::vector<int32_t> context32{0, 5, 37}, table(B * width, 0);
  const uint64_t handle = new_external_memory_handle();
  // Without its cache bound, a row with a past cannot run.
  std::vector<float> query(B * N * head), key(B * kv * head), value(key.size()),
    y(query.size()), k(key.size()), v(key.size());
  node paged{paged_gqa_op, "paged", {}, {}, {}};
  paged.set_i("num_heads", N);
  paged.set_i("kv_num_heads", kv);
  paged.set_i("layer", layer);
  paged.set_i("layers", layers);
  paged.set_i("block_tokens", bt);
  paged.set_i("kv_pool", static_cast<int64_t>(handle));
  CHECK_THROWS_AS(run_paged_gqa_rows(paged,
                                     {{datatype::fp32, {B, 1, N * head}, query.data()},
                                      {datatype::fp32, {B, 1, kv * head}, key.data()},
                                      {datatype::fp32, {B, 1, kv * head}, value.data()},
                                      {datatype::int32, {B, width}, table.data()},
                                      {datatype::int32, {B, 1}, context32.data()}},
                                     {{datatype::fp32, {B, 1, N * head}, y.data()},
                                      {datatype::fp32, {B, kv, 1, head}, k.data()},
                                      {datatype::fp32, {B, kv, 1, head}, v.data()}},
                                     0, B),
                  std::runtime_error);
}

TEST_CASE("the CPU backend's paged attention (the engine's kernel at this process's ISA level) "
          "gives GroupQueryAttention's outputs") {
  // Group 2 and a head of 16; group 1 with heads of 40 and 64 floats (GPT-2's
  // group); group 4 with a head of 80 (the Llama's group): heads that are not
  // multiples of 16 or 8 take the kernel's masked tails.
  const std::string level = kernels::cpu::isa_level_name(kernels::cpu::engine_isa_level());
  CAPTURE(level);
  check_paged_against_gqa(4, 2, 16, engine_paged_row);
  check_paged_against_gqa(2, 2, 40, engine_paged_row);
  check_paged_against_gqa(3, 3, 64, engine_paged_row);
  check_paged_against_gqa(8, 2, 80, engine_paged_row);
}
