#pragma once
/// One planned batch size's graph and memory plan for a CUDA executor instance
/// (host side only; no CUDA here, tested without a GPU).
///
/// The optimized graph at `rows` rows, and its liveness plan over the
/// instance's one activation arena. Only the graph inputs and the outputs the
/// model's config declares live outside the arena (in the instance's I/O
/// staging slots, where execute() copies them in and out); every other value,
/// including a graph output the config does not declare, gets an arena offset,
/// so no step ever writes through a null pointer.
///
/// Usage:
///
///     auto p = cuda::plan_graph({&graph, &config, passes, rows, device_alignment,
///                                storage_type(precision::fp16), &half_weights});
///     if (!p) fail(p.error().message);
///     arena_bytes = std::max(arena_bytes, p->memory.arena_bytes);

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "onnx/ir.hpp"
#include "onnx/memory_plan.hpp"
#include "onnx/passes.hpp"
#include "cuda/storage_plan.hpp"

#include <cstdint>
#include <vector>

namespace caf_serving::cuda {

struct planned_graph {
  uint32_t rows = 0;
  onnx::graph g;
  onnx::memory_plan memory;
  /// The type values between steps are stored in: fp32, or the half type of
  /// `precision` fp16/bf16 (storage_plan.hpp).
  datatype storage = datatype::fp32;
  /// Per value: fp32 in the optimized graph, stored in `storage` (empty at fp32).
  std::vector<bool> narrowed;
};

struct graph_plan_config {
  /// The imported graph, its inputs in `config`'s order.
  const onnx::graph* model = nullptr;
  /// The completed model config: input dims (without the batch), declared outputs.
  const model_config* config = nullptr;
  onnx::pass_config passes;
  uint32_t rows = 1;
  size_t alignment = 256;
  /// fp32, or fp16/bf16: the graph is rewritten by store_in_half (storage_plan.hpp)
  /// before the memory plan, so the arena holds half values.
  datatype storage = datatype::fp32;
  /// Half copies of the weights, shared by the planned sizes (optional).
  half_constants* constants = nullptr;
};

/// The input shapes at `rows` rows (the batch dimension first when the model
/// batches).
std::vector<std::vector<int64_t>> input_shapes_at(const model_config& config, uint32_t rows);

/// Whether value `v` of `g` lives outside the arena: a graph input, or a graph
/// output that `config` declares.
std::vector<bool> io_values(const onnx::graph& g, const model_config& config);

result<planned_graph> plan_graph(const graph_plan_config& cfg);

} // namespace caf_serving::cuda
