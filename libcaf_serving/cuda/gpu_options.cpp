#include "cuda/gpu_options.hpp"

#include <algorithm>
#include <sstream>

namespace caf_serving::cuda {

const char* to_string(precision p) {
  switch (p) {
    case precision::fp32: return "fp32";
    case precision::fp16: return "fp16";
    case precision::bf16: return "bf16";
  }
  return "?";
}

datatype storage_type(precision p) {
  switch (p) {
    case precision::fp16: return datatype::fp16;
    case precision::bf16: return datatype::bf16;
    case precision::fp32: break;
  }
  return datatype::fp32;
}

bool wants_gpu(const model_config& cfg) {
  return std::any_of(cfg.instance_groups.begin(), cfg.instance_groups.end(),
                     [](const instance_group_config& g) { return g.kind == instance_kind::gpu; });
}

namespace {

serving_error option_error(const model_config& cfg, const std::string& what) {
  return {status_code::bad_request, "model '" + cfg.name + "': " + what};
}

uint32_t max_rows(const model_config& cfg) {
  return static_cast<uint32_t>(std::max(cfg.max_batch_size, 1));
}

result<std::vector<uint32_t>> parse_sizes(const model_config& cfg, const std::string& text) {
  std::vector<uint32_t> sizes;
  if (text == "none")
    return sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(std::remove(item.begin(), item.end(), ' '), item.end());
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || static_cast<uint32_t>(v) > max_rows(cfg))
      return option_error(cfg, std::string("parameter '") + graph_sizes_key + "' holds '" + item
                                 + "'; give comma-separated batch sizes from 1 to "
                                 + std::to_string(max_rows(cfg))
                                 + " (max_batch_size), or \"none\"");
    sizes.push_back(static_cast<uint32_t>(v));
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

} // namespace

std::vector<uint32_t> default_buckets(const model_config& cfg) {
  uint32_t top = max_rows(cfg);
  std::vector<uint32_t> b;
  if (cfg.max_batch_size > 0 && !cfg.dynamic_batching.preferred_batch_sizes.empty()) {
    for (int s : cfg.dynamic_batching.preferred_batch_sizes)
      if (s >= 1 && static_cast<uint32_t>(s) <= top)
        b.push_back(static_cast<uint32_t>(s));
  } else {
    for (uint32_t s = 1; s < top; s *= 2)
      b.push_back(s);
  }
  b.push_back(top);
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

result<gpu_options> read_gpu_options(const model_config& cfg) {
  gpu_options o;
  if (auto it = cfg.parameters.find(precision_key); it != cfg.parameters.end()) {
    if (it->second == "fp32") o.compute = precision::fp32;
    else if (it->second == "fp16") o.compute = precision::fp16;
    else if (it->second == "bf16") o.compute = precision::bf16;
    else
      return option_error(cfg, std::string("parameter '") + precision_key + "' is '" + it->second
                                 + "'; use \"fp32\", \"fp16\" or \"bf16\"");
  }
  for (const auto& g : cfg.instance_groups) {
    if (g.kind != instance_kind::gpu)
      continue;
    if (g.count < 1)
      return option_error(cfg, "instance_group '" + g.name + "' has count "
                                 + std::to_string(g.count) + "; give count: 1 or more");
    std::vector<int> devices = g.gpus.empty() ? std::vector<int>{0} : g.gpus;
    for (int d : devices) {
      if (d < 0)
        return option_error(cfg, "instance_group '" + g.name + "' lists GPU " + std::to_string(d)
                                   + "; GPU ids start at 0");
      for (int i = 0; i < g.count; ++i) {
        int on_device = static_cast<int>(std::count_if(
          o.placements.begin(), o.placements.end(),
          [d](const gpu_placement& p) { return p.device == d; }));
        o.placements.push_back({d, on_device});
      }
    }
  }
  if (auto it = cfg.parameters.find(graph_sizes_key); it != cfg.parameters.end()) {
    auto sizes = parse_sizes(cfg, it->second);
    if (!sizes)
      return sizes.error();
    o.buckets = *sizes;
  } else {
    o.buckets = default_buckets(cfg);
  }
  return o;
}

} // namespace caf_serving::cuda
