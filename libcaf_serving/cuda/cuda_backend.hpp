#pragma once
/// The CUDA backend: runs the optimized ONNX plan (onnx/passes.hpp, the same plan
/// the CPU backend runs) on one GPU per executor instance.
///
/// Usage (what server/model_manager.cpp does for `instance_group { kind: KIND_GPU }`):
///
///     auto model = cuda::load_cuda_model({file, cfg, options});
///     if (!model) fail(model.error().message);       // also: no GPU visible
///     auto be = model->make_instance(placement);       // plans every size, captures the buckets
///     if (!be) fail(be.error().message);
///     policy.captured_batch_sizes = model->options.buckets;
///
/// Each instance owns, on its device: three streams (copy in, compute, copy out),
/// a cuBLASLt and a cuDNN handle, one device allocation laid out by
/// plan_device_arena (weights deduplicated across sizes, one activation arena
/// reused by every planned size, two I/O slots) and pinned host staging for both
/// slots. At construction it plans every batch size a batch can run at (the
/// buckets, plus max_batch_size when they stop short of it; with
/// cuda_graph_batch_sizes "none", sizes that are planned but not captured:
/// plan_sizes.hpp), chooses each convolution's algorithm (cudnnFind, once),
/// then walks capture_order(): warm-up, capture one graph per bucket and slot,
/// verify every slot's replay against the direct launch on random inputs
/// (replay_check.hpp), ready. A batch runs on the smallest planned size holding
/// it, padding rows zeroed in and dropped out: its graph's replay when the size
/// is captured, its steps launched directly otherwise. Nothing is planned,
/// allocated or searched on the request path. Graph outputs the config does not
/// declare live in the activation arena (graph_plan.hpp).
///
/// The backend is asynchronous (executor/backend.hpp, issue 20 item 6): its
/// executor submits a batch and is given the next while it computes, one per
/// staging slot. submit() stages the inputs in a free slot's pinned buffer and
/// enqueues copy-in (copy stream), the graph (compute stream, after the
/// copy-in's event) and copy-out (copy stream, after the compute's event); one
/// completion thread per instance waits for the batches in order, copies each
/// one's outputs from staging into its result and completes it. So batch N+1's
/// copy-in overlaps N's compute, and N's copy-out overlaps N+1's. The stage
/// times come from the device's events. execute() runs one batch the same way
/// and waits for it (tests, benchmarks).
///
/// A CUDA error in a batch (cuda_errors.hpp): the streams are synchronized and
/// the error read; a recoverable one is cleared and answers that batch with an
/// error; a sticky one (the context is lost) throws executor::executor_broken
/// for that batch and every later one, so the executor stops, the scheduler
/// sends the batch elsewhere and stops choosing the instance, and readiness and
/// /metrics count it out. The process keeps running.
///
/// Steps: FusedConv (cuDNN convolution + bias + residual + ReLU in one call),
/// pooling (cuDNN), FusedMatMul (cuBLASLt, then the engine's epilogue kernel for
/// bias, GELU/ReLU and residual), FusedLayerNorm, FusedGelu, FusedGeluTanh, Softmax, Relu and
/// same-shape Add (engine kernels), Reshape-like ops (device copies); every other
/// operator (Gather, attention in this first version, ...) runs its CPU
/// reference on pinned host copies through cudaLaunchHostFunc, which graphs can
/// capture. The summary counts those host steps: each is a performance gap.

#include "core/error.hpp"
#include "core/model_config.hpp"
#include "cuda/gpu_options.hpp"
#include "executor/backend.hpp"
#include "onnx/passes.hpp"

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace caf_serving::cuda {

/// CUDA devices visible to this process; 0 without a GPU or driver (never throws).
int visible_devices();

/// The operators with a device step (the backend's kernel table in the operator
/// registry's form, onnx/op_registry.hpp), sorted; every other node runs its
/// reference kernel on the host. Needs no device.
std::vector<std::string> device_step_ops();

struct cuda_model_config {
  std::filesystem::path model_file;
  /// As parsed from config.pbtxt; completed from the graph as for the CPU backend
  /// (onnx/model_config.hpp).
  model_config config;
  onnx::pass_config passes;
};

/// What an instance reports about itself (for logs and /metrics).
struct instance_report {
  int device = 0;
  /// The instance's one device allocation (weights, activations, I/O, workspace).
  size_t device_bytes = 0;
  size_t pinned_bytes = 0;
  /// Steps per bucket plan and how many of them run on the host.
  size_t steps = 0;
  size_t host_steps = 0;
  std::string arena; ///< describe(device_arena_layout)
};

/// One instance's backend with its report.
struct cuda_instance {
  std::shared_ptr<executor::backend> backend;
  instance_report report;
};

struct cuda_model {
  model_config config;
  gpu_options options;
  std::string summary;
  /// Builds one instance on `p.device`; returns only once every bucket's graph is
  /// captured and verified.
  std::function<result<cuda_instance>(const gpu_placement& p)> make_instance;
};

/// The steps a CUDA instance would run for a model, chosen without a device: a
/// dry run of the step selection (cuda/steps.hpp) over each planned batch
/// size's optimized graph. A node no device step takes is a host step (its
/// reference kernel between device copies): each is a performance gap, and
/// the target models must have none (tests/gpu/zoo). At precision fp16/bf16 the
/// edge conversions are the steps of kernel "convert" (one per fp32 input and
/// declared fp32 output) and the GEMMs that write a declared fp32 output from
/// half operands ("cublaslt+convert", instead of a "convert" after them); a host
/// step that converts around itself is "host:Op+convert".
struct plan_report {
  struct bucket {
    uint32_t rows = 0;
    /// Replayed as a CUDA graph (a bucket); else its steps launch directly.
    bool captured = false;
    size_t steps = 0;
    size_t arena_bytes = 0;
    std::map<std::string, size_t> kernels; ///< steps per kernel ("cudnn_conv", "host:Gather")
    std::vector<std::string> host_nodes;   ///< "Gather '/embeddings/Gather'"
    /// Values in the activation arena per stored type ("FP16": 812, "INT64": 3):
    /// at precision fp16/bf16 no float value there is fp32.
    std::map<std::string, size_t> arena_types;
  };
  /// What float values between steps are stored in (precision, gpu_options.hpp).
  datatype storage = datatype::fp32;
  std::vector<bucket> buckets;
};

/// Imports, completes and optimizes the model as load_cuda_model does, and
/// reports its steps per batch size. Needs no device: builds where CUDA does.
result<plan_report> plan_model(const cuda_model_config& cfg);

/// Imports and checks the model, reads its GPU options, and checks that the
/// devices it names exist. Errors say what was wrong and how to fix it.
result<cuda_model> load_cuda_model(const cuda_model_config& cfg);

} // namespace caf_serving::cuda
