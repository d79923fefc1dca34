#include "onnx/paged_attention.hpp"

#include "onnx/ops_contrib.hpp"
#include "onnx/passes.hpp"

#include <algorithm>
#include <optional>

namespace caf_serving::onnx {
namespace {

const std::string gqa_op = std::string(contrib_prefix) + "GroupQueryAttention";

/// N of a value named `prefix` N `suffix` ("past_key_values.3.key": 3).
std::optional<int64_t> layer_of(const std::string& name, const std::string& prefix,
                                const std::string& suffix) {
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0
      || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 6
      || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

bool is_input(const graph& g, int v) {
  return std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end();
}

bool is_output(const graph& g, int v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

/// Why the paged operator would not compute `n` alike; nothing when it would.
/// Sets `layer` from its past's name.
std::optional<std::string> refusal(const graph& g, const node& n, const std::vector<int>& uses,
                                   int64_t& layer) {
  auto in = [&](size_t i) { return n.inputs.size() > i ? n.inputs[i] : -1; };
  auto out = [&](size_t i) { return n.outputs.size() > i ? n.outputs[i] : -1; };
  const std::string who = "GroupQueryAttention '" + n.name + "'";
  if (in(3) < 0 || in(4) < 0 || out(1) < 0 || out(2) < 0)
    return who + " has no past or present cache";
  auto key = layer_of(g.values[in(3)].name, "past_key_values.", ".key");
  auto value = layer_of(g.values[in(4)].name, "past_key_values.", ".value");
  if (!key || !value || *key != *value || !is_input(g, in(3)) || !is_input(g, in(4)))
    return who + " does not read the graph inputs past_key_values.N.key and .value";
  if (uses[in(3)] != 1 || uses[in(4)] != 1)
    return who + "'s past is read by other nodes too";
  if (layer_of(g.values[out(1)].name, "present.", ".key") != key
      || layer_of(g.values[out(2)].name, "present.", ".value") != key || !is_output(g, out(1))
      || !is_output(g, out(2)))
    return who + " does not write the graph outputs present.N.key and .value";
  for (size_t i = 9; i < n.inputs.size(); ++i)
    if (in(i) >= 0)
      return who + " takes position_ids, attention_bias or head_sink";
  if (out(3) >= 0 || n.get_i("local_window_size", -1) != -1 || n.get_i("smooth_softmax", 0) != 0
      || n.get_f("softcap", 0.f) != 0.f || n.get_i("qk_output", 0) != 0)
    return who + " uses a local window, smooth softmax, softcap or output_qk";
  layer = *key;
  return std::nullopt;
}

} // namespace

paged_attention_result rewrite_paged_attention(graph& g, const paged_attention_config& config) {
  paged_attention_result result;
  auto uses = g.use_counts();
  std::vector<size_t> found;
  std::vector<int64_t> layers;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op != gqa_op)
      continue;
    int64_t layer = -1;
    if (auto why = refusal(g, g.nodes[i], uses, layer)) {
      result.refused = *why;
      return result;
    }
    found.push_back(i);
    layers.push_back(layer);
  }
  if (found.empty()) {
    result.refused = "the graph has no GroupQueryAttention";
    return result;
  }
  auto sorted = layers;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != static_cast<int64_t>(i)) {
      result.refused = "the GroupQueryAttention layers are not numbered 0.." +
                       std::to_string(sorted.size() - 1) + " once each";
      return result;
    }
  size_t past_inputs = 0;
  for (int v : g.inputs)
    if (g.values[v].name.rfind("past_key_values.", 0) == 0)
      ++past_inputs;
  if (past_inputs != 2 * found.size()) {
    result.refused = "the graph has " + std::to_string(past_inputs) + " past_key_values inputs "
                     "for " + std::to_string(found.size()) + " GroupQueryAttention layers";
    return result;
  }

  int table = g.add_value(kv_block_table_input, datatype::int32, {-1, -1}, true);
  int context = g.add_value(kv_context_lens_input, datatype::int32, {-1, 1}, true);
  std::vector<int> past;
  for (size_t k = 0; k < found.size(); ++k) {
    node& n = g.nodes[found[k]];
    past.push_back(n.inputs[3]);
    past.push_back(n.inputs[4]);
    auto in = [&](size_t i) { return n.inputs.size() > i ? n.inputs[i] : -1; };
    n.inputs = {in(0), in(1), in(2), table, context, in(7), in(8)};
    n.op = paged_gqa_op;
    n.set_i("layer", layers[k]);
    n.set_i("layers", static_cast<int64_t>(found.size()));
    n.set_i("block_tokens", config.block_tokens);
    n.set_i("kv_pool", static_cast<int64_t>(config.kv_pool));
    for (size_t o : {size_t{1}, size_t{2}}) {
      auto& shape = g.values[n.outputs[o]].shape;
      if (shape.size() == 4)
        shape[2] = -1; // the new positions: as many as the query's
    }
  }
  std::vector<int> inputs;
  for (int v : g.inputs)
    if (std::find(past.begin(), past.end(), v) == past.end())
      inputs.push_back(v);
  inputs.push_back(table);
  inputs.push_back(context);
  g.inputs = std::move(inputs);
  // seqlens_k and total_sequence_length, computed from the mask, feed nothing now.
  remove_dead_nodes(g);
  result.layers = static_cast<uint32_t>(found.size());
  return result;
}

} // namespace caf_serving::onnx
