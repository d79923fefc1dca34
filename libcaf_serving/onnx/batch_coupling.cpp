#include "onnx/batch_coupling.hpp"

#include <algorithm>
#include <map>

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

/// What a node of one operator does across batch rows, described; nothing
/// when it keeps them apart.
using coupling_rule = std::optional<std::string> (*)(const graph& g,
                                                      const std::vector<int>& producers,
                                                      const node& n);

std::optional<std::string> whole_tensor(const graph&, const std::vector<int>&, const node& n) {
  return described(n, "quantizes with one scale and zero point over the whole tensor, every "
                      "batch row included");
}

std::optional<std::string> reduction(const graph& g, const std::vector<int>& producers,
                                     const node& n) {
  auto axes = reduce_axes(g, producers, n);
  if (!axes)
    return described(n, "reduces over axes computed at run time, which may include the batch");
  if (axes->empty() && n.get_i("noop_with_empty_axes", 0) == 0)
    return described(n, "reduces over every axis, the batch included");
  for (auto a : *axes)
    if (is_batch_axis(g, n, a))
      return described(n, "reduces over axis 0, the batch");
  return std::nullopt;
}

/// An operator along its `axis` attribute, whose default is `Default`
/// (Softmax's is -1 from opset 13, the engine's first; ArgMax's 0).
template <int64_t Default>
std::optional<std::string> along_axis(const graph& g, const std::vector<int>&, const node& n) {
  if (is_batch_axis(g, n, n.get_i("axis", Default)))
    return described(n, "computes along axis 0, the batch");
  return std::nullopt;
}

std::optional<std::string> cumulative_sum(const graph& g, const std::vector<int>& producers,
                                          const node& n) {
  if (n.inputs.size() <= 1 || n.inputs[1] < 0)
    return std::nullopt;
  auto axis = known_ints(g, producers, n.inputs[1]);
  if (!axis || axis->empty() || is_batch_axis(g, n, axis->front()))
    return described(n, "sums along axis 0, the batch (or an axis computed at run time)");
  return std::nullopt;
}

std::optional<std::string> layer_norm(const graph& g, const std::vector<int>&, const node& n) {
  if (is_batch_axis(g, n, n.get_i("axis", -1)))
    return described(n, "normalizes from axis 0 on, across the batch");
  return std::nullopt;
}

std::optional<std::string> mean_variance_norm(const graph& g, const std::vector<int>&,
                                              const node& n) {
  auto axes = n.get_ints("axes", {0, 2, 3});
  if (std::any_of(axes.begin(), axes.end(), [&](int64_t a) { return is_batch_axis(g, n, a); }))
    return described(n, "normalizes over axis 0, the batch");
  return std::nullopt;
}

/// The operators that may compute across batch rows, with the rule that tells.
const std::map<std::string, coupling_rule>& coupling_rules() {
  static const std::map<std::string, coupling_rule> rules{
    {"ArgMax", &along_axis<0>},
    {"ArgMin", &along_axis<0>},
    {"CumSum", &cumulative_sum},
    {"DynamicQuantizeLinear", &whole_tensor},
    {"FusedLayerNorm", &layer_norm},
    {"Hardmax", &along_axis<-1>},
    {"LayerNormalization", &layer_norm},
    {"LogSoftmax", &along_axis<-1>},
    {"LpNormalization", &along_axis<-1>},
    {"MeanVarianceNormalization", &mean_variance_norm},
    {"ReduceL1", &reduction},
    {"ReduceL2", &reduction},
    {"ReduceLogSum", &reduction},
    {"ReduceLogSumExp", &reduction},
    {"ReduceMax", &reduction},
    {"ReduceMean", &reduction},
    {"ReduceMin", &reduction},
    {"ReduceProd", &reduction},
    {"ReduceSum", &reduction},
    {"ReduceSumSquare", &reduction},
    {"Softmax", &along_axis<-1>},
    {"TopK", &along_axis<-1>},
  };
  return rules;
}

} // namespace

std::optional<std::string> batch_coupling(const graph& g) {
  auto producers = g.producers();
  for (const auto& n : g.nodes) {
    auto rule = coupling_rules().find(n.op);
    if (rule == coupling_rules().end())
      continue;
    if (auto why = rule->second(g, producers, n))
      return why;
  }
  return std::nullopt;
}

} // namespace caf_serving::onnx
