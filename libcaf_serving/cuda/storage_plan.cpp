#include "cuda/storage_plan.hpp"

#include "core/half.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>

namespace caf_serving::cuda {

onnx::constant_ptr half_copy(const onnx::tensor_data& t, datatype storage) {
  assert(t.dtype == datatype::fp32 && (storage == datatype::fp16 || storage == datatype::bf16));
  auto out = std::make_shared<onnx::tensor_data>();
  out->dtype = storage;
  out->shape = t.shape;
  const auto n = static_cast<size_t>(t.bytes.size() / sizeof(float));
  out->bytes.resize(n * sizeof(uint16_t));
  const float* src = t.as<float>();
  auto* dst = out->as_mut<uint16_t>();
  // Finite values past the half type's range saturate to its largest finite value
  // instead of rounding to infinity: exporters write attention masks as
  // (1 - m) * finfo(float32).min, and 0 * -inf would be NaN where m is 1.
  const float largest = storage == datatype::fp16 ? 65504.0f : 3.3895313892515355e38f;
  for (size_t i = 0; i < n; ++i) {
    float x = src[i];
    if (std::isfinite(x)) x = std::clamp(x, -largest, largest);
    dst[i] = storage == datatype::fp16 ? fp16_from_float(x) : bf16_from_float(x);
  }
  return out;
}

bool writes_fp32_output(const onnx::graph& g, const onnx::node& n) {
  auto in = [&n](size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; };
  if (n.outputs.size() != 1 || in(0) < 0 || in(1) < 0) return false;
  const auto& a = g.values[in(0)];
  const auto& w = g.values[in(1)];
  const auto& y = g.values[n.outputs[0]];
  if (a.dtype != datatype::fp32 || w.dtype != datatype::fp32 || y.dtype != datatype::fp32)
    return false;
  // The products whose kernels write fp32 from half operands, with what each needs.
  using operands_fit = bool (*)(const onnx::value& a, const onnx::value& w, const onnx::value& y);
  static const std::map<std::string, operands_fit> products{
    {"FusedGemm",
     [](const onnx::value& a, const onnx::value& w, const onnx::value& y) {
       return a.shape.size() == 2 && w.shape.size() == 2 && y.shape.size() == 2;
     }},
    {"FusedMatMul",
     [](const onnx::value&, const onnx::value& w, const onnx::value&) {
       return w.constant && w.shape.size() == 2;
     }},
  };
  auto product = products.find(n.op);
  if (product == products.end() || !product->second(a, w, y)) return false;
  for (size_t i = 2; i < n.inputs.size(); ++i)
    if (in(i) >= 0 && !(g.values[in(i)].constant && g.values[in(i)].dtype == datatype::fp32))
      return false;
  return true;
}

std::vector<bool> store_in_half(onnx::graph& g, const storage_config& cfg) {
  assert(cfg.storage == datatype::fp16 || cfg.storage == datatype::bf16);
  std::vector<bool> external(g.values.size(), false);
  for (int v : g.inputs) external[v] = true;
  for (int v : g.outputs)
    if (cfg.declared_output && cfg.declared_output(v)) external[v] = true;

  // Declared fp32 outputs their producer writes in fp32 itself (no StorageCast,
  // no half copy in the arena). Read by nothing else, so every other node still
  // sees one float type. The producer's constant bias or C is given a value of
  // its own holding the fp32 tensor (the constant may be shared), which the
  // narrowing below leaves alone.
  auto producers = g.producers();
  std::vector<size_t> readers(g.values.size(), 0);
  for (const auto& n : g.nodes)
    for (int v : n.inputs)
      if (v >= 0) readers[v] += 1;
  std::vector<bool> written_wide(g.values.size(), false);
  for (int y : g.outputs) {
    if (!external[y] || written_wide[y] || producers[y] < 0 || readers[y] != 0) continue;
    auto& p = g.nodes[producers[y]];
    if (!writes_fp32_output(g, p)) continue;
    written_wide[y] = true;
    for (size_t i = 2; i < p.inputs.size(); ++i) {
      const int c = p.inputs[i];
      if (c >= 0) p.inputs[i] = g.add_constant(g.values[c].name + "/fp32", g.values[c].constant);
    }
  }
  const size_t first_wide_constant = external.size();
  const size_t original = g.values.size();

  // One half copy per fp32 constant, shared through the cache.
  half_constants local;
  half_constants& cache = cfg.cache ? *cfg.cache : local;
  std::vector<bool> narrowed(original, false);
  for (size_t v = 0; v < original; ++v) {
    auto& val = g.values[v];
    if (val.dtype != datatype::fp32 || v >= first_wide_constant) continue;
    if (val.constant) {
      auto& slot = cache.copies[val.constant.get()];
      if (!slot.second) slot = {val.constant, half_copy(*val.constant, cfg.storage)};
      val.constant = slot.second;
    } else if (external[v]) {
      continue;
    }
    // Values between steps, and the constants they read.
    val.dtype = cfg.storage;
    narrowed[v] = true;
  }
  // A Cast into a narrowed value now casts to the storage type.
  const int64_t storage_code = cfg.storage == datatype::fp16 ? 10 : 16;
  for (auto& n : g.nodes)
    if (n.op == "Cast" && !n.outputs.empty() && n.outputs[0] >= 0 && narrowed[n.outputs[0]])
      n.set_i("to", storage_code);

  auto rewire_inputs = [&g](int from, int to) {
    for (auto& n : g.nodes)
      for (int& v : n.inputs)
        if (v == from) v = to;
  };
  // Edges: fp32 inputs converted first, declared fp32 outputs converted last.
  std::vector<onnx::node> first, last;
  auto edge_cast = [&cfg](std::string prefix, int from, int to) {
    onnx::node n;
    n.op = storage_cast_op;
    n.name = std::move(prefix) + std::string(to_string(cfg.storage));
    n.inputs = {from};
    n.outputs = {to};
    return n;
  };
  for (int x : g.inputs) {
    if (g.values[x].dtype != datatype::fp32) continue;
    int h = g.add_value(g.values[x].name + "/storage", cfg.storage, g.values[x].shape, true);
    rewire_inputs(x, h);
    first.push_back(edge_cast(g.values[x].name + "/to_", x, h));
  }
  for (int y : g.outputs) {
    if (!external[y] || g.values[y].dtype != datatype::fp32 || producers[y] < 0
        || written_wide[y])
      continue;
    int h = g.add_value(g.values[y].name + "/storage", cfg.storage, g.values[y].shape, true);
    rewire_inputs(y, h);
    for (int& o : g.nodes[producers[y]].outputs)
      if (o == y) o = h;
    last.push_back(edge_cast(g.values[y].name + "/from_", h, y));
  }
  g.nodes.insert(g.nodes.begin(), std::make_move_iterator(first.begin()),
                 std::make_move_iterator(first.end()));
  g.nodes.insert(g.nodes.end(), std::make_move_iterator(last.begin()),
                 std::make_move_iterator(last.end()));
  narrowed.resize(g.values.size(), true); // the edge values are in the storage type
  return narrowed;
}

} // namespace caf_serving::cuda
