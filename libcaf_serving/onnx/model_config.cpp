#include "onnx/model_config.hpp"

#include "onnx/batch_coupling.hpp"
#include "core/reshape.hpp"

#include <algorithm>
#include <iostream>

namespace caf_serving::onnx {

namespace {

using dims_t = std::vector<int64_t>;

serving_error load_error(const config_completion_config& cfg, const std::string& what) {
  return {status_code::bad_request,
          "model '" + cfg.config.name + "': " + cfg.model_file.string() + ": " + what};
}

int find_value(const graph& g, const std::vector<int>& list, const std::string& name) {
  for (int v : list)
    if (g.values[v].name == name)
      return v;
  return -1;
}

std::string dims_text(const std::vector<int64_t>& d) {
  return shape_string(d);
}

/// Completes `cfg` from the graph, or names the contradiction.
result<model_config> complete_config(const graph& g, const config_completion_config& mcfg) {
  model_config cfg = mcfg.config;
  bool batched = cfg.max_batch_size > 0;
  auto io_dims = [&](const value& v) -> result<dims_t> {
    if (!batched)
      return v.shape;
    if (v.shape.empty())
      return load_error(mcfg, "'" + v.name + "' has no batch dimension, but max_batch_size is "
                                + std::to_string(cfg.max_batch_size)
                                + "; set max_batch_size: 0 or export with a batch axis");
    if (v.shape[0] > 1)
      return load_error(mcfg, "'" + v.name + "' has a fixed first dimension of "
                                + std::to_string(v.shape[0]) + " in " + dims_text(v.shape)
                                + ", so it cannot take batches up to max_batch_size "
                                + std::to_string(cfg.max_batch_size)
                                + "; export with a dynamic batch axis or set max_batch_size: 0");
    return dims_t(v.shape.begin() + 1, v.shape.end());
  };
  auto compatible = [](const dims_t& a, const dims_t& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] && a[i] != -1 && b[i] != -1) return false;
    return true;
  };
  // Inputs.
  for (const auto& t : cfg.inputs)
    if (find_value(g, g.inputs, t.name) < 0) {
      std::string names;
      for (int v : g.inputs) names += (names.empty() ? "'" : ", '") + g.values[v].name + "'";
      return load_error(mcfg, "config.pbtxt declares input '" + t.name
                                + "', but the ONNX graph has no such input; its inputs are "
                                + names);
    }
  std::vector<tensor_config> inputs;
  for (int v : g.inputs) {
    const auto& val = g.values[v];
    auto dims = io_dims(val);
    if (!dims) return dims.error();
    auto it = std::find_if(cfg.inputs.begin(), cfg.inputs.end(),
                           [&](const tensor_config& t) { return t.name == val.name; });
    if (it == cfg.inputs.end()) {
      inputs.push_back({val.name, val.dtype, *dims});
      continue;
    }
    if (it->dtype != val.dtype)
      return load_error(mcfg, "config.pbtxt gives input '" + val.name + "' data_type "
                                + std::string(to_string(it->dtype)) + ", but the ONNX graph has "
                                + std::string(to_string(val.dtype)));
    if (!it->dims.empty() && !compatible(it->dims, *dims))
      return load_error(mcfg, "config.pbtxt gives input '" + val.name + "' dims "
                                + dims_text(it->dims) + ", but the ONNX graph has "
                                + dims_text(*dims) + " (batch dimension excluded)");
    tensor_config t = *it;
    if (t.dims.empty()) t.dims = *dims;
    inputs.push_back(t);
  }
  // Keep config order when it listed inputs; the graph's otherwise.
  if (!cfg.inputs.empty()) {
    std::vector<tensor_config> ordered;
    for (const auto& t : cfg.inputs)
      for (const auto& c : inputs) if (c.name == t.name) ordered.push_back(c);
    for (const auto& c : inputs)
      if (std::none_of(ordered.begin(), ordered.end(),
                       [&](const tensor_config& o) { return o.name == c.name; }))
        ordered.push_back(c);
    inputs = ordered;
  }
  cfg.inputs = inputs;

  // Output shapes come from shape inference at batch 1; with variable input
  // dimensions, at two probes, and an output dimension that differs between
  // them is variable too.
  auto probes = probe_shapes(g, cfg, mcfg.expected_shapes);
  if (!probes)
    return load_error(mcfg, probes.error().message);
  const graph* spec = &probes->first;
  for (const auto& t : cfg.outputs)
    if (find_value(*spec, spec->outputs, t.name) < 0) {
      std::string names;
      for (int v : spec->outputs)
        names += (names.empty() ? "'" : ", '") + spec->values[v].name + "'";
      return load_error(mcfg, "config.pbtxt declares output '" + t.name
                                + "', but the ONNX graph has no such output; its outputs are "
                                + names);
    }
  std::vector<tensor_config> outputs;
  for (size_t o = 0; o < spec->outputs.size(); ++o) {
    const auto& val = spec->values[spec->outputs[o]];
    dims_t dims = val.shape;
    if (probes->second) {
      const auto& other = probes->second->values[probes->second->outputs[o]].shape;
      if (other.size() != dims.size())
        return load_error(mcfg, "output '" + val.name + "' has rank " + std::to_string(dims.size())
                                  + " at one input size and " + std::to_string(other.size())
                                  + " at another; the server needs outputs of one rank");
      for (size_t d = 0; d < dims.size(); ++d)
        if (other[d] != dims[d])
          dims[d] = -1;
    }
    if (batched) dims.erase(dims.begin());
    auto it = std::find_if(cfg.outputs.begin(), cfg.outputs.end(),
                           [&](const tensor_config& t) { return t.name == val.name; });
    if (it == cfg.outputs.end()) {
      if (cfg.outputs.empty())
        outputs.push_back({val.name, val.dtype, dims});
      continue;
    }
    if (it->dtype != val.dtype)
      return load_error(mcfg, "config.pbtxt gives output '" + val.name + "' data_type "
                                + std::string(to_string(it->dtype)) + ", but the ONNX graph has "
                                + std::string(to_string(val.dtype)));
    if (!it->dims.empty() && !compatible(it->dims, dims))
      return load_error(mcfg, "config.pbtxt gives output '" + val.name + "' dims "
                                + dims_text(it->dims) + ", but the ONNX graph computes "
                                + dims_text(dims) + " (batch dimension excluded)");
    tensor_config t = *it;
    if (t.dims.empty()) t.dims = dims;
    outputs.push_back(t);
  }
  if (!cfg.outputs.empty()) {
    std::vector<tensor_config> ordered;
    for (const auto& t : cfg.outputs)
      for (const auto& c : outputs) if (c.name == t.name) ordered.push_back(c);
    outputs = ordered;
  }
  cfg.outputs = outputs;
  return cfg;
}

/// Triton's ONNX Runtime backend's AutoCompleteMaxBatch, for a config that
/// lists no inputs or no outputs (Triton skips auto-complete otherwise).
result<model_config> autofill_batching(const graph& g, const config_completion_config& mcfg) {
  model_config cfg = mcfg.config;
  if (!mcfg.auto_complete || (!cfg.inputs.empty() && !cfg.outputs.empty()))
    return cfg;
  bool can_batch = !g.inputs.empty();
  for (int v : g.inputs)
    can_batch = can_batch && !g.values[v].shape.empty() && g.values[v].shape[0] == -1;
  // An output declared without a shape says nothing either way.
  for (int v : g.outputs)
    can_batch = can_batch && (g.values[v].shape.empty() || g.values[v].shape[0] == -1);
  if (!can_batch) {
    if (cfg.max_batch_size != 0)
      return load_error(mcfg, "autofill failed for model '" + cfg.name
                                + "': model does not support batching while non-zero "
                                  "max_batch_size is specified; set max_batch_size: 0, or "
                                  "export the graph with a variable first dimension on every "
                                  "input and output");
    return cfg;
  }
  if (cfg.max_batch_size == 0) {
    cfg.max_batch_size = std::max(mcfg.default_max_batch_size, 0);
    std::cout << "model " << cfg.name << ": autofilled max_batch_size to "
              << cfg.max_batch_size
              << " since batching is supported but no max_batch_size is specified in the "
                 "model configuration (as Triton does; set max_batch_size for a larger batch)"
              << std::endl;
  }
  if (cfg.max_batch_size > 1 && !cfg.dynamic_batching_enabled)
    cfg.dynamic_batching_enabled = true;
  return cfg;
}

/// The client's view of a completed model-side config: tensors with a
/// reshape get their config dims back. A tensor the graph completed that is a
/// scalar per batch row becomes dims [1] with an empty reshape, as Triton's
/// auto-complete writes it.
model_config client_side(model_config completed, const model_config& given) {
  auto restore = [&](std::vector<tensor_config>& tensors, const std::vector<tensor_config>& as_given) {
    for (auto& t : tensors) {
      auto it = std::find_if(as_given.begin(), as_given.end(),
                             [&](const tensor_config& g) { return g.name == t.name; });
      if (it != as_given.end() && it->reshape) {
        t.dims = it->dims;
        t.reshape = it->reshape;
      } else if (it == as_given.end() && completed.max_batch_size > 0 && t.dims.empty()) {
        t.dims = {1};
        t.reshape = std::vector<int64_t>{};
      }
    }
  };
  restore(completed.inputs, given.inputs);
  restore(completed.outputs, given.outputs);
  return completed;
}

} // namespace

/// The graph's inputs reordered as cfg.inputs lists them (compile() expects that order).
graph inputs_in_config_order(graph g, const model_config& cfg) {
  std::vector<int> ordered;
  for (const auto& t : cfg.inputs)
    ordered.push_back(find_value(g, g.inputs, t.name));
  g.inputs = ordered;
  return g;
}

result<completed_config> complete_model_config(const graph& g,
                                               const config_completion_config& given) {
  auto batching = autofill_batching(g, given);
  if (!batching)
    return batching.error();
  if (auto why = batching->max_batch_size > 1 && batching->dynamic_batching_enabled
                   ? batch_coupling(g) : std::nullopt) {
    batching->dynamic_batching_enabled = false; // batch_coupling.hpp
    std::cout << "model " << batching->name << ": dynamic batching off, each request runs "
              << "alone: " << *why << ", so batched requests would change each other's "
              << "answers" << std::endl;
  }
  // The graph is checked on the model's shapes (reshape where given); clients
  // see the config's dims.
  auto mcfg = given;
  mcfg.config = model_side(*batching);
  auto cfg = complete_config(g, mcfg);
  if (!cfg && has_reshape(*batching))
    return serving_error{cfg.error().status,
                         cfg.error().message + " (for a tensor with a reshape, the dims checked "
                                               "against the graph are reshape.shape)"};
  if (!cfg)
    return cfg.error();
  return completed_config{*batching, *cfg, client_side(*cfg, *batching)};
}

} // namespace caf_serving::onnx
