/// The element-wise steps' plans (elementwise_plan.hpp) run through the kernels'
/// CPU references (kernels/cpu/reference_elementwise.hpp), which share the device
/// kernels' index and value code, against the operators' reference kernels: the
/// launch arguments a step captures (operator, types, attributes, broadcast
/// layout, Clip's constant bounds) compute what ONNX says. No device needed.

#include "cuda/elementwise_plan.hpp"

#include "cpu/reference_elementwise.hpp"
#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>

using namespace caf_serving;
using namespace caf_serving::cuda;
namespace k = caf_serving::kernels;

namespace {

using bytes_t = std::vector<uint8_t>;

/// ONNX's TensorProto number of a type (Cast's `to`).
int64_t onnx_type_of(datatype t) {
  switch (t) {
    case datatype::fp32: return 1;
    case datatype::uint8: return 2;
    case datatype::int8: return 3;
    case datatype::int32: return 6;
    case datatype::int64: return 7;
    case datatype::bool_: return 9;
    case datatype::fp16: return 10;
    default: return 16; // bf16
  }
}

/// One node over random runtime inputs and constants, its output's shape inferred.
struct node_case {
  onnx::graph g;
  std::map<int, bytes_t> data; ///< per value: its bytes

  explicit node_case(int64_t opset = 18) { g.opset = opset; }

  /// Random finite floats in [-4, 4], integers in [-20, 20] without 0 (integer
  /// division by zero is the kernels' choice, not ONNX's), bools 0/1.
  int input(datatype t, std::vector<int64_t> shape) {
    int v = g.add_value("in" + std::to_string(g.values.size()), t, shape, true);
    std::mt19937 rng(static_cast<unsigned>(v) + 11);
    auto count = static_cast<size_t>(onnx::element_count(shape));
    bytes_t bytes(count * element_size(t));
    auto kt = *kernel_type(t);
    for (size_t i = 0; i < count; ++i) {
      double x;
      if (t == datatype::bool_)
        x = static_cast<double>(rng() % 2);
      else if (t == datatype::fp32 || t == datatype::fp16 || t == datatype::bf16)
        x = std::uniform_real_distribution<double>(-4, 4)(rng);
      else
        x = static_cast<double>(static_cast<int>(rng() % 20) + 1) * (rng() % 2 ? 1 : -1);
      k::ref::store_value(kt, x, bytes.data(), i);
    }
    data[v] = bytes;
    return v;
  }
  int scalar(float x) {
    auto c = onnx::make_tensor(datatype::fp32, {});
    c->as_mut<float>()[0] = x;
    int v = g.add_constant("c" + std::to_string(g.values.size()), c);
    data[v] = bytes_t(c->bytes.data(), c->bytes.data() + c->bytes.size());
    return v;
  }
  onnx::node& add(const std::string& op, std::vector<int> ins,
                  const std::function<void(onnx::node&)>& attrs = {}) {
    int y = g.add_value("y");
    auto& n = g.add_node(op, "n", ins, {y});
    if (attrs) attrs(n);
    auto inferred = onnx::infer_shapes(g, n);
    auto* shapes = std::get_if<std::vector<onnx::inferred>>(&inferred);
    REQUIRE_MESSAGE(shapes, std::get<std::string>(inferred));
    g.values[y].dtype = (*shapes)[0].dtype;
    g.values[y].shape = (*shapes)[0].shape;
    g.values[y].shape_known = true;
    return g.nodes.back();
  }

  bytes_t by_reference() {
    const auto& n = g.nodes.back();
    std::vector<onnx::tensor_ref> ins, outs;
    for (int v : n.inputs) ins.push_back({g.values[v].dtype, g.values[v].shape, data[v].data()});
    const auto& y = g.values[n.outputs[0]];
    bytes_t out(onnx::element_count(y.shape) * element_size(y.dtype));
    outs.push_back({y.dtype, y.shape, out.data()});
    onnx::run_reference(n, ins, outs);
    return out;
  }

  bytes_t by_plan(const elementwise_plan& p) {
    auto in = [&](size_t i) { return data[p.inputs[i]].data(); };
    if (p.kernel == "binary") return k::ref::binary(p.binary, p.type, p.binary_layout, in(0), in(1));
    if (p.kernel == "unary") return k::ref::unary(p.unary, p.type, p.params, in(0), p.count);
    if (p.kernel == "where") return k::ref::where(p.type, p.where_layout, in(0), in(1), in(2));
    REQUIRE(p.kernel == "cast");
    if (p.via) {
      auto half = k::ref::cast(p.type, *p.via, in(0), p.count);
      return k::ref::cast(*p.via, p.to, half.data(), p.count);
    }
    return k::ref::cast(p.type, p.to, in(0), p.count);
  }

  /// Plans the last node and compares the two: floats within 1e-5 (relative
  /// above 1; NaN matches NaN), everything else exactly.
  void check(const std::string& kernel) {
    auto p = plan_elementwise(g, g.nodes.back());
    REQUIRE(p);
    CHECK(p->kernel == kernel);
    auto want = by_reference();
    auto got = by_plan(*p);
    REQUIRE(got.size() == want.size());
    const auto& y = g.values[p->output];
    auto kt = *kernel_type(y.dtype);
    for (size_t i = 0; i < static_cast<size_t>(onnx::element_count(y.shape)); ++i) {
      double w = k::ref::load_value(kt, want.data(), i), h = k::ref::load_value(kt, got.data(), i);
      CAPTURE(i);
      if (std::isnan(w)) {
        CHECK(std::isnan(h));
      } else if (y.dtype == datatype::fp32) {
        CHECK(std::fabs(w - h) <= 1e-5 * std::max(1.0, std::fabs(w)));
      } else {
        CHECK(w == h);
      }
    }
  }
};

} // namespace

TEST_CASE("binary plans broadcast as the operators do") {
  using dt = datatype;
  struct c {
    const char* op;
    dt type;
    std::vector<int64_t> a, b;
  };
  for (const auto& [op, type, a, b] :
       {c{"Add", dt::fp32, {2, 3, 4}, {4}}, c{"Mul", dt::fp32, {2, 1, 4}, {3, 1}},
        c{"Sub", dt::int64, {}, {5}}, c{"Div", dt::int32, {2, 3}, {2, 3}},
        c{"Div", dt::fp32, {2, 3, 4, 5}, {2, 1, 1, 5}}, c{"Pow", dt::fp32, {2, 3}, {}},
        c{"Max", dt::fp32, {4, 1}, {1, 5}}, c{"Min", dt::int64, {3, 4}, {4}},
        c{"Equal", dt::int64, {1, 4}, {3, 1}}, c{"Less", dt::fp32, {3, 4}, {3, 1}},
        c{"LessOrEqual", dt::int32, {4}, {4}}, c{"Greater", dt::fp32, {2, 3}, {3}},
        c{"GreaterOrEqual", dt::int64, {2, 1, 3}, {4, 1}}, c{"Equal", dt::bool_, {4}, {4}},
        c{"And", dt::bool_, {1, 1, 4}, {2, 1, 1}}, c{"Or", dt::bool_, {3, 4}, {4}}}) {
    CAPTURE(std::string(op));
    node_case t;
    int x = t.input(type, a), w = t.input(type, b);
    t.add(op, {x, w});
    t.check("binary");
  }
}

TEST_CASE("unary plans carry the operators' attributes") {
  using dt = datatype;
  for (const char* op : {"Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Tanh", "Sigmoid",
                         "Relu", "Softplus", "Floor", "Ceil", "Round", "Sin", "Cos", "HardSwish"}) {
    CAPTURE(std::string(op));
    node_case t;
    t.add(op, {t.input(dt::fp32, {3, 7})});
    t.check("unary");
  }
  node_case leaky;
  leaky.add("LeakyRelu", {leaky.input(dt::fp32, {20})}, [](onnx::node& n) { n.set_f("alpha", 0.3f); });
  leaky.check("unary");
  node_case elu;
  elu.add("Elu", {elu.input(dt::fp32, {20})}, [](onnx::node& n) { n.set_f("alpha", 0.5f); });
  elu.check("unary");
  node_case hs;
  hs.add("HardSigmoid", {hs.input(dt::fp32, {20})}, [](onnx::node& n) {
    n.set_f("alpha", 0.3f);
    n.set_f("beta", 0.4f);
  });
  hs.check("unary");
  node_case gelu(20);
  gelu.add("Gelu", {gelu.input(dt::fp32, {20})}, [](onnx::node& n) { n.set_s("approximate", "tanh"); });
  gelu.check("unary");
  node_case clip;
  int x = clip.input(dt::fp32, {20});
  clip.add("Clip", {x, clip.scalar(-1.5f), clip.scalar(2.25f)});
  clip.check("unary");
  node_case neg;
  neg.add("Neg", {neg.input(dt::int64, {9})});
  neg.check("unary");
  node_case abs;
  abs.add("Abs", {abs.input(dt::int32, {9})});
  abs.check("unary");
  node_case no;
  no.add("Not", {no.input(dt::bool_, {9})});
  no.check("unary");
}

TEST_CASE("Where and Cast plans") {
  using dt = datatype;
  node_case w;
  int c = w.input(dt::bool_, {1, 1, 4, 4});
  int x = w.input(dt::fp32, {2, 3, 4, 4});
  w.add("Where", {c, x, w.scalar(-1e4f)});
  w.check("where");
  node_case wi;
  c = wi.input(dt::bool_, {3, 1});
  x = wi.input(dt::int64, {1, 4});
  wi.add("Where", {c, x, wi.input(dt::int64, {3, 4})});
  wi.check("where");
  for (auto [from, to] : {std::pair{dt::int64, dt::fp32}, {dt::fp32, dt::int32}, {dt::fp32, dt::bool_},
                          {dt::bool_, dt::fp32}, {dt::int32, dt::int64}, {dt::uint8, dt::fp32},
                          {dt::int64, dt::int8}}) {
    CAPTURE(static_cast<int>(from));
    CAPTURE(static_cast<int>(to));
    node_case t;
    t.add("Cast", {t.input(from, {2, 5})},
          [to = to](onnx::node& n) { n.set_i("to", onnx_type_of(to)); });
    t.check("cast");
  }
  // Inside the graph a Cast to FLOAT16/BFLOAT16 keeps fp32, rounded to the half's
  // precision: two casts, through the half type.
  for (int64_t to : {10, 16}) {
    for (auto from : {dt::fp32, dt::int64}) {
      CAPTURE(to);
      node_case half;
      half.add("Cast", {half.input(from, {3, 50})}, [to](onnx::node& n) { n.set_i("to", to); });
      REQUIRE(half.g.values[half.g.nodes.back().outputs[0]].dtype == dt::fp32);
      half.check("cast");
      auto p = plan_elementwise(half.g, half.g.nodes.back());
      CHECK(p->via == (to == 10 ? k::dtype::f16 : k::dtype::bf16));
    }
  }
  // One whose half tensor does not fit the scratch (64 MiB: 2^25 halves) stays a host step.
  node_case huge;
  int big = huge.g.add_value("big", dt::fp32, {(int64_t{1} << 25) + 1}, true);
  auto& n = huge.g.add_node("Cast", "n", {big}, {huge.g.add_value("y", dt::fp32, {(int64_t{1} << 25) + 1}, true)});
  n.set_i("to", 10);
  CHECK_FALSE(plan_elementwise(huge.g, huge.g.nodes.back()));
  // The importer's storage Cast at the graph's edge writes fp16 itself.
  node_case storage;
  storage.add("Cast", {storage.input(dt::fp32, {2, 5})}, [](onnx::node& n) {
    n.set_i("to", 10);
    n.set_i("storage", 1);
  });
  storage.check("cast");
}
