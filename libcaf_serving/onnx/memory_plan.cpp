#include "onnx/memory_plan.hpp"

#include <algorithm>
#include <iterator>
#include <map>

namespace caf_serving::onnx {

memory_plan plan_memory(const graph& g, const memory_plan_config& cfg) {
  memory_plan plan;
  plan.offsets.assign(g.values.size(), -1);
  auto align = [&](size_t b) { return (b + cfg.alignment - 1) / cfg.alignment * cfg.alignment; };
  auto size_of = [&](int v) {
    if (cfg.bytes)
      return align(cfg.bytes(v));
    const auto& val = g.values[v];
    return align(static_cast<size_t>(element_count(val.shape)) * element_size(val.dtype));
  };
  auto in_arena = [&](int v) {
    return v >= 0 && !g.values[v].constant && !(cfg.external && cfg.external(v));
  };
  // Last node that reads each value.
  std::vector<int> last_use(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int i : g.nodes[n].inputs)
      if (i >= 0)
        last_use[i] = static_cast<int>(n);

  std::map<size_t, size_t> free_blocks; // offset -> size
  auto release = [&](size_t off, size_t size) {
    auto it = free_blocks.emplace(off, size).first;
    auto next = std::next(it);
    if (next != free_blocks.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_blocks.erase(next);
    }
    if (it != free_blocks.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_blocks.erase(it);
      }
    }
  };
  auto allocate = [&](size_t size) -> size_t {
    auto best = free_blocks.end();
    for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
      if (it->second >= size && (best == free_blocks.end() || it->second < best->second))
        best = it;
    if (best != free_blocks.end()) {
      size_t off = best->first, rest = best->second - size;
      free_blocks.erase(best);
      if (rest)
        free_blocks.emplace(off + size, rest);
      return off;
    }
    // Grow the arena, reusing a free block that ends at its top.
    size_t off = plan.arena_bytes;
    if (!free_blocks.empty()) {
      auto last = std::prev(free_blocks.end());
      if (last->first + last->second == plan.arena_bytes) {
        off = last->first;
        free_blocks.erase(last);
      }
    }
    plan.arena_bytes = off + size;
    return off;
  };

  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const auto& nd = g.nodes[n];
    for (int o : nd.outputs) {
      if (!in_arena(o))
        continue;
      size_t size = size_of(o);
      plan.unshared_bytes += size;
      plan.offsets[o] = static_cast<int64_t>(allocate(size));
    }
    // Inputs whose last reader is this node are free once it has run. Outputs
    // are allocated first so that no node reads and writes the same memory.
    std::vector<int> done;
    for (int i : nd.inputs)
      if (in_arena(i) && last_use[i] == static_cast<int>(n)
          && std::find(done.begin(), done.end(), i) == done.end()) {
        done.push_back(i);
        release(static_cast<size_t>(plan.offsets[i]), size_of(i));
      }
    // An output nobody reads is free at once.
    for (int o : nd.outputs)
      if (in_arena(o) && last_use[o] < 0)
        release(static_cast<size_t>(plan.offsets[o]), size_of(o));
  }
  return plan;
}

} // namespace caf_serving::onnx
