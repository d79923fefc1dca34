#pragma once
/// Completes and checks a model's configuration (config.pbtxt, parsed) against
/// its ONNX graph, as Triton's auto-complete does: inputs and outputs a config
/// leaves out come from the graph, those it gives must agree with it, and a
/// graph that batches gets max_batch_size and dynamic batching. Every backend
/// that serves an ONNX graph runs this before it plans: the CPU backend
/// (onnx_cpu/onnx_backend.hpp) and the CUDA backend (cuda/cuda_backend.hpp),
/// so both accept and refuse the same configurations with the same words.
///
/// Usage:
///
///     auto done = onnx::complete_model_config(graph, {file, cfg});
///     if (!done) fail(done.error().message);  // names the file and the contradiction
///     serve(done->client);                     // what clients see (dims before reshape)
///     plan(onnx::inputs_in_config_order(graph, done->model));

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "onnx/ir.hpp"
#include "onnx/shape_plans.hpp"

#include <filesystem>
#include <vector>

namespace caf_serving::onnx {

struct config_completion_config {
  /// Names the model in errors.
  std::filesystem::path model_file;
  /// As parsed from config.pbtxt; inputs, outputs and dims may be missing.
  model_config config;
  /// Shapes of inputs with variable dimensions (shape_plans.hpp): output
  /// dimensions are inferred at them.
  std::vector<shape_set> expected_shapes;
  /// Triton's auto-complete (on unless --strict-model-config=true): for a
  /// config that lists no inputs or no outputs, a graph whose every input and
  /// output has a variable first dimension gets max_batch_size
  /// default_max_batch_size when the config left it 0, and dynamic batching
  /// when that is above 1 (as Triton's ONNX Runtime backend does).
  bool auto_complete = true;
  /// Triton's --backend-config=default-max-batch-size.
  int default_max_batch_size = 4;
};

/// A configuration completed from the graph, in three views.
struct completed_config {
  /// The given config after Triton's auto-complete of batching only.
  model_config autofilled;
  /// The graph's side: tensors with a reshape carry reshape.shape as dims;
  /// inputs and outputs complete, in config order. Plans run on this.
  model_config model;
  /// The client's side: tensors with a reshape keep their config dims; a
  /// tensor the graph completed that is a scalar per batch row gets dims [1]
  /// with an empty reshape, as Triton's auto-complete writes it.
  model_config client;
};

/// Completes `cfg.config` from `g`, or names the file and what contradicts the
/// graph (the tensor, both types or both shapes, and what to change).
result<completed_config> complete_model_config(const graph& g,
                                               const config_completion_config& cfg);

/// `g` with its inputs reordered as `cfg.inputs` lists them (the order plans
/// and batches use).
graph inputs_in_config_order(graph g, const model_config& cfg);

} // namespace caf_serving::onnx
