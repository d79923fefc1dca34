/// The operators of ops_simple.cpp against values worked out by hand (each
/// case says how), through the registry's shape inference and reference kernels
/// (op_registry.hpp): broadcasting, NaN, infinities, signed zeros, Mod's two sign rules,
/// GatherElements' negative indices and axes, the errors for types and opsets
/// the kernels do not take; then a model built as an exporter writes it,
/// imported and served by the CPU backend.

#include "onnx/ops_simple.hpp"

#include "onnx/importer.hpp"
#include "onnx/output_testing.hpp"
#include "onnx_cpu/onnx_backend.hpp"
#include "onnx/op_registry.hpp"
#include "onnx/passes.hpp"

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

using namespace caf_serving;
using namespace caf_serving::onnx;
using caf_serving::onnx::testing::named_writer;

namespace {

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

/// A tensor given to or returned by one operator.
struct tensor {
  datatype dtype = datatype::fp32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  template <class T>
  std::vector<T> values() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};

template <class T>
tensor make(datatype dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  REQUIRE(static_cast<int64_t>(v.size()) == element_count(shape));
  tensor t{dtype, std::move(shape), std::vector<uint8_t>(v.size() * sizeof(T))};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

tensor f32(std::vector<int64_t> shape, const std::vector<float>& v) {
  return make(datatype::fp32, std::move(shape), v);
}
tensor i64(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  return make(datatype::int64, std::move(shape), v);
}
tensor i32(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  return make(datatype::int32, std::move(shape), v);
}

/// Runs `op` on `inputs` (each a graph input, none a constant): its shape
/// inference, then its reference kernel. The string is inference's error.
std::variant<tensor, std::string> run_op(const std::string& op, const std::vector<tensor>& inputs,
                                         const std::map<std::string, attribute>& attrs = {},
                                         int64_t opset = 17) {
  graph g;
  g.opset = opset;
  std::vector<int> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    int v = g.add_value("in" + std::to_string(i), inputs[i].dtype, inputs[i].shape, true);
    ins.push_back(v);
  }
  int y = g.add_value("y");
  auto& n = g.add_node(op, op + "_0", ins, {y});
  n.attrs = attrs;
  auto inf = infer_shapes(g, n);
  if (auto* e = std::get_if<std::string>(&inf))
    return *e;
  const auto& o = std::get<std::vector<inferred>>(inf).at(0);
  tensor out{o.dtype, o.shape,
             std::vector<uint8_t>(element_count(o.shape) * element_size(o.dtype))};
  std::vector<tensor_ref> in_refs;
  for (const auto& t : inputs)
    in_refs.push_back({t.dtype, t.shape, const_cast<uint8_t*>(t.bytes.data())});
  run_reference(n, in_refs, {{out.dtype, out.shape, out.bytes.data()}});
  return out;
}

tensor ok(std::variant<tensor, std::string> r) {
  if (auto* e = std::get_if<std::string>(&r))
    FAIL("inference refused: " << *e);
  return std::get<tensor>(r);
}

std::string refused(std::variant<tensor, std::string> r) {
  REQUIRE(std::holds_alternative<std::string>(r));
  return std::get<std::string>(r);
}

attribute int_attr(int64_t v) {
  attribute a;
  a.kind = attribute::kind_t::i;
  a.i = v;
  return a;
}

attribute float_attr(float v) {
  attribute a;
  a.kind = attribute::kind_t::f;
  a.f = v;
  return a;
}

/// Equal element by element, NaN equal to NaN, and with the same sign of zero.
void check_floats(const std::vector<float>& got, const std::vector<float>& want,
                  float tolerance = 0) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
    } else if (std::isinf(want[i]) || tolerance == 0) {
      CHECK(got[i] == want[i]);
      CHECK(std::signbit(got[i]) == std::signbit(want[i]));
    } else {
      CHECK(std::fabs(got[i] - want[i]) <= tolerance * std::max(1.0f, std::fabs(want[i])));
    }
  }
}

std::vector<bool> bools(const tensor& t) {
  std::vector<bool> v;
  for (auto b : t.bytes) v.push_back(b != 0);
  return v;
}

} // namespace

TEST_CASE("the importer lists every operator of the table, sorted") {
  const auto& all = supported_operators();
  CHECK(std::is_sorted(all.begin(), all.end()));
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  for (const auto& op : {"Abs", "ArgMax", "CumSum", "Exp", "GatherElements", "HardSigmoid",
                         "HardSwish", "IsInf", "IsNaN", "Log", "Max", "Min", "Mod", "Neg",
                         "Reciprocal"}) {
    CHECK_MESSAGE(std::binary_search(all.begin(), all.end(), op), op);
    CHECK(first_versions(simple_operator_table()).count(op) == 1);
  }
}

TEST_CASE("IsNaN and IsInf answer BOOL; IsInf detects either sign or both") {
  auto x = f32({2, 3}, {1.0f, nan_f, inf_f, -inf_f, 0.0f, -nan_f});
  auto nan = ok(run_op("IsNaN", {x}));
  CHECK(nan.dtype == datatype::bool_);
  CHECK(nan.shape == std::vector<int64_t>{2, 3});
  CHECK(bools(nan) == std::vector<bool>{false, true, false, false, false, true});
  CHECK(bools(ok(run_op("IsInf", {x})))
        == std::vector<bool>{false, false, true, true, false, false});
  CHECK(bools(ok(run_op("IsInf", {x}, {{"detect_negative", int_attr(0)}})))
        == std::vector<bool>{false, false, true, false, false, false});
  CHECK(bools(ok(run_op("IsInf", {x}, {{"detect_positive", int_attr(0)}})))
        == std::vector<bool>{false, false, false, true, false, false});
  CHECK(bools(ok(run_op("IsNaN", {f32({}, {nan_f})}))) == std::vector<bool>{true});
  CHECK(refused(run_op("IsNaN", {i64({1}, {3})})).find("runs IsNaN on FP32") != std::string::npos);
}

TEST_CASE("Abs and Neg: signed zeros, NaN, infinities, integers") {
  auto x = f32({6}, {-1.5f, 2.0f, -0.0f, 0.0f, -inf_f, nan_f});
  check_floats(ok(run_op("Abs", {x})).values<float>(), {1.5f, 2.0f, 0.0f, 0.0f, inf_f, nan_f});
  check_floats(ok(run_op("Neg", {x})).values<float>(), {1.5f, -2.0f, 0.0f, -0.0f, inf_f, nan_f});
  constexpr int64_t big = std::numeric_limits<int64_t>::max();
  auto ints = i64({4}, {-3, 0, 5, -big});
  auto abs = ok(run_op("Abs", {ints}));
  CHECK(abs.dtype == datatype::int64);
  CHECK(abs.values<int64_t>() == std::vector<int64_t>{3, 0, 5, big});
  CHECK(ok(run_op("Neg", {ints})).values<int64_t>() == std::vector<int64_t>{3, 0, -5, big});
  CHECK(ok(run_op("Abs", {i32({2}, {-7, 7})})).values<int32_t>() == std::vector<int32_t>{7, 7});
  auto u8 = make<uint8_t>(datatype::uint8, {2}, {0, 255});
  CHECK(ok(run_op("Abs", {u8})).values<uint8_t>() == std::vector<uint8_t>{0, 255});
  CHECK(refused(run_op("Neg", {u8})).find("is UINT8") != std::string::npos);
}

TEST_CASE("Log, Exp and Reciprocal at their edges") {
  const float e = std::exp(1.0f);
  // log(0) = -inf, log(-1) = NaN, log(inf) = inf.
  check_floats(ok(run_op("Log", {f32({5}, {1.0f, e, 0.0f, -1.0f, inf_f})})).values<float>(),
               {0.0f, 1.0f, -inf_f, nan_f, inf_f}, 1e-6f);
  check_floats(ok(run_op("Exp", {f32({5}, {0.0f, 1.0f, -inf_f, inf_f, nan_f})})).values<float>(),
               {1.0f, e, 0.0f, inf_f, nan_f}, 1e-6f);
  // 1/(+-0) is an infinity of the zero's sign.
  check_floats(ok(run_op("Reciprocal", {f32({5}, {2.0f, -4.0f, 0.0f, -0.0f, inf_f})}))
                 .values<float>(),
               {0.5f, -0.25f, inf_f, -inf_f, 0.0f});
  CHECK(refused(run_op("Exp", {i64({1}, {1})})).find("FP32") != std::string::npos);
}

TEST_CASE("Max and Min over any number of inputs, broadcast as numpy does") {
  // [2,1], [3] and a scalar broadcast to [2,3]:
  // row 0 = max(1, {2,3,4}, 3.5) = {3.5,3.5,4}; row 1 = max(5, ...) = 5.
  auto a = f32({2, 1}, {1.0f, 5.0f});
  auto b = f32({3}, {2.0f, 3.0f, 4.0f});
  auto c = f32({}, {3.5f});
  auto mx = ok(run_op("Max", {a, b, c}));
  CHECK(mx.shape == std::vector<int64_t>{2, 3});
  check_floats(mx.values<float>(), {3.5f, 3.5f, 4.0f, 5.0f, 5.0f, 5.0f});
  // row 0 = min(1, ...) = 1; row 1 = min(5, {2,3,4}, 3.5) = {2,3,3.5}.
  check_floats(ok(run_op("Min", {a, b, c})).values<float>(), {1, 1, 1, 2, 3, 3.5f});
  // One input is a copy; NaN wins, as numpy.maximum / ONNX Runtime.
  check_floats(ok(run_op("Max", {b})).values<float>(), {2, 3, 4});
  check_floats(ok(run_op("Max", {f32({3}, {1, nan_f, -inf_f}), f32({3}, {nan_f, 0, -1})}))
                 .values<float>(),
               {nan_f, nan_f, -1});
  check_floats(ok(run_op("Min", {f32({3}, {1, nan_f, -inf_f}), f32({3}, {nan_f, 0, -1})}))
                 .values<float>(),
               {nan_f, nan_f, -inf_f});
  // INT64 as in torch's exports of shape arithmetic: max(dims, 1).
  auto dims = ok(run_op("Max", {i64({3}, {0, 7, -2}), i64({1}, {1})}));
  CHECK(dims.dtype == datatype::int64);
  CHECK(dims.values<int64_t>() == std::vector<int64_t>{1, 7, 1});
  CHECK(ok(run_op("Min", {i64({3}, {0, 7, -2}), i64({1}, {1})})).values<int64_t>()
        == std::vector<int64_t>{0, 1, -2});
  CHECK(refused(run_op("Max", {a, i64({1}, {1})})).find("differ in type") != std::string::npos);
  CHECK(refused(run_op("Min", {a, f32({3, 3}, std::vector<float>(9))})).find("do not broadcast")
        != std::string::npos);
}

TEST_CASE("HardSigmoid and HardSwish, default and given alpha and beta") {
  // 0.2x + 0.5 clipped to [0, 1].
  check_floats(ok(run_op("HardSigmoid", {f32({6}, {-3, -2.5f, 0, 1, 2.5f, 3})})).values<float>(),
               {0, 0, 0.5f, 0.7f, 1, 1}, 1e-6f);
  // 0.5x + 0.25 clipped.
  check_floats(ok(run_op("HardSigmoid", {f32({4}, {-1, 0, 1, 2})},
                         {{"alpha", float_attr(0.5f)}, {"beta", float_attr(0.25f)}}))
                 .values<float>(),
               {0, 0.25f, 0.75f, 1}, 1e-6f);
  // x * clip(x / 6 + 1/2, 0, 1).
  check_floats(ok(run_op("HardSwish", {f32({7}, {-4, -3, -1, 0, 1, 3, 4})})).values<float>(),
               {0, 0, -1.0f / 3, 0, 2.0f / 3, 3, 4}, 1e-6f);
  CHECK(refused(run_op("HardSwish", {f32({1}, {1})}, {}, 13)).find("exists from opset 14")
        != std::string::npos);
}

TEST_CASE("Mod: fmod=0 takes the divisor's sign, fmod=1 the dividend's") {
  auto a = i64({6}, {5, -5, 5, -5, 7, 3});
  auto b = i64({6}, {3, 3, -3, -3, 7, 0});
  // Python: 5 % 3 = 2, -5 % 3 = 1, 5 % -3 = -1, -5 % -3 = -2; zero divisor gives 0.
  CHECK(ok(run_op("Mod", {a, b})).values<int64_t>() == std::vector<int64_t>{2, 1, -1, -2, 0, 0});
  // C: the dividend's sign.
  CHECK(ok(run_op("Mod", {a, b}, {{"fmod", int_attr(1)}})).values<int64_t>()
        == std::vector<int64_t>{2, -2, 2, -2, 0, 0});
  // Broadcast [2,3] % [3], INT32: 5 % -4 = -3 in Python.
  CHECK(ok(run_op("Mod", {i32({2, 3}, {1, 2, 3, 4, 5, 6}), i32({3}, {4, -4, 5})}))
          .values<int32_t>()
        == std::vector<int32_t>{1, -2, 3, 0, -3, 1});
  constexpr int64_t lowest = std::numeric_limits<int64_t>::min();
  CHECK(ok(run_op("Mod", {i64({1}, {lowest}), i64({1}, {-1})})).values<int64_t>()
        == std::vector<int64_t>{0});
  // FLOAT with fmod=1 is C's fmod: the dividend's sign, -0 kept, NaN for x % 0 and inf % y.
  check_floats(ok(run_op("Mod",
                         {f32({7}, {5.5f, -5.5f, 5.5f, -5.5f, -0.0f, 1.0f, inf_f}),
                          f32({7}, {2, 2, -2, -2, 2, 0, 2})},
                         {{"fmod", int_attr(1)}}))
                 .values<float>(),
               {1.5f, -1.5f, 1.5f, -1.5f, -0.0f, nan_f, nan_f});
  check_floats(ok(run_op("Mod", {f32({1}, {3}), f32({1}, {inf_f})}, {{"fmod", int_attr(1)}}))
                 .values<float>(),
               {3});
  CHECK(refused(run_op("Mod", {f32({1}, {1}), f32({1}, {1})})).find("needs fmod=1")
        != std::string::npos);
  // Mod-28 defines fmod=0 on floats as numpy.mod (values from numpy 2.4 and ONNX Runtime
  // 1.32): the divisor's sign, a zero signed as the divisor, x with an infinite y of the
  // other sign gives y.
  check_floats(ok(run_op("Mod",
                         {f32({11}, {5.5f, -5.5f, 5.5f, -5.5f, 0.0f, -0.0f, 1, inf_f, 3, -3, 3}),
                          f32({11}, {2, 2, -2, -2, -2, 2, 0, 2, -inf_f, inf_f, inf_f})},
                         {}, 28))
                 .values<float>(),
               {1.5f, 0.5f, -0.5f, -1.5f, -0.0f, 0.0f, nan_f, nan_f, -inf_f, inf_f, 3});
}

TEST_CASE("GatherElements: ONNX's examples, negative indices, a negative axis, INT32 indices") {
  // The examples of ONNX's operator documentation.
  auto d2 = f32({2, 2}, {1, 2, 3, 4});
  check_floats(ok(run_op("GatherElements", {d2, i64({2, 2}, {0, 0, 1, 0})},
                         {{"axis", int_attr(1)}}))
                 .values<float>(),
               {1, 1, 4, 3});
  auto d3 = f32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto y = ok(run_op("GatherElements", {d3, i64({2, 3}, {1, 2, 0, 2, 0, 0})}));
  CHECK(y.shape == std::vector<int64_t>{2, 3});
  check_floats(y.values<float>(), {4, 8, 3, 7, 2, 3});
  // -1 is the last row, -2 the one before.
  check_floats(ok(run_op("GatherElements", {d3, i64({2, 3}, {-1, -2, 0, -2, 0, 0})}))
                 .values<float>(),
               {7, 5, 3, 4, 2, 3});
  // [2,2,3] holding 0..11, axis -1, indices [2,1,2] (smaller than data off the axis):
  // y[0][0] = data[0][0][{2,0}] = {2,0}; y[1][0] = data[1][0][{1,-1}] = {7,8}.
  std::vector<int64_t> iota(12);
  for (int64_t i = 0; i < 12; ++i) iota[i] = i;
  auto y3 = ok(run_op("GatherElements", {i64({2, 2, 3}, iota), i32({2, 1, 2}, {2, 0, 1, -1})},
                      {{"axis", int_attr(-1)}}));
  CHECK(y3.dtype == datatype::int64);
  CHECK(y3.shape == std::vector<int64_t>{2, 1, 2});
  CHECK(y3.values<int64_t>() == std::vector<int64_t>{2, 0, 7, 8});
  CHECK(refused(run_op("GatherElements", {d3, i64({3}, {0, 0, 0})})).find("same rank")
        != std::string::npos);
  CHECK(refused(run_op("GatherElements", {d3, i64({1, 1}, {0})}, {{"axis", int_attr(2)}}))
          .find("axis 2 is out of range")
        != std::string::npos);
  CHECK(refused(run_op("GatherElements", {d3, i64({1, 4}, {0, 0, 0, 0})})).find("larger than")
        != std::string::npos);
}

TEST_CASE("CumSum: inclusive, exclusive, reverse, and along a negative axis") {
  auto x = f32({5}, {1, 2, 3, 4, 5});
  auto axis0 = i64({}, {0});
  check_floats(ok(run_op("CumSum", {x, axis0})).values<float>(), {1, 3, 6, 10, 15});
  check_floats(ok(run_op("CumSum", {x, axis0}, {{"exclusive", int_attr(1)}})).values<float>(),
               {0, 1, 3, 6, 10});
  check_floats(ok(run_op("CumSum", {x, axis0}, {{"reverse", int_attr(1)}})).values<float>(),
               {15, 14, 12, 9, 5});
  check_floats(ok(run_op("CumSum", {x, axis0},
                         {{"reverse", int_attr(1)}, {"exclusive", int_attr(1)}}))
                 .values<float>(),
               {14, 12, 9, 5, 0});
  // transformers' position ids: cumsum of an INT64 mask along axis 1 (given as INT32 [1]).
  auto m = i64({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(ok(run_op("CumSum", {m, i32({1}, {1})})).values<int64_t>()
        == std::vector<int64_t>{1, 3, 6, 4, 9, 15});
  CHECK(ok(run_op("CumSum", {m, i64({}, {-2})})).values<int64_t>()
        == std::vector<int64_t>{1, 2, 3, 5, 7, 9});
  CHECK(refused(run_op("CumSum", {m, i64({2}, {0, 1})})).find("must be one INT64")
        != std::string::npos);
  // An axis computed at run time and out of range: zeros rather than a read past the shape.
  CHECK(ok(run_op("CumSum", {m, i64({}, {2})})).values<int64_t>() == std::vector<int64_t>(6, 0));
}

TEST_CASE("ArgMax: first or last of equal maxima, keepdims, NaN as ONNX Runtime takes it") {
  auto x = f32({2, 3}, {1, 5, 5, 7, -1, 7});
  auto y = ok(run_op("ArgMax", {x}, {{"axis", int_attr(1)}}));
  CHECK(y.dtype == datatype::int64);
  CHECK(y.shape == std::vector<int64_t>{2, 1});
  CHECK(y.values<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(ok(run_op("ArgMax", {x}, {{"axis", int_attr(-1)}, {"select_last_index", int_attr(1)}}))
          .values<int64_t>()
        == std::vector<int64_t>{2, 2});
  auto cols = ok(run_op("ArgMax", {x}, {{"keepdims", int_attr(0)}}));
  CHECK(cols.shape == std::vector<int64_t>{3});
  CHECK(cols.values<int64_t>() == std::vector<int64_t>{1, 0, 1});
  // ONNX Runtime 1.32: a NaN never compares larger, and wins only in first place.
  CHECK(ok(run_op("ArgMax", {f32({4}, {1, nan_f, 3, nan_f})})).values<int64_t>()
        == std::vector<int64_t>{2});
  CHECK(ok(run_op("ArgMax", {f32({3}, {nan_f, 1, 3})}, {{"select_last_index", int_attr(1)}}))
          .values<int64_t>()
        == std::vector<int64_t>{0});
  CHECK(ok(run_op("ArgMax", {i64({3}, {-5, -2, -9})})).values<int64_t>()
        == std::vector<int64_t>{1});
  CHECK(refused(run_op("ArgMax", {x}, {{"axis", int_attr(2)}})).find("out of range")
        != std::string::npos);
}

TEST_CASE("shape arithmetic through the new operators folds to constants before the model runs") {
  // torch's exports compute target shapes from Shape(x) with Max, Min, Abs and Mod,
  // then Reshape: the folded value must be a constant for Reshape's shape inference.
  // Here x [5,6] becomes [-1, 1, 3] = [10, 1, 3].
  graph g;
  g.opset = 17;
  int x = g.add_value("x", datatype::fp32, {-1, 6}, true);
  g.inputs.push_back(x);
  auto bounds = make_tensor(datatype::int64, {2});
  bounds->as_mut<int64_t>()[0] = 1;
  bounds->as_mut<int64_t>()[1] = -3;
  int c = g.add_constant("bounds", bounds);
  int shape = g.add_value("shape"), mx = g.add_value("max"), target = g.add_value("target");
  int y = g.add_value("y");
  g.add_node("Shape", "shape", {x}, {shape});
  g.add_node("Min", "min", {shape, c}, {mx}); // {min(b,1), min(6,-3)} = {1, -3}
  g.add_node("Abs", "abs", {mx}, {target});   // {1, 3}
  int four = g.add_value("four_target");
  auto four_t = make_tensor(datatype::int64, {});
  four_t->as_mut<int64_t>()[0] = 4;
  int four_c = g.add_constant("four", four_t);
  g.add_node("Mod", "mod", {target, four_c}, {four}); // {1, 3}
  int wide = g.add_value("wide");
  auto minus1 = make_tensor(datatype::int64, {1});
  minus1->as_mut<int64_t>()[0] = -1;
  int m1 = g.add_constant("minus1", minus1);
  int full = g.add_value("full");
  g.add_node("Concat", "concat", {m1, four}, {full}); // {-1, 1, 3}
  g.nodes.back().set_i("axis", 0);
  g.add_node("Reshape", "reshape", {x, full}, {wide});
  g.add_node("Neg", "neg", {wide}, {y});
  g.outputs.push_back(y);
  auto s = specialize(g, {{5, 6}});
  REQUIRE_MESSAGE(s, (s ? "" : s.error().message));
  const auto& out = s->values[s->outputs[0]];
  CHECK(out.shape == std::vector<int64_t>{10, 1, 3});
  // Only the data path is left to run: the shape arithmetic folded away.
  for (const auto& n : s->nodes)
    CHECK_MESSAGE((n.op == "Reshape" || n.op == "Neg"), n.op);
}

namespace {

namespace pb = ::onnx;

void add_tensor_value(pb::ValueInfoProto* v, const std::string& name, int32_t elem,
                      const std::vector<int64_t>& dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  for (auto d : dims) {
    if (d < 0)
      tt->mutable_shape()->add_dim()->set_dim_param("batch");
    else
      tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
}

pb::NodeProto* add_node(pb::GraphProto* g, const std::string& op,
                        const std::vector<std::string>& ins, const std::string& out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out);
  for (const auto& i : ins) n->add_input(i);
  n->add_output(out);
  return n;
}

void add_int_attr(pb::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(pb::AttributeProto::INT);
  a->set_i(v);
}

void add_float_attr(pb::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(pb::AttributeProto::FLOAT);
  a->set_f(v);
}

/// Inputs x FP32 [batch,4] and ids INT64 [batch,4]; the outputs, in order:
///   isnan = IsNaN(x), isinf = IsInf(x)                                  BOOL
///   max = Max(HardSwish(x), HardSigmoid(x; alpha 0.25), floor[4])
///   min = Min(Abs(x), 3)
///   exp = Reciprocal(Exp(Neg(x))), log = Log(Abs(x))
///   gathered = GatherElements(x, Mod(ids, 4), axis 1)
///   cumsum = CumSum(x, axis 1)
///   argmax = ArgMax(Mod(ids, 4), axis 1, keepdims 0)                     INT64 [batch]
std::string elementwise_model() {
  pb::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("ops_simple.test");
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("simple_ops");
  add_tensor_value(g->add_input(), "x", pb::TensorProto::FLOAT, {-1, 4});
  add_tensor_value(g->add_input(), "ids", pb::TensorProto::INT64, {-1, 4});
  auto* floor = g->add_initializer();
  floor->set_name("floor");
  floor->set_data_type(pb::TensorProto::FLOAT);
  floor->add_dims(4);
  for (float v : {0.1f, 0.2f, 0.3f, 0.4f}) floor->add_float_data(v);
  auto scalar = [&](const std::string& name, int32_t type, double v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    if (type == pb::TensorProto::FLOAT)
      t->add_float_data(static_cast<float>(v));
    else
      t->add_int64_data(static_cast<int64_t>(v));
  };
  scalar("three", pb::TensorProto::FLOAT, 3);
  scalar("four", pb::TensorProto::INT64, 4);
  scalar("one", pb::TensorProto::INT64, 1);
  add_node(g, "IsNaN", {"x"}, "isnan");
  add_node(g, "IsInf", {"x"}, "isinf");
  add_node(g, "HardSwish", {"x"}, "hswish");
  add_float_attr(add_node(g, "HardSigmoid", {"x"}, "hsigmoid"), "alpha", 0.25f);
  add_node(g, "Max", {"hswish", "hsigmoid", "floor"}, "max");
  add_node(g, "Abs", {"x"}, "abs");
  add_node(g, "Min", {"abs", "three"}, "min");
  add_node(g, "Neg", {"x"}, "neg");
  add_node(g, "Exp", {"neg"}, "exp_neg");
  add_node(g, "Reciprocal", {"exp_neg"}, "exp");
  add_node(g, "Log", {"abs"}, "log");
  add_node(g, "Mod", {"ids", "four"}, "wrapped");
  add_int_attr(add_node(g, "GatherElements", {"x", "wrapped"}, "gathered"), "axis", 1);
  add_node(g, "CumSum", {"x", "one"}, "cumsum");
  auto* am = add_node(g, "ArgMax", {"wrapped"}, "argmax");
  add_int_attr(am, "axis", 1);
  add_int_attr(am, "keepdims", 0);
  add_tensor_value(g->add_output(), "isnan", pb::TensorProto::BOOL, {-1, 4});
  add_tensor_value(g->add_output(), "isinf", pb::TensorProto::BOOL, {-1, 4});
  for (const char* name : {"max", "min", "exp", "log", "gathered", "cumsum"})
    add_tensor_value(g->add_output(), name, pb::TensorProto::FLOAT, {-1, 4});
  add_tensor_value(g->add_output(), "argmax", pb::TensorProto::INT64, {-1});
  return m.SerializeAsString();
}

} // namespace

// The values below are worked out by hand; ONNX Runtime 1.32 gives the same on this model.
TEST_CASE("a model of the new operators loads and runs through the CPU backend") {
  auto g = import_model_bytes(elementwise_model(), "simple_ops.onnx");
  REQUIRE_MESSAGE(g, (g ? "" : g.error().message));
  onnx_model_config cfg;
  cfg.model_file = "simple_ops.onnx";
  cfg.config.name = "simple_ops";
  auto model = load_onnx_graph(std::move(*g), cfg);
  REQUIRE_MESSAGE(model, (model ? "" : model.error().message));
  CHECK(model->config.max_batch_size == 4); // auto-completed: every dim 0 is the batch
  auto instance = model->make_instance();

  // Row 0 is ordinary numbers, row 1 NaN, -inf and a negative zero.
  std::vector<float> x{1.0f, -2.0f, 0.5f, 3.0f, nan_f, -inf_f, 2.0f, -0.0f};
  std::vector<int64_t> ids{0, -1, 5, 2, -4, 7, -6, 1};
  executor::batch_view view;
  view.rows = 2;
  view.inputs.push_back({"x", datatype::fp32, {2, 4}, reinterpret_cast<const uint8_t*>(x.data()),
                         x.size() * 4});
  view.inputs.push_back({"ids", datatype::int64, {2, 4},
                         reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * 8});
  named_writer out;
  auto r = instance->execute(view, out);
  if (auto* e = std::get_if<serving_error>(&r))
    FAIL(e->message);

  CHECK(out.types.at("isnan") == datatype::bool_);
  CHECK(out.shapes.at("isnan") == std::vector<int64_t>{2, 4});
  CHECK(out.values<uint8_t>("isnan") == std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0, 0});
  CHECK(out.values<uint8_t>("isinf") == std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 0, 0});
  // HardSwish: 1 -> 2/3, -2 -> -1/3, 0.5 -> 0.5 * 7/12, 3 -> 3, 2 -> 2 * 5/6, -0 -> -0,
  // -inf -> -inf * 0 = NaN (IEEE, as the formula x * clip(x/6 + 1/2) reads).
  // HardSigmoid(alpha 0.25): 1 -> 0.75, -2 -> 0, 0.5 -> 0.625, 3 -> 1, 2 -> 1, -0 -> 0.5.
  // Max of those and the floor {0.1, 0.2, 0.3, 0.4} per column; NaN wins.
  check_floats(out.values<float>("max"),
               {0.75f, 0.2f, 0.625f, 3.0f, nan_f, nan_f, 2.0f * 5 / 6, 0.5f}, 1e-6f);
  check_floats(out.values<float>("min"), {1, 2, 0.5f, 3, nan_f, 3, 2, 0});
  check_floats(out.values<float>("exp"),
               {std::exp(1.0f), std::exp(-2.0f), std::exp(0.5f), std::exp(3.0f), nan_f, 0.0f,
                std::exp(2.0f), 1.0f},
               1e-6f);
  check_floats(out.values<float>("log"),
               {0.0f, std::log(2.0f), std::log(0.5f), std::log(3.0f), nan_f, inf_f,
                std::log(2.0f), -inf_f},
               1e-6f);
  // Mod(ids, 4) in Python's sense: {0, 3, 1, 2} and {0, 3, 2, 1}.
  check_floats(out.values<float>("gathered"), {1.0f, 3.0f, -2.0f, 0.5f, nan_f, -0.0f, 2.0f,
                                               -inf_f});
  check_floats(out.values<float>("cumsum"), {1, -1, -0.5f, 2.5f, nan_f, nan_f, nan_f, nan_f});
  // One value per row: Triton's dims [1] with an empty reshape, so the client sees [2,1].
  CHECK(out.shapes.at("argmax") == std::vector<int64_t>{2, 1});
  CHECK(out.values<int64_t>("argmax") == std::vector<int64_t>{1, 1});
}
