#pragma once
/// Assigns arena offsets to a graph's intermediate values so that values whose
/// lifetimes do not overlap share memory (greedy best fit over free blocks, in
/// node order).
///
/// Usage:
///
///     auto plan = onnx::plan_memory(g, {.external = is_input_or_output});
///     std::vector<uint8_t> arena(plan.arena_bytes);
///     float* x = reinterpret_cast<float*>(arena.data() + plan.offsets[v]);

#include "onnx/ir.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace caf_serving::onnx {

struct memory_plan_config {
  /// Values that live outside the arena (graph inputs and outputs, constants
  /// are always outside).
  std::function<bool(int)> external;
  /// Bytes a value needs; defaults to elements x element size.
  std::function<size_t(int)> bytes;
  size_t alignment = 64;
};

struct memory_plan {
  /// Byte offset of each value in the arena; -1 for values outside it.
  std::vector<int64_t> offsets;
  size_t arena_bytes = 0;
  /// What the arena would take without reuse (sum of all intermediates).
  size_t unshared_bytes = 0;
};

memory_plan plan_memory(const graph& g, const memory_plan_config& cfg);

} // namespace caf_serving::onnx
