/// batch_coupling (batch_coupling.hpp): which operators make a request's
/// answer depend on the requests batched with it.

#include "onnx/batch_coupling.hpp"

#include <doctest/doctest.h>

#include <cstring>

using namespace caf_serving;
using namespace caf_serving::onnx;

namespace {

/// x [batch, 4, 3] -> `op` -> y, with `setup` adding attributes or inputs.
template <class F>
graph one_node(const std::string& op, F setup) {
  graph g;
  g.opset = 18;
  int x = g.add_value("x", datatype::fp32, {-1, 4, 3}, true);
  g.inputs.push_back(x);
  int y = g.add_value("y");
  auto& n = g.add_node(op, "the_node", {x}, {y});
  setup(g, n);
  g.outputs.push_back(y);
  return g;
}

int axes_constant(graph& g, std::vector<int64_t> axes) {
  auto t = make_tensor(datatype::int64, {static_cast<int64_t>(axes.size())});
  std::memcpy(t->as_mut<int64_t>(), axes.data(), axes.size() * 8);
  return g.add_constant("axes", t);
}

} // namespace

TEST_CASE("operators that compute across batch rows are found, the others are not") {
  auto none = [](graph&, node&) {};
  auto coupled = one_node("DynamicQuantizeLinear", none);
  auto why = batch_coupling(coupled);
  REQUIRE(why);
  CHECK(why->find("'the_node' (DynamicQuantizeLinear)") != std::string::npos);

  CHECK(batch_coupling(one_node("ReduceMean", [](graph& g, node& n) {
    n.inputs.push_back(axes_constant(g, {0}));
  })));
  CHECK(batch_coupling(one_node("ReduceSum", none))); // no axes: every axis
  CHECK(batch_coupling(one_node("ReduceMax", [](graph& g, node& n) {
    n.inputs.push_back(axes_constant(g, {-3})); // rank 3: axis 0
  })));
  CHECK(batch_coupling(one_node("ArgMax", none))); // ArgMax's default axis is 0
  CHECK(batch_coupling(one_node("Softmax", [](graph&, node& n) { n.set_i("axis", 0); })));
  CHECK(batch_coupling(one_node("ReduceMean", [](graph& g, node& n) {
    int runtime_axes = g.add_value("axes_in", datatype::int64, {1}, true);
    g.inputs.push_back(runtime_axes);
    n.inputs.push_back(runtime_axes);
  })));

  CHECK_FALSE(batch_coupling(one_node("ReduceMean", [](graph& g, node& n) {
    n.inputs.push_back(axes_constant(g, {1, -1}));
  })));
  CHECK_FALSE(batch_coupling(one_node("ReduceSum", [](graph&, node& n) {
    n.set_i("noop_with_empty_axes", 1);
  })));
  CHECK_FALSE(batch_coupling(one_node("Softmax", none))); // axis -1
  CHECK_FALSE(batch_coupling(one_node("ArgMax", [](graph&, node& n) { n.set_i("axis", 2); })));
  CHECK_FALSE(batch_coupling(one_node("Relu", none)));

  // The other reductions alike; GlobalMaxPool, like GlobalAveragePool, keeps the batch axis.
  for (const char* op : {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                         "ReduceLogSumExp"}) {
    CAPTURE(op);
    CHECK(batch_coupling(one_node(op, [](graph& g, node& n) {
      n.inputs.push_back(axes_constant(g, {0, 2}));
    })));
    CHECK_FALSE(batch_coupling(one_node(op, [](graph& g, node& n) {
      n.inputs.push_back(axes_constant(g, {-1}));
    })));
  }
  CHECK_FALSE(batch_coupling(one_node("GlobalMaxPool", none)));
}

TEST_CASE("an axis from a Constant node is read, as the TorchScript exporter writes them") {
  // RoBERTa's position ids: CumSum(mask, axis) with the axis a Constant node's output.
  auto cumsum_on = [](int64_t axis) {
    return one_node("CumSum", [axis](graph& g, node& n) {
      int a = g.add_value("axis", datatype::int64, {}, true);
      auto t = make_tensor(datatype::int64, {});
      t->as_mut<int64_t>()[0] = axis;
      n.inputs.push_back(a); // before add_node, which may move `n`
      auto& c = g.add_node("Constant", "axis_node", {}, {a});
      c.attrs["value"].kind = attribute::kind_t::tensor;
      c.attrs["value"].t = t;
    });
  };
  CHECK_FALSE(batch_coupling(cumsum_on(1)));
  CHECK(batch_coupling(cumsum_on(0)));
  CHECK(batch_coupling(one_node("ReduceMean", [](graph& g, node& n) {
    int a = g.add_value("axes", datatype::int64, {1}, true);
    n.inputs.push_back(a); // before add_node, which may move `n`
    g.add_node("Constant", "axes_node", {}, {a}).set_ints("value_ints", {0});
  })));
}
