#include "onnx/ops_common.hpp"

#include <algorithm>
#include <stdexcept>

namespace caf_serving::onnx {

using namespace ops_internal;

std::map<std::string, int64_t> first_versions(const op_table& table) {
  std::map<std::string, int64_t> first;
  for (const auto& e : table)
    first.emplace(e.op, e.since.front());
  return first;
}

std::optional<std::string> refused_opset_or_input(const graph& g, const node& n, int64_t since,
                                                  const char* no_input) {
  if (g.opset != 0 && g.opset < since)
    return n.op + " exists from opset " + std::to_string(since) + ", but the model imports opset "
           + std::to_string(g.opset) + "; re-export it with a newer opset";
  if (n.inputs.empty() || n.inputs[0] < 0)
    return n.op + no_input;
  return std::nullopt;
}

std::optional<std::string> refused_input_type(const graph& g, const node& n,
                                              const std::vector<datatype>& types) {
  const auto& x = g.values[n.inputs[0]];
  if (std::find(types.begin(), types.end(), x.dtype) != types.end())
    return std::nullopt;
  std::string list;
  for (auto t : types)
    list += (list.empty() ? "" : ", ") + std::string(to_string(t));
  return "input '" + x.name + "' is " + std::string(to_string(x.dtype)) + "; the engine runs "
         + n.op + " on " + list;
}

std::optional<shape_t> broadcast_shapes(const shape_t& a, const shape_t& b) {
  size_t r = std::max(a.size(), b.size());
  shape_t out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

float apply_activation(const std::string& act, float x, float alpha, float beta) {
  if (act.empty()) return x;
  if (act == "Relu") return x > 0 ? x : 0;
  if (act == "Gelu") return gelu_erf(x);
  if (act == "GeluTanh") return gelu_tanh(x);
  if (act == "Tanh") return std::tanh(x);
  if (act == "Sigmoid") return 1.0f / (1.0f + std::exp(-x));
  if (act == "Clip") return std::min(std::max(x, alpha), beta);
  if (act == "HardSwish") return x * std::min(std::max(alpha * x + beta, 0.0f), 1.0f);
  if (act == "Swish") return x / (1.0f + std::exp(-alpha * x));
  // The passes write only the names above: another is a bug, and computing
  // anything (the input, say) would give wrong results without a word.
  throw std::logic_error("apply_activation: unknown activation '" + act
                         + "'; add it here and to every backend's epilogue");
}

std::string selected_version(const graph& g, const node& n, int64_t version) {
  return " (opset " + std::to_string(g.opset) + " selects " + n.op + "-"
         + std::to_string(version) + ")";
}

std::optional<std::string> attribute_from(const graph& g, const node& n, int64_t version,
                                          const char* attr, int64_t first) {
  if (version >= first || !n.has(attr))
    return std::nullopt;
  return "attribute '" + std::string(attr) + "' exists from " + n.op + "-"
         + std::to_string(first) + " on" + selected_version(g, n, version)
         + "; re-export the model with opset " + std::to_string(first)
         + " or newer, or without the attribute";
}

std::optional<std::string> check_axes_input(const graph& g, const node& n, int64_t version,
                                            int64_t input_from) {
  const std::string at = selected_version(g, n, version);
  if (version >= input_from && n.has("axes"))
    return "attribute 'axes' was replaced by the second input 'axes' in " + n.op + "-"
           + std::to_string(input_from) + at + "; pass the axes as a constant input";
  if (version < input_from && n.inputs.size() > 1 && n.inputs[1] >= 0)
    return n.op + "-" + std::to_string(version)
           + " takes its axes as an attribute; the second input 'axes' exists from " + n.op
           + "-" + std::to_string(input_from) + " on" + at + "; re-export with a newer opset";
  return attribute_from(g, n, version, "noop_with_empty_axes", input_from);
}

namespace ops_internal {

std::optional<std::string> need_constant(const graph& g, const node& n, size_t i,
                                         const char* what) {
  if (n.inputs.size() <= i || n.inputs[i] < 0 || g.values[n.inputs[i]].constant)
    return std::nullopt;
  return std::string(what) + " must be known before the model runs (it depends on '"
         + g.values[n.inputs[i]].name + "', which is computed from the inputs in a way the "
         "engine cannot fold)";
}

} // namespace ops_internal

} // namespace caf_serving::onnx
