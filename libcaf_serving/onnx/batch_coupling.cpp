#include "onnx/batch_coupling.hpp"

#include <algorithm>
#include <set>

namespace caf_serving::onnx {

namespace {

/// Whether `axis` of the node's input 0 is (or may be) the batch axis.
bool is_batch_axis(const graph& g, const node& n, int64_t axis) {
  if (axis == 0)
    return true;
  if (axis > 0 || n.inputs.empty() || n.inputs[0] < 0)
    return false;
  const auto& x = g.values[n.inputs[0]];
  return x.shape_known && static_cast<int64_t>(x.shape.size()) + axis == 0;
}

/// The integers a value holds when they are known before the model runs: an
/// initializer, or the output of a Constant node (the TorchScript exporter writes
/// CumSum's axis and Reduce axes that way, and this check runs before constant
/// folding); nothing when they are computed at run time.
std::optional<std::vector<int64_t>> known_ints(const graph& g, const std::vector<int>& producers,
                                               int v) {
  const tensor_data* c = g.values[v].constant.get();
  if (!c && producers[v] >= 0) {
    const auto& p = g.nodes[producers[v]];
    if (p.op != "Constant")
      return std::nullopt;
    if (p.has("value_int"))
      return std::vector<int64_t>{p.get_i("value_int", 0)};
    if (p.has("value_ints"))
      return p.get_ints("value_ints");
    if (p.has("value"))
      c = p.attrs.at("value").t.get();
  }
  if (!c || (c->dtype != datatype::int64 && c->dtype != datatype::int32))
    return std::nullopt;
  std::vector<int64_t> ints(static_cast<size_t>(c->elements()));
  for (size_t i = 0; i < ints.size(); ++i)
    ints[i] = c->dtype == datatype::int32 ? c->as<int32_t>()[i] : c->as<int64_t>()[i];
  return ints;
}

/// The axes a Reduce node reduces over: the attribute, or the constant input 1
/// (opset 18 and ReduceSum 13); nothing when they are computed at run time.
std::optional<std::vector<int64_t>> reduce_axes(const graph& g, const std::vector<int>& producers,
                                                const node& n) {
  if (n.has("axes"))
    return n.get_ints("axes");
  if (n.inputs.size() < 2 || n.inputs[1] < 0)
    return std::vector<int64_t>{};
  return known_ints(g, producers, n.inputs[1]);
}

std::string described(const node& n, const std::string& why) {
  return "node '" + n.name + "' (" + n.op + ") " + why;
}

} // namespace

std::optional<std::string> batch_coupling(const graph& g) {
  static const std::set<std::string> reduces{
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
  static const std::set<std::string> along_axis{
    "ArgMax", "ArgMin", "Softmax", "LogSoftmax", "Hardmax", "TopK", "LpNormalization"};
  auto producers = g.producers();
  for (const auto& n : g.nodes) {
    if (n.op == "DynamicQuantizeLinear")
      return described(n, "quantizes with one scale and zero point over the whole tensor, "
                          "every batch row included");
    if (reduces.count(n.op)) {
      auto axes = reduce_axes(g, producers, n);
      if (!axes)
        return described(n, "reduces over axes computed at run time, which may include the "
                            "batch");
      if (axes->empty() && n.get_i("noop_with_empty_axes", 0) == 0)
        return described(n, "reduces over every axis, the batch included");
      for (auto a : *axes)
        if (is_batch_axis(g, n, a))
          return described(n, "reduces over axis 0, the batch");
    }
    if (along_axis.count(n.op)) {
      // Softmax's default axis is -1 from opset 13 (the engine's first), ArgMax's 0.
      int64_t fallback = n.op == "ArgMax" || n.op == "ArgMin" ? 0 : -1;
      if (is_batch_axis(g, n, n.get_i("axis", fallback)))
        return described(n, "computes along axis 0, the batch");
    }
    if (n.op == "CumSum" && n.inputs.size() > 1 && n.inputs[1] >= 0) {
      auto axis = known_ints(g, producers, n.inputs[1]);
      if (!axis || axis->empty() || is_batch_axis(g, n, axis->front()))
        return described(n, "sums along axis 0, the batch (or an axis computed at run time)");
    }
    if ((n.op == "LayerNormalization" || n.op == "FusedLayerNorm")
        && is_batch_axis(g, n, n.get_i("axis", -1)))
      return described(n, "normalizes from axis 0 on, across the batch");
    if (n.op == "MeanVarianceNormalization") {
      auto axes = n.get_ints("axes", {0, 2, 3});
      if (std::any_of(axes.begin(), axes.end(), [&](int64_t a) { return is_batch_axis(g, n, a); }))
        return described(n, "normalizes over axis 0, the batch");
    }
  }
  return std::nullopt;
}

} // namespace caf_serving::onnx
