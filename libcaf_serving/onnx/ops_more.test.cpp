/// The operators of ops_more.cpp: Attention against the engine's FusedAttention
/// reference (masks, is_causal, grouped-query heads, a query that sees no key),
/// Gelu against FusedGelu, quantization's rounding and saturation worked out by
/// hand, the reductions' edge cases, the errors that name what the engine does
/// not take; then a model of FP16 ReduceL2 and GlobalMaxPool, imported and
/// served by the CPU backend. ONNX Runtime's outputs for these operators are
/// checked through the server by onnx.server.test (tests/onnx/fixtures/models/op_*).

#include "onnx/ops_more.hpp"

#include "onnx/importer.hpp"
#include "onnx/output_testing.hpp"
#include "onnx/ops_testing.hpp"
#include "onnx/testing.hpp"
#include "onnx_cpu/onnx_backend.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;
using namespace caf_serving::onnx::testing;

namespace {

constexpr float inf_f = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

tensor random_f32(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  return f32(shape, random_floats(static_cast<size_t>(element_count(shape)), rng, scale));
}

std::map<std::string, attribute> attrs(std::initializer_list<std::pair<const char*, attribute>> a) {
  std::map<std::string, attribute> m;
  for (const auto& [k, v] : a) m[k] = v;
  return m;
}

/// FusedAttention (ops_nn.hpp) on [B, S, H*D] with a float mask: the reference
/// that ONNX's Attention is checked against.
std::vector<float> fused_attention(const tensor& q, const tensor& k, const tensor& v,
                                   const tensor& mask, int64_t heads, float scale) {
  return ok1({"FusedAttention", {q, k, v, mask},
              attrs({{"num_heads", int_attr(heads)}, {"scale", float_attr(scale)}})})
    .values<float>();
}

} // namespace

TEST_CASE("the importer lists the operators of ops_more.cpp") {
  const auto& all = supported_operators();
  CHECK(std::is_sorted(all.begin(), all.end()));
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  for (const auto& e : more_operator_table())
    CHECK_MESSAGE(std::binary_search(all.begin(), all.end(), e.op), e.op);
  CHECK(more_operator_table().size() == 29);
}

TEST_CASE("Attention matches FusedAttention: 3-D heads, float and BOOL masks, is_causal") {
  std::mt19937 rng(7);
  int64_t b = 2, s = 4, h = 2, d = 3;
  auto q = random_f32({b, s, h * d}, rng), k = random_f32({b, s, h * d}, rng),
       v = random_f32({b, s, h * d}, rng);
  auto heads = attrs({{"q_num_heads", int_attr(h)}, {"kv_num_heads", int_attr(h)}});
  float scale = 1.0f / std::sqrt(float(d)); // Attention's default

  auto none = f32({1}, {0});
  auto plain = ok1({"Attention", {q, k, v}, heads, 23});
  CHECK(plain.shape == std::vector<int64_t>{b, s, h * d});
  CHECK(relative_error(plain.values<float>(), fused_attention(q, k, v, none, h, scale)) < 1e-5);

  // BOOL false is a float mask of minus infinity; batch 1 sees only keys 0 and 1.
  std::vector<uint8_t> keep(b * s, 1);
  std::vector<float> add(b * s, 0);
  for (int64_t j = 2; j < s; ++j) {
    keep[s + j] = 0;
    add[s + j] = -inf_f;
  }
  auto bool_mask = make<uint8_t>(datatype::bool_, {b, 1, 1, s}, keep);
  auto float_mask = f32({b, 1, 1, s}, add);
  auto want = fused_attention(q, k, v, float_mask, h, scale);
  CHECK(relative_error(ok1({"Attention", {q, k, v, bool_mask}, heads, 23}).values<float>(), want)
        < 1e-5);
  CHECK(relative_error(ok1({"Attention", {q, k, v, float_mask}, heads, 23}).values<float>(), want)
        < 1e-5);

  // is_causal: query i sees keys j <= i, a float mask of the upper triangle; the
  // scale attribute replaces 1/sqrt(d).
  std::vector<float> tri(s * s, 0);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = i + 1; j < s; ++j) tri[i * s + j] = -inf_f;
  auto causal = heads;
  causal["is_causal"] = int_attr(1);
  causal["scale"] = float_attr(0.7f);
  CHECK(relative_error(ok1({"Attention", {q, k, v}, causal, 23}).values<float>(),
                       fused_attention(q, k, v, f32({1, 1, s, s}, tri), h, 0.7f))
        < 1e-5);
}

TEST_CASE("Attention: 4-D grouped-query heads, present key and value, a query that sees no key") {
  std::mt19937 rng(8);
  int64_t b = 1, qh = 4, kvh = 2, s = 3, d = 2;
  auto q = random_f32({b, qh, s, d}, rng), k = random_f32({b, kvh, s, d}, rng),
       v = random_f32({b, kvh, s, d}, rng);
  auto out = ok(run_node({"Attention", {q, k, v}, {}, 23, 3}));
  REQUIRE(out.size() == 3);
  CHECK(out[0].shape == std::vector<int64_t>{b, qh, s, d});
  CHECK(out[1].values<float>() == k.values<float>()); // no cache: present_key is K
  CHECK(out[2].values<float>() == v.values<float>());
  // Query heads 0, 1 share KV head 0 and 2, 3 share head 1: the same as 4 KV
  // heads with each repeated.
  std::vector<float> k4, v4;
  auto kv = k.values<float>(), vv = v.values<float>();
  for (int64_t hq = 0; hq < qh; ++hq) {
    int64_t from = hq / (qh / kvh) * s * d;
    k4.insert(k4.end(), kv.begin() + from, kv.begin() + from + s * d);
    v4.insert(v4.end(), vv.begin() + from, vv.begin() + from + s * d);
  }
  auto mha = ok1({"Attention", {q, f32({b, qh, s, d}, k4), f32({b, qh, s, d}, v4)}, {}, 23});
  CHECK(out[0].values<float>() == mha.values<float>());
  // Row 1 of the mask hides every key: ONNX asks for zeros there, not NaN.
  std::vector<uint8_t> keep(s * s, 1);
  for (int64_t j = 0; j < s; ++j) keep[s + j] = 0;
  auto masked = ok1({"Attention", {q, k, v, make<uint8_t>(datatype::bool_, {s, s}, keep)}, {},
                     23}).values<float>();
  for (int64_t hq = 0; hq < qh; ++hq)
    for (int64_t e = 0; e < d; ++e) {
      CHECK(masked[(hq * s + 1) * d + e] == 0.0f);
      CHECK(masked[(hq * s + 0) * d + e] == out[0].values<float>()[(hq * s + 0) * d + e]);
    }
}

TEST_CASE("Attention refuses what the engine does not run, naming it") {
  std::mt19937 rng(9);
  auto q = random_f32({1, 2, 3, 4}, rng);
  CHECK(has(refused({"Attention", {q, q, q, omitted(), q, q}, {}, 23}), "past_key/past_value"));
  CHECK(has(refused({"Attention", {q, q, q}, attrs({{"softcap", float_attr(30)}}), 23}),
            "softcap"));
  CHECK(has(refused({"Attention", {q, q, q}, attrs({{"left_window_size", int_attr(2)}}), 25}),
            "left_window_size=2"));
  CHECK(has(refused({"Attention", {q, q, q}, {}, 23, 4}), "qk_matmul_output"));
  auto q3 = random_f32({1, 3, 4}, rng);
  CHECK(has(refused({"Attention", {q3, q3, q3}, {}, 23}), "q_num_heads and kv_num_heads"));
  CHECK(has(refused({"Attention", {q, q, q}, {}, 22}), "exists from opset 23"));
  CHECK(has(refused({"Attention", {q, q, q, f32({2, 3}, {0, 0, 0, 0, 0, 0})}, {}, 23}),
            "does not broadcast"));
}

TEST_CASE("Gelu is FusedGelu's erf form; tanh is its approximation, FusedGeluTanh") {
  std::mt19937 rng(10);
  auto x = random_f32({64}, rng, 3.0f);
  auto erf = ok1({"Gelu", {x}, {}, 20}).values<float>();
  CHECK(relative_error(erf, ok1({"FusedGelu", {x}}).values<float>()) < 1e-7);
  auto approx = ok1({"Gelu", {x}, attrs({{"approximate", string_attr("tanh")}}), 20});
  CHECK(relative_error(approx.values<float>(), erf) < 1e-3);
  CHECK(approx.values<float>() != erf);
  // FusedGeluTanh is the tanh form, against its formula in double.
  auto fused = ok1({"FusedGeluTanh", {x}}).values<float>();
  CHECK(relative_error(approx.values<float>(), fused) < 1e-7);
  std::vector<float> want;
  const double pi = 3.14159265358979323846;
  for (float v : x.values<float>())
    want.push_back(static_cast<float>(
      0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (v + 0.044715 * v * v * v)))));
  CHECK(relative_error(fused, want) < 1e-6);
  CHECK(has(refused({"Gelu", {x}, attrs({{"approximate", string_attr("sigmoid")}}), 20}),
            "approximate='sigmoid'"));
  CHECK(has(refused({"Gelu", {x}, {}, 17}), "exists from opset 20"));
}

TEST_CASE("RMSNormalization over the last axes, scale broadcast") {
  // [3, 4] and [6, 8]: root mean squares sqrt(12.5) and sqrt(50), scales 1 and 2.
  auto y = ok1({"RMSNormalization", {f32({2, 2}, {3, 4, 6, 8}), f32({2}, {1, 2})},
                attrs({{"epsilon", float_attr(0)}}), 23});
  auto v = y.values<float>();
  CHECK(v[0] == doctest::Approx(3 / std::sqrt(12.5)));
  CHECK(v[1] == doctest::Approx(2 * 4 / std::sqrt(12.5)));
  CHECK(v[2] == doctest::Approx(6 / std::sqrt(50.0)));
  // axis 0 normalizes the whole tensor: sqrt((9 + 16 + 36 + 64) / 4).
  auto all = ok1({"RMSNormalization", {f32({2, 2}, {3, 4, 6, 8}), f32({1}, {1})},
                  attrs({{"axis", int_attr(0)}, {"epsilon", float_attr(0)}}), 23});
  CHECK(all.values<float>()[3] == doctest::Approx(8 / std::sqrt(125.0 / 4)));
  CHECK(has(refused({"RMSNormalization", {f32({2, 2}, {3, 4, 6, 8}), f32({3}, {1, 1, 1})}, {}, 23}),
            "does not broadcast"));
  CHECK(has(refused({"RMSNormalization", {f32({2}, {3, 4}), f32({2}, {1, 1})},
                     attrs({{"stash_type", int_attr(10)}}), 23}),
            "stash_type=10"));
}

TEST_CASE("QuantizeLinear rounds halves to even and saturates; DequantizeLinear inverts it") {
  // x / 0.5 + 10: 2.5 -> 2 (even) -> 12; -200 -> 0 (saturated); 1.5 -> 2 -> 12; 400 -> 255.
  auto x = f32({4}, {1.25f, -100, 0.75f, 200});
  auto s = f32({}, {0.5f});
  auto z = make<uint8_t>(datatype::uint8, {}, {10});
  auto q = ok1({"QuantizeLinear", {x, s, z}});
  CHECK(q.dtype == datatype::uint8);
  CHECK(q.values<uint8_t>() == std::vector<uint8_t>{12, 0, 12, 255});
  CHECK(ok1({"DequantizeLinear", {q, s, z}}).values<float>()
        == std::vector<float>{1, -5, 1, 122.5f});
  // Without a zero point: UINT8, or output_dtype (opset 21) INT8: -100 / 0.5 saturates at -128.
  CHECK(ok1({"QuantizeLinear", {x, s}}).values<uint8_t>() == std::vector<uint8_t>{2, 0, 2, 255});
  auto i8 = ok1({"QuantizeLinear", {x, s}, attrs({{"output_dtype", int_attr(3)}}), 21});
  CHECK(i8.dtype == datatype::int8);
  CHECK(i8.values<int8_t>() == std::vector<int8_t>{2, -128, 2, 127});
  // Per axis 0 of [2, 2]: scales 1 and 0.25, zero points 0 and -5.
  auto xs = f32({2, 2}, {1.4f, -2.6f, 0.625f, -0.875f});
  auto ss = f32({2}, {1, 0.25f});
  auto zs = make<int8_t>(datatype::int8, {2}, {0, -5});
  auto qa = ok1({"QuantizeLinear", {xs, ss, zs}, attrs({{"axis", int_attr(0)}})});
  CHECK(qa.values<int8_t>() == std::vector<int8_t>{1, -3, -3, -9}); // 2.5 -> 2, -3.5 -> -4
  auto back = ok1({"DequantizeLinear", {qa, ss, zs}, attrs({{"axis", int_attr(0)}})});
  CHECK(back.values<float>() == std::vector<float>{1, -3, 0.5f, -1});
  CHECK(has(refused({"QuantizeLinear", {xs, ss},
                     attrs({{"axis", int_attr(1)}, {"block_size", int_attr(2)}}), 21}),
            "block_size=2"));
  CHECK(has(refused({"QuantizeLinear", {x, s}, attrs({{"output_dtype", int_attr(4)}}), 21}),
            "output_dtype=4"));
  CHECK(has(refused({"QuantizeLinear", {xs, f32({3}, {1, 1, 1})}}), "one value per element"));
  CHECK(has(refused({"DequantizeLinear", {x, s}}), "is FP32"));
}

TEST_CASE("ReduceMax, ReduceMin, ReduceProd: axes as attribute and input, keepdims, empty") {
  auto x = f32({2, 3}, {1, 5, -2, 4, 0, 3});
  auto mx = ok1({"ReduceMax", {x}, attrs({{"axes", ints_attr({1})}, {"keepdims", int_attr(0)}})});
  CHECK(mx.shape == std::vector<int64_t>{2});
  CHECK(mx.values<float>() == std::vector<float>{5, 4});
  auto mn = ok1({"ReduceMin", {x, constant(i64({1}, {0}))}, {}, 18});
  CHECK(mn.shape == std::vector<int64_t>{1, 3});
  CHECK(mn.values<float>() == std::vector<float>{1, 0, -2});
  CHECK(ok1({"ReduceProd", {x}}).values<float>() == std::vector<float>{0});
  CHECK(ok1({"ReduceProd", {x, constant(i64({0}, {}))},
             attrs({{"noop_with_empty_axes", int_attr(1)}}), 18})
          .values<float>() == x.values<float>());
  // An empty axis gives the reduction's identity from opset 18 on.
  auto empty = f32({2, 0}, {});
  CHECK(ok1({"ReduceMax", {empty, constant(i64({1}, {1}))}, {}, 18}).values<float>()
        == std::vector<float>{-inf_f, -inf_f});
  CHECK(has(refused({"ReduceMax", {empty}, attrs({{"axes", ints_attr({1})}})}), "undefined"));
  CHECK(has(refused({"ReduceMax", {x, i64({1}, {0})}, {}, 18}), "known before the model runs"));
  CHECK(ok1({"ReduceMax", {i64({3}, {-5, 7, 2})}}).values<int64_t>() == std::vector<int64_t>{7});
  // BOOL from opset 20: ReduceMax is any, ReduceMin all.
  auto flags = make<uint8_t>(datatype::bool_, {2, 2}, {1, 0, 0, 0});
  auto axis1 = constant(i64({1}, {1}));
  CHECK(ok1({"ReduceMax", {flags, axis1}, {}, 20}).values<uint8_t>() == std::vector<uint8_t>{1, 0});
  CHECK(ok1({"ReduceMin", {flags}, {}, 20}).values<uint8_t>() == std::vector<uint8_t>{0});
  CHECK(has(refused({"ReduceMax", {flags, axis1}, {}, 18}), "BOOL exists from opset 20"));
  CHECK(has(refused({"ReduceProd", {flags}, {}, 20}), "is BOOL"));
}

namespace {

/// Each of `got` equals `want` within `tolerance` relative; NaN and infinities exactly.
void check_near(const std::vector<float>& got, const std::vector<double>& want,
                double tolerance = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isnan(want[i]))
      CHECK(std::isnan(got[i]));
    else if (std::isinf(want[i]))
      CHECK(static_cast<double>(got[i]) == want[i]);
    else
      CHECK(std::fabs(got[i] - want[i]) <= tolerance * std::max(1.0, std::fabs(want[i])));
  }
}

} // namespace

TEST_CASE("ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp: axes as "
          "attribute and input, keepdims, negative axes") {
  // Rows {3, -4, 0} and {-1, 2, 2}: |x| sums 7 and 5, squares 25 and 9; columns'
  // |x| sums 4, 6, 2 and squares 10, 20, 4.
  auto x = f32({2, 3}, {3, -4, 0, -1, 2, 2});
  auto l1 = ok1({"ReduceL1", {x}, attrs({{"axes", ints_attr({1})}, {"keepdims", int_attr(0)}})});
  CHECK(l1.shape == std::vector<int64_t>{2});
  CHECK(l1.values<float>() == std::vector<float>{7, 5});
  auto l2 = ok1({"ReduceL2", {x, constant(i64({1}, {0}))}, {}, 18});
  CHECK(l2.shape == std::vector<int64_t>{1, 3});
  check_near(l2.values<float>(), {std::sqrt(10.0), std::sqrt(20.0), 2});
  auto sq = ok1({"ReduceSumSquare", {x, constant(i64({1}, {-1}))}, {}, 18});
  CHECK(sq.shape == std::vector<int64_t>{2, 1});
  CHECK(sq.values<float>() == std::vector<float>{25, 9});
  auto sq13 = ok1({"ReduceSumSquare", {x},
                   attrs({{"axes", ints_attr({-2})}, {"keepdims", int_attr(0)}}), 13});
  CHECK(sq13.shape == std::vector<int64_t>{3});
  CHECK(sq13.values<float>() == std::vector<float>{10, 20, 4});
  // Positive rows summing to 8 and 1, 9 in all.
  auto p = f32({2, 3}, {1, 2, 5, 0.5f, 0.25f, 0.25f});
  auto all = ok1({"ReduceLogSum", {p}, {}, 13});
  CHECK(all.shape == std::vector<int64_t>{1, 1});
  check_near(all.values<float>(), {std::log(9.0)});
  auto rows = ok1({"ReduceLogSum", {p, constant(i64({1}, {1}))},
                   attrs({{"keepdims", int_attr(0)}}), 18});
  check_near(rows.values<float>(), {std::log(8.0), 0});
  auto lse = ok1({"ReduceLogSumExp", {x, constant(i64({1}, {1}))},
                  attrs({{"keepdims", int_attr(0)}}), 18});
  CHECK(lse.shape == std::vector<int64_t>{2});
  check_near(lse.values<float>(), {std::log(std::exp(3.0) + std::exp(-4.0) + 1.0),
                                   std::log(std::exp(-1.0) + 2 * std::exp(2.0))});
}

TEST_CASE("ReduceLogSumExp stays finite where e^x overflows; infinities and NaN") {
  // log(2 e^1000) = 1000 + log 2; e^1000 is infinite even in double.
  auto big = f32({2, 2}, {1000, 1000, -1000, -1000});
  auto y = ok1({"ReduceLogSumExp", {big}, attrs({{"axes", ints_attr({1})}}), 13});
  check_near(y.values<float>(), {1000 + std::log(2.0), -1000 + std::log(2.0)});
  // log(e^inf + e^1) = inf, log(0 + 0) = -inf, NaN stays NaN.
  auto edges = f32({3, 2}, {inf_f, 1, -inf_f, -inf_f, nan_f, 0});
  auto e = ok1({"ReduceLogSumExp", {edges}, attrs({{"axes", ints_attr({1})}}), 13});
  check_near(e.values<float>(), {INFINITY, -INFINITY, NAN});
}

TEST_CASE("the sum reductions' noop_with_empty_axes still applies |x|, x squared, log x") {
  // ONNX 1.23: reducing over no axes leaves each element's own reduction.
  auto x = f32({2, 3}, {3, -4, 0, -1, 2, 2});
  auto none = constant(i64({0}, {}));
  auto noop = attrs({{"noop_with_empty_axes", int_attr(1)}});
  auto abs_x = std::vector<float>{3, 4, 0, 1, 2, 2};
  auto l1 = ok1({"ReduceL1", {x, none}, noop, 18});
  CHECK(l1.shape == std::vector<int64_t>{2, 3});
  CHECK(l1.values<float>() == abs_x);
  CHECK(ok1({"ReduceL1", {x}, noop, 18}).values<float>() == abs_x); // axes left out
  CHECK(ok1({"ReduceL2", {x, none}, noop, 18}).values<float>() == abs_x);
  CHECK(ok1({"ReduceSumSquare", {x, none}, noop, 18}).values<float>()
        == std::vector<float>{9, 16, 0, 1, 4, 4});
  CHECK(ok1({"ReduceLogSumExp", {x, none}, noop, 18}).values<float>() == x.values<float>());
  auto p = f32({4}, {1, 2, 0.5f, 0});
  check_near(ok1({"ReduceLogSum", {p, none}, noop, 18}).values<float>(),
             {0, std::log(2.0), std::log(0.5), -INFINITY});
  // Without noop_with_empty_axes, empty axes reduce every axis.
  auto every = ok1({"ReduceL1", {x, none}, {}, 18});
  CHECK(every.shape == std::vector<int64_t>{1, 1});
  CHECK(every.values<float>() == std::vector<float>{12});
}

TEST_CASE("the sum reductions of an empty axis: 0, and log 0 for the logs, at every opset") {
  auto empty = f32({2, 0}, {});
  auto axis1 = constant(i64({1}, {1}));
  for (const char* op : {"ReduceL1", "ReduceL2", "ReduceSumSquare"}) {
    CAPTURE(op);
    auto y = ok1({op, {empty, axis1}, attrs({{"keepdims", int_attr(0)}}), 18});
    CHECK(y.shape == std::vector<int64_t>{2});
    CHECK(y.values<float>() == std::vector<float>{0, 0});
    // Unlike ReduceMax's, their empty sums are defined before opset 18 too.
    CHECK(ok1({op, {empty}, attrs({{"axes", ints_attr({1})}}), 13}).values<float>()
          == std::vector<float>{0, 0});
  }
  for (const char* op : {"ReduceLogSum", "ReduceLogSumExp"}) {
    CAPTURE(op);
    CHECK(ok1({op, {empty, axis1}, {}, 18}).values<float>() == std::vector<float>{-inf_f, -inf_f});
  }
}

TEST_CASE("the sum reductions of integers; the types and forms they refuse") {
  CHECK(ok1({"ReduceL1", {i64({3}, {-3, 4, -5})}}).values<int64_t>() == std::vector<int64_t>{12});
  CHECK(ok1({"ReduceL1", {make<uint32_t>(datatype::uint32, {2}, {7, 8})}}).values<uint32_t>()
        == std::vector<uint32_t>{15});
  // 65536^2 + 1 = 2^32 + 1 wraps to 1 in INT32, as the type's own sum does.
  CHECK(ok1({"ReduceSumSquare", {make<int32_t>(datatype::int32, {2}, {65536, 1})}})
          .values<int32_t>() == std::vector<int32_t>{1});
  // sqrt(26) = 5.10 and log(7) = 1.95 truncate.
  CHECK(ok1({"ReduceL2", {i64({3}, {3, 4, 1})}}).values<int64_t>() == std::vector<int64_t>{5});
  CHECK(ok1({"ReduceLogSum", {i64({2}, {2, 5})}, {}, 27}).values<int64_t>()
        == std::vector<int64_t>{1});
  // ReduceLogSum-28 and ReduceLogSumExp-28 take floats only.
  CHECK(refused({"ReduceLogSumExp", {i64({2}, {1, 2})}, {}, 28})
        == "input 'in0' is INT64; ReduceLogSumExp-28 (opset 28) takes floating-point tensors "
           "only: Cast it to FLOAT first");
  CHECK(has(refused({"ReduceLogSum", {i64({2}, {1, 2})}, {}, 28}), "ReduceLogSum-28"));
  CHECK(refused({"ReduceL1", {make<int8_t>(datatype::int8, {2}, {1, -1})}})
        == "input 'in0' is INT8; the engine runs ReduceL1 on FP32, INT64, INT32, UINT64, UINT32");
  auto x = f32({2, 3}, {3, -4, 0, -1, 2, 2});
  CHECK(refused({"ReduceL2", {x, constant(i64({1}, {1}))}, {}, 17})
        == "ReduceL2's axes input exists from opset 18; before it axes is an attribute");
  CHECK(has(refused({"ReduceSumSquare", {x, i64({1}, {1})}, {}, 18}),
            "known before the model runs"));
  CHECK(refused({"ReduceLogSumExp", {x}, attrs({{"axes", ints_attr({2})}})})
        == "axis 2 is out of range for rank 2");
}

TEST_CASE("GlobalMaxPool: the maximum of each channel, NaN as ReduceMax, an empty plane") {
  auto x = f32({1, 2, 2, 2}, {1, 5, -3, 2, -1, -7, -2, -4});
  for (int64_t opset : {13, 22}) {
    auto y = ok1({"GlobalMaxPool", {x}, {}, opset});
    CHECK(y.shape == std::vector<int64_t>{1, 2, 1, 1});
    CHECK(y.values<float>() == std::vector<float>{5, -1});
  }
  // A NaN anywhere in the plane wins; all -inf stays -inf.
  auto odd = ok1({"GlobalMaxPool", {f32({3, 1, 3}, {1, nan_f, 3, -inf_f, -inf_f, -inf_f, nan_f,
                                                     1, 2})}});
  CHECK(odd.shape == std::vector<int64_t>{3, 1, 1});
  check_near(odd.values<float>(), {NAN, -INFINITY, NAN});
  // Rank 2 has no spatial axes: each element is its own plane.
  auto flat = ok1({"GlobalMaxPool", {f32({2, 2}, {1, 2, 3, 4})}});
  CHECK(flat.shape == std::vector<int64_t>{2, 2});
  CHECK(flat.values<float>() == std::vector<float>{1, 2, 3, 4});
  auto empty = ok1({"GlobalMaxPool", {f32({1, 2, 0}, {})}});
  CHECK(empty.shape == std::vector<int64_t>{1, 2, 1});
  CHECK(empty.values<float>() == std::vector<float>{-inf_f, -inf_f});
  CHECK(refused({"GlobalMaxPool", {f32({3}, {1, 2, 3})}})
        == "GlobalMaxPool needs an input of rank 2 or more ([N, C, d1, ...]); 'in0' is [3]");
  CHECK(refused({"GlobalMaxPool", {i64({1, 1, 2}, {1, 2})}})
        == "input 'in0' is INT64; the engine runs GlobalMaxPool on FP32");
}

namespace {

namespace pb = ::onnx;

/// FP16 x [batch, 2, 2, 2] -> l2 = ReduceL2(x, axes [2, 3], keepdims 0)  FP16 [batch, 2]
///                         -> max = GlobalMaxPool(x)                      FP16 [batch, 2, 1, 1]
/// at opset 18, as an exporter writes it (the axes an INT64 initializer).
std::string half_reductions_model() {
  pb::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("ops_more.test");
  m.add_opset_import()->set_version(18);
  auto* g = m.mutable_graph();
  g->set_name("half_reductions");
  auto declare = [](pb::ValueInfoProto* v, const std::string& name,
                    const std::vector<int64_t>& dims) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(pb::TensorProto::FLOAT16);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    for (auto d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  };
  declare(g->add_input(), "x", {2, 2, 2});
  auto* axes = g->add_initializer();
  axes->set_name("axes");
  axes->set_data_type(pb::TensorProto::INT64);
  axes->add_dims(2);
  axes->add_int64_data(2);
  axes->add_int64_data(3);
  auto* l2 = g->add_node();
  l2->set_op_type("ReduceL2");
  l2->set_name("l2");
  l2->add_input("x");
  l2->add_input("axes");
  l2->add_output("l2");
  auto* keep = l2->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(pb::AttributeProto::INT);
  keep->set_i(0);
  auto* pool = g->add_node();
  pool->set_op_type("GlobalMaxPool");
  pool->set_name("max");
  pool->add_input("x");
  pool->add_output("max");
  declare(g->add_output(), "l2", {2});
  declare(g->add_output(), "max", {2, 1, 1});
  return m.SerializeAsString();
}

} // namespace

// FP16 bits worked out by hand: 1 = 0x3C00, 2 = 0x4000, 3 = 0x4200, 4 = 0x4400,
// 6 = 0x4600, 0.5 = 0x3800, a minus sign 0x8000. Between 4 and 8 an FP16 step is
// 2^-8: sqrt(30) = 5.47723 -> 1402 steps = 5.4765625 = 0x4400 + 378 = 0x457A;
// sqrt(49.25) = 7.01783 -> 1797 steps = 7.01953125 = 0x4400 + 773 = 0x4705.
TEST_CASE("an FP16 model of ReduceL2 and GlobalMaxPool loads and runs through the CPU backend") {
  auto g = import_model_bytes(half_reductions_model(), "half_reductions.onnx");
  REQUIRE_MESSAGE(g, (g ? "" : g.error().message));
  onnx_model_config cfg;
  cfg.model_file = "half_reductions.onnx";
  cfg.config.name = "half_reductions";
  auto model = load_onnx_graph(std::move(*g), cfg);
  REQUIRE_MESSAGE(model, (model ? "" : model.error().message));
  auto instance = model->make_instance();

  // Row 0: channels {1, 2, -3, 4} and {0.5, -2, 3, 6}; row 1: all -1, all 0.
  std::vector<uint16_t> x{0x3C00, 0x4000, 0xC200, 0x4400, 0x3800, 0xC000, 0x4200, 0x4600,
                          0xBC00, 0xBC00, 0xBC00, 0xBC00, 0x0000, 0x0000, 0x0000, 0x0000};
  executor::batch_view view;
  view.rows = 2;
  view.inputs.push_back({"x", datatype::fp16, {2, 2, 2, 2},
                         reinterpret_cast<const uint8_t*>(x.data()), x.size() * 2});
  named_writer out;
  auto r = instance->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);
  CHECK(out.types.at("l2") == datatype::fp16);
  CHECK(out.shapes.at("l2") == std::vector<int64_t>{2, 2});
  // sqrt(1 + 4 + 9 + 16), sqrt(0.25 + 4 + 9 + 36), sqrt(4 * 1) = 2, 0.
  CHECK(out.values<uint16_t>("l2") == std::vector<uint16_t>{0x457A, 0x4705, 0x4000, 0x0000});
  CHECK(out.types.at("max") == datatype::fp16);
  CHECK(out.shapes.at("max") == std::vector<int64_t>{2, 2, 1, 1});
  CHECK(out.values<uint16_t>("max") == std::vector<uint16_t>{0x4400, 0x4600, 0xBC00, 0x0000});
}

TEST_CASE("the unary functions and PRelu at their edges") {
  auto run = [](const char* op, std::vector<float> v, std::map<std::string, attribute> a = {}) {
    auto n = static_cast<int64_t>(v.size());
    return ok1({op, {f32({n}, v)}, a, 18}).values<float>();
  };
  CHECK(run("Round", {0.5f, 1.5f, -2.5f, 2.6f}) == std::vector<float>{0, 2, -2, 3});
  CHECK(run("Sign", {-3, 0, 2}) == std::vector<float>{-1, 0, 1});
  CHECK(ok1({"Sign", {i64({3}, {-3, 0, 2})}}).values<int64_t>() == std::vector<int64_t>{-1, 0, 1});
  CHECK(run("Floor", {-1.5f, 1.5f}) == std::vector<float>{-2, 1});
  CHECK(run("Ceil", {-1.5f, 1.5f}) == std::vector<float>{-1, 2});
  CHECK(run("ThresholdedRelu", {0.5f, 1, 2}) == std::vector<float>{0, 0, 2}); // alpha 1, strict
  CHECK(run("LeakyRelu", {-2, 3}) == std::vector<float>{-0.02f, 3});           // alpha 0.01
  CHECK(run("Softsign", {-1, 3}) == std::vector<float>{-0.5f, 0.75f});
  // Softplus stays finite where exp overflows: log(1 + e^100) = 100.
  CHECK(run("Softplus", {100, -100})[0] == doctest::Approx(100));
  CHECK(run("Softplus", {0})[0] == doctest::Approx(std::log(2.0f)));
  CHECK(run("Elu", {-1}, attrs({{"alpha", float_attr(2)}}))[0]
        == doctest::Approx(2 * (std::exp(-1.0f) - 1)));
  CHECK(run("Mish", {1})[0] == doctest::Approx(std::tanh(std::log1p(std::exp(1.0f)))));
  // PRelu's slope per channel ([2, 1] against [2, 2]).
  auto p = ok1({"PRelu", {f32({2, 2}, {-1, 2, -3, 4}), f32({2, 1}, {0.5f, 2})}});
  CHECK(p.values<float>() == std::vector<float>{-0.5f, 2, -6, 4});
  CHECK(has(refused({"PRelu", {f32({2}, {1, 2}), f32({3}, {1, 2, 3})}}), "does not broadcast"));
  CHECK(has(refused({"Mish", {f32({1}, {1})}, {}, 17}), "exists from opset 18"));
  CHECK(has(refused({"Sin", {i64({1}, {1})}}), "runs Sin on FP32"));
}
