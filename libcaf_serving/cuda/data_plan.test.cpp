/// The data steps' launches (data_plan.hpp), as steps_data.cpp hands them to the
/// device kernels, run instead through the kernels' CPU references
/// (kernels/cpu/data_reference.hpp: the same index arithmetic the device runs)
/// and compared with each operator's reference kernel: the boxes, offsets,
/// starts, strides and axes derived from the node are those the operator means.
/// Needs no device.

#include "cuda/data_plan.hpp"

#include "cpu/data_reference.hpp"
#include "onnx/op_registry.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

using namespace caf_serving;
using namespace caf_serving::cuda;
namespace k = caf_serving::kernels;

namespace {

using bytes_t = std::vector<uint8_t>;

/// One node over runtime inputs (random bytes, or the given ones) and constants,
/// its outputs' shapes inferred.
struct node_case {
  onnx::graph g;
  std::map<int, bytes_t> data; ///< per value: its bytes

  node_case() { g.opset = 18; }

  int input(datatype t, std::vector<int64_t> shape, bytes_t bytes = {}) {
    int v = g.add_value("in" + std::to_string(g.values.size()), t, shape, true);
    if (bytes.empty()) {
      std::mt19937 rng(static_cast<unsigned>(v) + 7);
      bytes.resize(onnx::element_count(shape) * element_size(t));
      if (t == datatype::fp32) // finite floats, so NaNs do not hide differences
        for (size_t i = 0; i < bytes.size() / 4; ++i) {
          float f = std::uniform_real_distribution<float>(-4, 4)(rng);
          std::memcpy(bytes.data() + 4 * i, &f, 4);
        }
      else
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    }
    data[v] = bytes;
    return v;
  }
  template <class T>
  int constant(datatype t, std::vector<int64_t> shape, std::vector<T> values) {
    auto c = onnx::make_tensor(t, shape);
    std::memcpy(c->bytes.data(), values.data(), values.size() * sizeof(T));
    int v = g.add_constant("c" + std::to_string(g.values.size()), c);
    data[v] = bytes_t(c->bytes.data(), c->bytes.data() + c->bytes.size());
    return v;
  }
  int ints(std::vector<int64_t> v) {
    return constant<int64_t>(datatype::int64, {static_cast<int64_t>(v.size())}, v);
  }
  onnx::node& add(const std::string& op, std::vector<int> ins, size_t outs = 1,
                  const std::function<void(onnx::node&)>& attrs = {}) {
    std::vector<int> ys;
    for (size_t i = 0; i < outs; ++i) ys.push_back(g.add_value("y" + std::to_string(i)));
    auto& n = g.add_node(op, "n", ins, ys);
    if (attrs) attrs(n);
    auto inferred = onnx::infer_shapes(g, n);
    auto* shapes = std::get_if<std::vector<onnx::inferred>>(&inferred);
    REQUIRE_MESSAGE(shapes, std::get<std::string>(inferred));
    for (size_t i = 0; i < outs; ++i) {
      g.values[ys[i]].dtype = (*shapes)[i].dtype;
      g.values[ys[i]].shape = (*shapes)[i].shape;
      g.values[ys[i]].shape_known = true;
    }
    return g.nodes.back();
  }

  /// The node's outputs by its reference kernel.
  std::vector<bytes_t> by_reference() {
    const auto& n = g.nodes.back();
    std::vector<onnx::tensor_ref> ins, outs;
    std::vector<bytes_t> out_bytes(n.outputs.size());
    for (int v : n.inputs) {
      onnx::tensor_ref r;
      if (v >= 0) r = {g.values[v].dtype, g.values[v].shape, data[v].data()};
      ins.push_back(r);
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const auto& y = g.values[n.outputs[i]];
      out_bytes[i].resize(onnx::element_count(y.shape) * element_size(y.dtype));
      outs.push_back({y.dtype, y.shape, out_bytes[i].data()});
    }
    onnx::run_reference(n, ins, outs);
    return out_bytes;
  }

  /// The node's outputs by its plan on the kernels' CPU references.
  std::vector<bytes_t> by_plan(const data_plan& p) {
    const auto& n = g.nodes.back();
    std::map<int, bytes_t> out;
    for (int v : n.outputs)
      out[v] = bytes_t(onnx::element_count(g.values[v].shape) * element_size(g.values[v].dtype), 0xAB);
    if (p.kernel == "permute") {
      out[p.output] = k::ref::permute(data[p.input], p.element_size, p.permute);
    } else if (p.kernel == "gather") {
      std::vector<int64_t> ids(p.index_count);
      for (int64_t i = 0; i < p.index_count; ++i)
        ids[i] = p.indices_type == k::index_type::i64
                   ? reinterpret_cast<const int64_t*>(data[p.indices].data())[i]
                   : reinterpret_cast<const int32_t*>(data[p.indices].data())[i];
      auto shape = k::make_gather_shape(p.gather_rank, p.gather_dims, p.gather_axis, p.index_count);
      auto r = k::ref::gather_axis(data[p.input], p.element_size, shape, ids);
      CHECK_FALSE(r.out_of_range);
      out[p.output] = r.output;
    } else if (p.kernel == "reduce") {
      REQUIRE(p.reduce_type == k::dtype::f32);
      const auto& x = data[p.input];
      std::vector<float> xf(x.size() / 4);
      std::memcpy(xf.data(), x.data(), x.size());
      auto shape = k::make_reduce_shape(p.reduce_rank, p.reduce_dims, p.reduce_axes,
                                        p.reduce_axis_count);
      auto y = k::ref::reduce(xf, shape, p.reduce_op);
      REQUIRE(static_cast<int64_t>(y.size()) == p.output_elements);
      out[p.output].assign(reinterpret_cast<uint8_t*>(y.data()),
                           reinterpret_cast<uint8_t*>(y.data()) + 4 * y.size());
    } else {
      if (p.fill)
        for (int64_t i = 0; i < p.output_elements; ++i)
          std::memcpy(out[p.output].data() + i * p.element_size, &p.fill_value, p.element_size);
      for (const auto& c : p.copies)
        out[c.dst] = k::ref::strided_copy(data[c.src], out[c.dst], p.element_size, c.box);
    }
    std::vector<bytes_t> r;
    for (int v : n.outputs) r.push_back(out[v]);
    return r;
  }

  /// Plans the node, expecting `kernel`, and compares the plan's outputs with
  /// the reference kernel's: bytes for movement, 1e-5 relative for reductions.
  void check(const std::string& kernel) {
    auto p = plan_data_step(g, g.nodes.back());
    REQUIRE(p);
    CHECK(p->kernel == kernel);
    auto want = by_reference();
    auto got = by_plan(*p);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      REQUIRE(got[i].size() == want[i].size());
      if (kernel != "reduce") {
        CHECK(got[i] == want[i]);
        continue;
      }
      for (size_t j = 0; j < want[i].size() / 4; ++j) {
        float a, b;
        std::memcpy(&a, got[i].data() + 4 * j, 4);
        std::memcpy(&b, want[i].data() + 4 * j, 4);
        CHECK(std::fabs(a - b) <= 1e-5f * std::max(1.f, std::fabs(b)));
      }
    }
  }
};

} // namespace

TEST_CASE("Transpose: default and given permutations, 1- to 8-byte elements") {
  for (auto t : {datatype::int8, datatype::fp16, datatype::fp32, datatype::int64}) {
    CAPTURE(static_cast<int>(t));
    node_case a;
    a.add("Transpose", {a.input(t, {2, 3, 4, 5})}, 1,
          [](onnx::node& n) { n.set_ints("perm", {0, 2, 1, 3}); });
    a.check("permute");
    node_case b;
    b.add("Transpose", {b.input(t, {3, 1, 7})});
    b.check("permute");
  }
}

TEST_CASE("Concat and Split: offsets on the axis, empty parts, uneven last parts") {
  node_case c;
  c.add("Concat", {c.input(datatype::fp32, {2, 3, 4}), c.input(datatype::fp32, {2, 0, 4}),
                   c.constant<float>(datatype::fp32, {2, 1, 4}, {1, 2, 3, 4, 5, 6, 7, 8}),
                   c.input(datatype::fp32, {2, 2, 4})},
        1, [](onnx::node& n) { n.set_i("axis", -2); });
  c.check("concat");
  node_case s;
  int x = s.input(datatype::int32, {2, 7});
  s.add("Split", {x, s.ints({2, 0, 5})}, 3, [](onnx::node& n) { n.set_i("axis", 1); });
  s.check("split");
  node_case u; // opset 18's num_outputs: 3, 3, 1
  u.add("Split", {u.input(datatype::fp16, {7, 3})}, 3, [](onnx::node& n) { n.set_i("num_outputs", 3); });
  u.check("split");
}

TEST_CASE("Slice: negative starts and steps, clamped ends, several axes") {
  node_case a;
  a.add("Slice", {a.input(datatype::fp32, {4, 6}), a.ints({-1}), a.ints({-100}), a.ints({1}),
                  a.ints({-2})});
  a.check("slice");
  node_case b;
  b.add("Slice", {b.input(datatype::int64, {5, 6, 3}), b.ints({1, 10, -2}), b.ints({4, -10, 3}),
                  b.ints({0, 1, 2}), b.ints({2, -3, 1})});
  b.check("slice");
  node_case c; // axes and steps left out
  c.add("Slice", {c.input(datatype::bool_, {3, 8}), c.ints({1, 2}), c.ints({1000, 5})});
  c.check("slice");
}

TEST_CASE("Expand, Tile and constant Pad") {
  node_case e;
  e.add("Expand", {e.input(datatype::fp32, {3, 1}), e.ints({2, 3, 4})});
  e.check("expand");
  node_case t;
  t.add("Tile", {t.input(datatype::int32, {2, 1, 3}), t.ints({2, 3, 1})});
  t.check("tile");
  node_case p;
  p.add("Pad", {p.input(datatype::fp32, {2, 3}), p.ints({1, 0, 0, 2}),
                p.constant<float>(datatype::fp32, {}, {7.5f})});
  p.check("pad");
  node_case q; // opset 18's axes, zero pad value by default
  q.add("Pad", {q.input(datatype::int8, {2, 3, 4}), q.ints({1, 2, 0, 1}), -1, q.ints({-1, 0})});
  q.check("pad");
}

TEST_CASE("Gather: any axis, int64 and int32 indices, negative indices, a scalar index") {
  node_case a;
  a.add("Gather", {a.input(datatype::fp32, {3, 5, 2}),
                   a.constant<int64_t>(datatype::int64, {2, 2}, {0, -1, 4, 2})},
        1, [](onnx::node& n) { n.set_i("axis", 1); });
  a.check("gather");
  node_case b; // runtime int32 indices: the embedding case
  std::vector<int32_t> ids{3, 0, -2, 1, 1, 4};
  bytes_t ib(reinterpret_cast<uint8_t*>(ids.data()), reinterpret_cast<uint8_t*>(ids.data()) + 24);
  b.add("Gather", {b.input(datatype::fp16, {5, 8}), b.input(datatype::int32, {2, 3}, ib)});
  b.check("gather");
  node_case c;
  c.add("Gather", {c.input(datatype::int64, {4, 3}), c.constant<int64_t>(datatype::int64, {}, {-1})},
        1, [](onnx::node& n) { n.set_i("axis", -1); });
  c.check("gather");
}

TEST_CASE("reductions: attribute and input axes, keepdims, every axis, no axis, the global pools") {
  node_case a;
  a.add("ReduceMean", {a.input(datatype::fp32, {2, 3, 4}), a.ints({1})});
  a.check("reduce");
  node_case b;
  b.add("ReduceMax", {b.input(datatype::fp32, {2, 3, 4}), b.ints({-1, -2})}, 1,
        [](onnx::node& n) { n.set_i("keepdims", 0); });
  b.check("reduce");
  node_case c;
  c.add("ReduceSum", {c.input(datatype::fp32, {3, 5})});
  c.check("reduce");
  node_case d;
  d.add("ReduceProd", {d.input(datatype::fp32, {2, 3, 2}), d.ints({0})});
  d.check("reduce");
  node_case e;
  e.add("GlobalAveragePool", {e.input(datatype::fp32, {2, 3, 4, 5})});
  e.check("reduce");
  node_case f;
  f.add("ReduceL2", {f.input(datatype::fp32, {2, 3, 4}), f.ints({1, 2})}, 1,
        [](onnx::node& n) { n.set_i("keepdims", 0); });
  f.check("reduce");
  node_case g;
  g.add("ReduceSumSquare", {g.input(datatype::fp32, {3, 5}), g.ints({-1})});
  g.check("reduce");
  node_case h; // no axes: each element squared, in the kernel and the reference
  h.add("ReduceSumSquare", {h.input(datatype::fp32, {3, 5})}, 1,
        [](onnx::node& n) { n.set_i("noop_with_empty_axes", 1); });
  h.check("reduce");
  node_case i;
  i.add("GlobalMaxPool", {i.input(datatype::fp32, {2, 3, 4, 5})});
  i.check("reduce");
}

TEST_CASE("what the kernels cannot take has no plan") {
  node_case a; // reduced axes not adjacent
  a.add("ReduceSum", {a.input(datatype::fp32, {2, 3, 4}), a.ints({0, 2})});
  CHECK_FALSE(plan_data_step(a.g, a.g.nodes.back()));
  node_case b; // a constant index past the axis
  b.add("Gather", {b.input(datatype::fp32, {3, 2}), b.constant<int64_t>(datatype::int64, {1}, {3})});
  CHECK_FALSE(plan_data_step(b.g, b.g.nodes.back()));
  node_case c; // runtime starts
  c.add("Slice", {c.input(datatype::fp32, {4, 6}), c.constant<int64_t>(datatype::int64, {1}, {1}),
                  c.ints({3})});
  c.g.values[c.g.nodes.back().inputs[1]].constant = nullptr;
  CHECK_FALSE(plan_data_step(c.g, c.g.nodes.back()));
  node_case d; // integer reduction
  d.add("ReduceMax", {d.input(datatype::int64, {2, 3}), d.ints({1})});
  CHECK_FALSE(plan_data_step(d.g, d.g.nodes.back()));
  node_case e; // edge padding
  e.add("Pad", {e.input(datatype::fp32, {2, 3}), e.ints({1, 0, 0, 2})}, 1,
        [](onnx::node& n) { n.set_s("mode", "edge"); });
  CHECK_FALSE(plan_data_step(e.g, e.g.nodes.back()));
}
