#pragma once
/// The engine's CPU backend for ONNX models: import, complete and check the
/// model's configuration against the graph, and run batches through plans
/// compiled per input shape (every batch size up to max_batch_size, at load).
/// Inputs may have variable dimensions besides the batch (shape_plans.hpp):
/// their plans are compiled for the shapes listed at load and on first use
/// for the others.
///
/// Usage:
///
///     auto model = onnx::load_onnx_model({"/models/resnet/1/model.onnx", cfg, 2});
///     if (!model) fail(model.error().message);
///     serve(model->config, model->make_instance());   // one backend per executor
///     std::cout << model->summary;                    // arena size, node counts
///
/// A compiled plan: optimize() (passes.hpp), then one step per node (oneDNN
/// convolution, pooling and matmul with post-ops; the engine's kernels for
/// LayerNorm, GELU, softmax and attention; reference kernels for the rest) over
/// one arena whose buffers are shared by liveness (memory_plan.hpp).

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "executor/backend.hpp"
#include "onnx/ir.hpp"
#include "onnx/passes.hpp"
#include "onnx/passes_decoder.hpp"
#include "onnx/shape_plans.hpp"

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::onnx {

class work_pool;

struct onnx_model_config {
  std::filesystem::path model_file;
  /// As parsed from config.pbtxt; inputs, outputs and dims may be missing.
  model_config config;
  /// Compute threads of the pool the model's instances share, when `pool` is
  /// null (else the pool's size).
  unsigned threads = 1;
  pass_config passes;
  /// Times every step of every run (onnx_model::profile_report prints the
  /// totals). Costs two clock reads per step.
  bool profile = false;
  /// Runs 3x3 stride-1 convolutions with Winograd's F(4x4, 3x3) where oneDNN
  /// has the kernel: about half the time, relative error about 1e-6 per layer.
  bool winograd = true;
  /// Runs the convolutions over nChw16c that Winograd does not (1x1, strided)
  /// with the engine's own AVX-512 direct kernel (kernels/cpu/engine_conv.cpp)
  /// where it applies (AVX-512 only), else with oneDNN's.
  bool engine_conv = true;
  /// Keeps convolution and pooling tensors in oneDNN's blocked layout of this
  /// process's ISA (nChw16c with AVX-512, nChw8c below: cpu_level.hpp) where
  /// their channels fill whole blocks, NHWC otherwise. false: NHWC for all of
  /// them, oneDNN's other fast layout (for comparisons: caf-onnx-bench
  /// --layout nhwc).
  bool blocked_layout = true;
  /// Splits other convolutions of one blocked image whose input outweighs
  /// its weights into bands of output rows, run by oneDNN on dense copies.
  bool conv_bands = true;
  /// Runs QLinearConv and QLinearMatMul with INT8 weights (zero points 0) on
  /// oneDNN's int8 convolution and matmul (quant_steps.hpp), several times
  /// faster than the exact integer reference; its float requantisation rounds about one output in
  /// 2,000 one quantum away from onnxruntime's. false: the reference kernel.
  bool int8_onednn = true;
  /// A batch of at least as many rows as threads runs as row chunks, a whole
  /// plan per thread, unless the chunks' matmuls (most of the plan's FLOPs)
  /// would get fewer rows than this: then it runs as one plan split across
  /// the threads, streaming each weight matrix once (row_chunks.hpp). 0:
  /// always row chunks. config.pbtxt: parameters "chunk_min_matmul_rows".
  int64_t chunk_min_matmul_rows = 64;
  /// Plans for shapes outside those compiled at load (which are pinned) that
  /// the model keeps for all its instances; the least recently used goes
  /// beyond this. Reordered weights are shared by all plans.
  /// config.pbtxt: parameters "plan_cache_size" (1 to 1024).
  size_t plan_cache_size = 8;
  /// The same cache's bound in bytes: each plan counts its arena and the
  /// constants it owns (folded for its shapes). A request whose plan alone
  /// exceeds it is refused with a 400 naming both sizes. (The compute
  /// threads' scratch arenas, shared by the model's instances, grow to the
  /// largest plan each has run: up to one such plan's arena per thread.)
  /// config.pbtxt: parameters "plan_cache_bytes" (a byte count, at least 1 MiB).
  size_t plan_cache_bytes = size_t{1} << 30;
  /// Shapes of inputs with variable dimensions to compile at load, each for
  /// every batch size 1..max_batch_size, pinned (with model_warmup's shapes).
  /// config.pbtxt: parameters "expected_shapes" (syntax in shape_plans.hpp).
  std::vector<shape_set> expected_shapes;
  /// Triton's auto-complete (on unless --strict-model-config=true): for a
  /// config that lists no inputs or no outputs, a graph whose every input and
  /// output has a variable first dimension gets max_batch_size
  /// default_max_batch_size when the config left it 0, and dynamic batching
  /// when that is above 1 (as Triton's ONNX Runtime backend does).
  bool auto_complete = true;
  /// Triton's --backend-config=default-max-batch-size, 4 by default.
  int default_max_batch_size = 4;
  /// The process's compute threads, shared by every instance of every model
  /// (thread_config::executor_threads of them); an instance holds the pool for
  /// one batch at a time. Null: the model makes one pool of `threads` for all
  /// its instances.
  std::shared_ptr<work_pool> pool;
};

struct onnx_model {
  /// `config` completed from the graph (inputs, outputs, dims, and with
  /// auto_complete max_batch_size and dynamic batching) as Triton's
  /// auto-complete does. Dims are the client's: a tensor with a reshape keeps
  /// its config dims, and instances translate (executor/reshape_backend.hpp).
  model_config config;
  /// One line: nodes before and after optimization, arena size at batch 1.
  std::string summary;
  /// One line per node whose plan step landed on a oneDNN reference kernel
  /// (no optimised kernel for its shapes and layouts at this process's ISA,
  /// cpu_level.hpp): the node, its step and the ISA. The loader logs them;
  /// the tests require none.
  std::vector<std::string> warnings;
  /// With pass_config::rewrite_decoder_attention: the layers rewritten into
  /// GroupQueryAttention, or why none was.
  decoder_attention_result decoder_attention;
  /// A backend for one executor instance: its own arena and pointer tables;
  /// the plans compiled at load and the compute pool are shared.
  std::function<std::shared_ptr<executor::backend>()> make_instance;
  /// With onnx_model_config::profile: the time each step took, summed over the
  /// runs of every instance, per plan (batch size), slowest kinds first.
  std::function<std::string()> profile_report;
  /// Bytes of weights reordered for oneDNN, shared by every plan and instance.
  std::function<size_t()> reordered_weight_bytes;
  /// Plans compiled so far, at load and by every instance since.
  std::function<size_t()> plans_compiled;
  /// Plans compiled after load that the shape-plan cache holds now, and
  /// their bytes (arena plus owned constants).
  std::function<size_t()> cached_plans;
  std::function<size_t()> cached_plan_bytes;
};

/// Imports, checks and compiles the model: every plan that a batch of 1 to
/// max_batch_size rows runs on the pool's threads, so no request waits for a
/// compile (for variable dimensions: at the shapes of expected_shapes and
/// model_warmup; other shapes compile on first use); then runs
/// config.model_warmup's samples. A variable input dimension makes the
/// config's output dims -1 where they follow it (shape inference at two probe
/// sizes). Errors name the file and what is wrong: the node, operator and
/// opset that cannot run, the config entry that contradicts the graph, with
/// both shapes, or the warmup sample that failed and why.
result<onnx_model> load_onnx_model(const onnx_model_config& cfg);

/// load_onnx_model() for a graph already imported (or built in code);
/// `cfg.model_file` only names the model in errors.
result<onnx_model> load_onnx_graph(graph g, const onnx_model_config& cfg);

/// The optimized plan at `batch` rows as text: one line per step with its
/// kernel, shapes and arena offset, then the arena size.
result<std::string> describe_plan(const onnx_model_config& cfg, int64_t batch);

} // namespace caf_serving::onnx
