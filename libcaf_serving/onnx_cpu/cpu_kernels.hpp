#pragma once
/// The CPU backend's kernels beyond the reference ones, in the operator
/// registry's form (onnx/op_registry.hpp: kernel_table), per operator:
/// oneDNN's convolution (and the engine's direct convolution), pooling,
/// matmul, reorders and channel scale (onednn_steps.hpp), oneDNN's int8
/// convolution (quant_steps.hpp), and the engine's LayerNorm, GELU, softmax
/// and attention (kernels/cpu/engine_kernels.hpp). The plan compiler turns
/// each node into the step of the first kernel of its operator that takes it;
/// a node that none takes runs its operator's reference kernel, in bands of
/// elements over the threads where the operator is element-wise.
///
/// A new CPU kernel is one entry in cpu_kernels() (onnx_backend.cpp) whose
/// build function returns the step, or nothing for the nodes it does not take.
///
/// Usage:
///
///     if (cpu_kernels().has("FusedConv")) ...
///     auto step = cpu_kernels().build(cpu_step_context{dnnl, threads, layouts, cfg}, g, n);

#include "onnx/op_registry.hpp"
#include "onnx/paged_attention.hpp"
#include "onnx_cpu/onednn_steps.hpp"
#include "onnx_cpu/onnx_backend.hpp"

namespace caf_serving::onnx {

/// What a CPU kernel builds its step with, besides the graph and the node.
struct cpu_step_context {
  const dnnl_ctx& dnnl;
  /// Threads the step's work items are split for.
  unsigned threads = 1;
  /// Each value's layout, as assign_layouts() chose.
  const layout_map& layouts;
  const onnx_model_config& config;
};

using cpu_kernel_table = kernel_table<const cpu_step_context, step>;

/// The CPU backend's kernels, each registered once.
const cpu_kernel_table& cpu_kernels();

/// One row's attention by the engine's paged attention kernel
/// (kernels/cpu/paged_attention.hpp, at engine_isa_level()), in the form
/// run_paged_gqa_rows() takes: what the engine.paged_attention step runs.
void engine_paged_row(const paged_row& row);

} // namespace caf_serving::onnx
