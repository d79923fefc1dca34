/// rewrite_decoder_attention on small decoders built here as torch.onnx.export
/// writes them: the rewrite must compute what the chain of operators computes
/// (the reference interpreter runs both), and refuse every mask and score
/// transform that GroupQueryAttention does not compute, leaving the graph as
/// it was. tests/generative/decoder_steps.test.cpp serves the fixtures'
/// torch exports rewritten, against transformers' tokens.

#include "onnx/passes_decoder.hpp"

#include "onnx/op_registry.hpp"
#include "onnx/passes.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

/// What the bias added to the scores allows.
enum class mask_kind {
  causal_padding, ///< key j <= past + i, and attention_mask[b, j] (what GQA computes)
  padding_only,   ///< attention_mask alone: not causal
  window,         ///< causal, padding, and j > past + i - 100 (a sliding window)
};

struct toy_config {
  int64_t heads = 4, kv_heads = 2, head_dim = 4, hidden = 8, vocab = 11;
  mask_kind mask = mask_kind::causal_padding;
  /// tanh(scores / 30) * 30 before the mask (Gemma 2's softcapping).
  bool softcap = false;
};

struct toy_builder {
  graph g;
  std::mt19937 rng{7};
  int counter = 0;

  std::string fresh(const std::string& what) { return what + "_" + std::to_string(counter++); }

  int ints(std::vector<int64_t> shape, const std::vector<int64_t>& data) {
    auto t = make_tensor(datatype::int64, std::move(shape));
    std::memcpy(t->as_mut<int64_t>(), data.data(), data.size() * sizeof(int64_t));
    return g.add_constant(fresh("ints"), t);
  }
  int floats(std::vector<int64_t> shape, std::vector<float> data = {}) {
    auto t = make_tensor(datatype::fp32, std::move(shape));
    if (data.empty()) {
      std::normal_distribution<float> d(0.f, 0.5f);
      data.resize(static_cast<size_t>(t->elements()));
      for (auto& x : data)
        x = d(rng);
    }
    std::memcpy(t->as_mut<float>(), data.data(), data.size() * sizeof(float));
    return g.add_constant(fresh("floats"), t);
  }
  int op(const std::string& type, std::vector<int> in) {
    int out = g.add_value(fresh(type));
    g.add_node(type, fresh(type + "_node"), std::move(in), {out});
    return out;
  }
  int op_with(const std::string& type, std::vector<int> in, const std::string& attr,
              std::vector<int64_t> v) {
    int out = op(type, std::move(in));
    if (v.size() == 1 && attr != "perm")
      g.nodes.back().set_i(attr, v[0]);
    else
      g.nodes.back().set_ints(attr, std::move(v));
    return out;
  }
  /// x [B, S, hidden] projected to [B, heads, S, head_dim].
  int project(int x, const toy_config& c, int64_t heads) {
    int y = op("MatMul", {x, floats({c.hidden, heads * c.head_dim})});
    int r = op("Reshape", {y, ints({4}, {0, 0, heads, c.head_dim})});
    return op_with("Transpose", {r}, "perm", {0, 2, 1, 3});
  }
  /// repeat_kv: [B, kv, T, hd] to [B, heads, T, hd].
  int repeat(int x, const toy_config& c) {
    if (c.heads == c.kv_heads)
      return x;
    int u = op("Unsqueeze", {x, ints({1}, {2})});
    int e = op("Expand", {u, ints({5}, {1, 1, c.heads / c.kv_heads, 1, 1})});
    return op("Reshape", {e, ints({4}, {0, c.heads, -1, c.head_dim})});
  }
};

/// input_ids [B, S] -> embedding -> one attention layer over its cache ->
/// logits [B, S, vocab]; present_k, present_v [B, kv, past + S, hd].
graph toy_decoder(const toy_config& c) {
  toy_builder b;
  graph& g = b.g;
  g.opset = 17;
  int ids = g.add_value("input_ids", datatype::int64, {-1, -1}, true);
  int mask = g.add_value("attention_mask", datatype::int64, {-1, -1}, true);
  int past_k = g.add_value("past_key_values.0.key", datatype::fp32,
                           {-1, c.kv_heads, -1, c.head_dim}, true);
  int past_v = g.add_value("past_key_values.0.value", datatype::fp32,
                           {-1, c.kv_heads, -1, c.head_dim}, true);
  g.inputs = {ids, mask, past_k, past_v};
  int x = b.op("Gather", {b.floats({c.vocab, c.hidden}), ids});
  int q = b.project(x, c, c.heads);
  int k = b.project(x, c, c.kv_heads);
  int v = b.project(x, c, c.kv_heads);
  int present_k = g.add_value("present.0.key");
  g.add_node("Concat", "cat_k", {past_k, k}, {present_k}).set_i("axis", -2);
  int present_v = g.add_value("present.0.value");
  g.add_node("Concat", "cat_v", {past_v, v}, {present_v}).set_i("axis", 2);

  // The bias from attention_mask and the shapes, as transformers builds it.
  int zero = b.ints({}, {0}), one = b.ints({}, {1});
  int total = b.op_with("Gather", {b.op("Shape", {mask}), one}, "axis", {0});
  int seq = b.op_with("Gather", {b.op("Shape", {ids}), one}, "axis", {0});
  int past = b.op("Sub", {total, seq});
  int keys = b.op("Unsqueeze", {b.op("Range", {zero, total, one}), b.ints({1}, {0})}); // [1, T]
  int queries = b.op("Unsqueeze", {b.op("Range", {past, total, one}), b.ints({1}, {1})}); // [S, 1]
  int padding = b.op_with("Cast", {b.op("Unsqueeze", {mask, b.ints({2}, {1, 2})})}, "to",
                          {9}); // [B, 1, 1, T] BOOL
  int allowed = padding;
  if (c.mask != mask_kind::padding_only)
    allowed = b.op("And", {b.op("LessOrEqual", {keys, queries}), padding});
  if (c.mask == mask_kind::window)
    allowed = b.op("And", {allowed, b.op("Greater", {keys, b.op("Sub", {queries,
                                                                b.ints({}, {100})})})});
  int bias = b.op("Where", {allowed, b.floats({}, {0.f}),
                            b.floats({}, {-std::numeric_limits<float>::infinity()})});

  // sdpa's decomposition: sqrt(scale) on q and on k^T.
  const float root = std::sqrt(1.f / std::sqrt(static_cast<float>(c.head_dim)));
  int kt = b.op_with("Transpose", {b.repeat(present_k, c)}, "perm", {0, 1, 3, 2});
  int scores = b.op("MatMul", {b.op("Mul", {q, b.floats({}, {root})}),
                               b.op("Mul", {kt, b.floats({}, {root})})});
  if (c.softcap)
    scores = b.op("Mul", {b.op("Tanh", {b.op("Div", {scores, b.floats({}, {30.f})})}),
                          b.floats({}, {30.f})});
  int probs = b.op_with("Softmax", {b.op("Add", {scores, bias})}, "axis", {-1});
  int guarded = b.op("Where", {b.op("IsNaN", {probs}), b.floats({}, {0.f}), probs});
  int o = b.op("MatMul", {guarded, b.repeat(present_v, c)});
  int y = b.op("Reshape", {b.op_with("Transpose", {o}, "perm", {0, 2, 1, 3}),
                           b.ints({3}, {0, 0, -1})});
  int logits = b.op("MatMul", {y, b.floats({c.heads * c.head_dim, c.vocab})});
  g.values[logits].name = "logits";
  g.outputs = {logits, present_k, present_v};
  return g;
}

int count_ops(const graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes)
    n += node.op == op;
  return n;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// The outputs of `g` at batch 2, sequence 3 after a past of 4 (every
/// position valid: where the two layouts agree), as floats.
std::vector<std::vector<float>> run(const graph& g, const toy_config& c) {
  const int64_t B = 2, S = 3, P = 4;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> token(0, c.vocab - 1);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<int64_t> ids(B * S), mask(B * (P + S), 1);
  for (auto& t : ids)
    t = token(rng);
  std::vector<float> pk(static_cast<size_t>(B * c.kv_heads * P * c.head_dim)), pv(pk.size());
  for (auto* v : {&pk, &pv})
    for (auto& x : *v)
      x = d(rng);
  auto s = specialize(g, {{B, S}, {B, P + S}, {B, c.kv_heads, P, c.head_dim},
                          {B, c.kv_heads, P, c.head_dim}});
  REQUIRE_MESSAGE(s, (s ? std::string() : s.error().message));
  std::vector<std::vector<float>> out;
  for (const auto& o : run_reference_graph(*s, {bytes_of(ids), bytes_of(mask), bytes_of(pk),
                                                 bytes_of(pv)})) {
    out.emplace_back(o.size() / sizeof(float));
    std::memcpy(out.back().data(), o.data(), o.size());
  }
  return out;
}

} // namespace

TEST_CASE("a torch-exported layer becomes one GroupQueryAttention that computes the same") {
  for (int64_t heads : {4, 2}) { // grouped (repeat_kv) and one query head per KV head
    CAPTURE(heads);
    toy_config c;
    c.heads = heads;
    graph g = toy_decoder(c);
    auto before = run(g, c);
    auto r = rewrite_decoder_attention(g);
    REQUIRE_MESSAGE(r.layers == 1, r.refused);
    CHECK(r.refused.empty());
    CHECK(count_ops(g, "com.microsoft.GroupQueryAttention") == 1);
    // The chain is gone: its Softmax, the Concats, the mask's Where.
    CHECK(count_ops(g, "Softmax") == 0);
    CHECK(count_ops(g, "Concat") == 0);
    CHECK(count_ops(g, "Where") == 0);
    for (const auto& n : g.nodes)
      if (n.op == "com.microsoft.GroupQueryAttention") {
        CHECK(n.get_i("num_heads", 0) == heads);
        CHECK(n.get_i("kv_num_heads", 0) == 2);
        CHECK(n.get_f("scale", 0.f) == doctest::Approx(0.5f));
        CHECK(n.get_i("do_rotary", 1) == 0);
      }
    auto after = run(g, c);
    REQUIRE(after.size() == before.size());
    for (size_t o = 0; o < before.size(); ++o) {
      CAPTURE(o);
      REQUIRE(after[o].size() == before[o].size());
      double worst = 0;
      for (size_t i = 0; i < before[o].size(); ++i)
        worst = std::max(worst, std::fabs(double(after[o][i]) - before[o][i]));
      CHECK(worst < 1e-5);
    }
  }
}

TEST_CASE("a mask that is not causal plus padding, or softcapped scores, leave the graph as "
          "it is and say why") {
  struct refused_case {
    const char* what;
    toy_config config;
    const char* reason;
  };
  toy_config not_causal, window, softcap;
  not_causal.mask = mask_kind::padding_only;
  window.mask = mask_kind::window;
  softcap.softcap = true;
  for (const auto& rc : {refused_case{"attention_mask alone", not_causal, "is not causal"},
                         refused_case{"a window of 100", window, "is not causal"},
                         refused_case{"softcapping", softcap, "softcap"}}) {
    CAPTURE(rc.what);
    graph g = toy_decoder(rc.config);
    const auto nodes = g.nodes.size();
    auto r = rewrite_decoder_attention(g);
    CHECK(r.layers == 0);
    CHECK_MESSAGE(r.refused.find(rc.reason) != std::string::npos, r.refused);
    CHECK(g.nodes.size() == nodes);
    CHECK(count_ops(g, "com.microsoft.GroupQueryAttention") == 0);
    CHECK(count_ops(g, "Softmax") == 1);
  }
  // No attention_mask input at all.
  graph g = toy_decoder({});
  g.values[g.inputs[1]].name = "mask";
  auto r = rewrite_decoder_attention(g);
  CHECK(r.layers == 0);
  CHECK(r.refused.find("attention_mask") != std::string::npos);
}
