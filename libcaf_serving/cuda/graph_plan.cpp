#include "cuda/graph_plan.hpp"

namespace caf_serving::cuda {

std::vector<std::vector<int64_t>> input_shapes_at(const model_config& config, uint32_t rows) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& t : config.inputs) {
    auto d = t.dims;
    if (config.max_batch_size > 0)
      d.insert(d.begin(), rows);
    shapes.push_back(std::move(d));
  }
  return shapes;
}

std::vector<bool> io_values(const onnx::graph& g, const model_config& config) {
  std::vector<bool> io(g.values.size(), false);
  for (int v : g.inputs)
    io[v] = true;
  for (int v : g.outputs)
    for (const auto& t : config.outputs)
      if (g.values[v].name == t.name)
        io[v] = true;
  return io;
}

result<planned_graph> plan_graph(const graph_plan_config& cfg) {
  auto opt = onnx::optimize(*cfg.model, input_shapes_at(*cfg.config, cfg.rows), cfg.passes);
  if (!opt)
    return opt.error();
  planned_graph p;
  p.rows = cfg.rows;
  p.g = std::move(*opt);
  p.storage = cfg.storage;
  if (cfg.storage != datatype::fp32) {
    auto declared = io_values(p.g, *cfg.config);
    p.narrowed = store_in_half(p.g, {cfg.storage, [&declared](int v) { return declared[v]; },
                                     cfg.constants});
  }
  auto io = io_values(p.g, *cfg.config);
  onnx::memory_plan_config mc;
  mc.external = [&io](int v) { return io[v]; };
  mc.alignment = cfg.alignment;
  p.memory = onnx::plan_memory(p.g, mc);
  return p;
}

} // namespace caf_serving::cuda
