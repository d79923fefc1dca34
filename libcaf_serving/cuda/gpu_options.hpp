#pragma once
/// What a model's config.pbtxt asks of the CUDA executor, as plain values:
/// which GPUs run how many instances, the compute precision, and the batch-size
/// buckets that get a captured CUDA graph each. No CUDA here: this runs and is
/// tested on machines without a GPU.
///
/// Usage:
///
///     auto opts = cuda::read_gpu_options(cfg);
///     if (!opts) fail(opts.error().message);
///     for (const auto& p : opts->placements) spawn(p.device);  // one per instance
///     auto sizes = cuda::plan_sizes(opts->buckets, cfg.max_batch_size); // plan_sizes.hpp
///
/// config.pbtxt fields read (Triton's names, plus the engine's own parameters):
/// - `instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] }`: `count` instances
///   on each listed GPU (Triton's meaning); no `gpus` means GPU 0.
/// - `parameters { key: "precision" value: { string_value: "fp16" } }`: fp32
///   (default), fp16 or bf16 (see precision below).
/// - `parameters { key: "cuda_graph_batch_sizes" value: { string_value: "1,4,16" } }`:
///   overrides the buckets; "none" captures no graph (every batch launches its
///   steps directly, on sizes still planned at load: plan_sizes.hpp).
/// - `dynamic_batching { preferred_batch_size: [...] }`: the default buckets.

#include "core/datatype.hpp"
#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::cuda {

/// The precision an instance computes and stores in (issue 20, "half precision
/// end to end"). fp32 (default): every tensor is fp32; GEMMs and convolutions
/// run CUBLAS_COMPUTE_32F and cuDNN's FMA math. fp16 and bf16: every fp32 value
/// between steps is stored in that type in the device arena (about half the
/// activation bytes), the weights are converted once at load and uploaded in
/// it, the model's fp32 inputs are converted after copy-in and its fp32 outputs
/// before copy-out (one StorageCast step each, or the output's GEMM writes it in
/// fp32 itself: the wire format and the config's declared types do not change),
/// and every kernel accumulates in fp32:
/// cuBLASLt with half A/B/C/D and CUBLAS_COMPUTE_32F, cuDNN with half tensors
/// and CUDNN_DATA_FLOAT compute, the engine's kernels with dtype f16/bf16.
/// Integer and bool tensors (token ids, masks, shapes) keep their types.
/// cuda/storage_plan.hpp rewrites each planned graph so.
enum class precision { fp32, fp16, bf16 };

/// The type values between steps are stored in at `p`: fp32, fp16 or bf16.
datatype storage_type(precision p);

const char* to_string(precision p);

/// The config.pbtxt parameter key for the precision (string_value fp32/fp16/bf16).
inline constexpr const char* precision_key = "precision";
/// The config.pbtxt parameter key overriding the captured batch sizes.
inline constexpr const char* graph_sizes_key = "cuda_graph_batch_sizes";

/// One executor instance on one GPU.
struct gpu_placement {
  int device = 0;
  /// Index among the instances on the same device (names its streams in logs).
  int index_on_device = 0;
};

struct gpu_options {
  precision compute = precision::fp32;
  /// One entry per executor instance.
  std::vector<gpu_placement> placements;
  /// Batch sizes with a captured graph, ascending, each in [1, max(1, max_batch_size)].
  std::vector<uint32_t> buckets;
};

/// Whether `cfg` asks for GPU instances (any instance_group of KIND_GPU).
bool wants_gpu(const model_config& cfg);

/// Reads the GPU options of `cfg`. Errors name the field, the bad value and the
/// accepted ones.
result<gpu_options> read_gpu_options(const model_config& cfg);

/// The default buckets: the preferred batch sizes when the model has any
/// (plus max_batch_size, so every batch has a graph), else the powers of two up
/// to max_batch_size, plus max_batch_size itself. {1} for a model that does not
/// batch (max_batch_size 0).
std::vector<uint32_t> default_buckets(const model_config& cfg);

/// Which batch sizes are planned and how a batch runs on them: plan_sizes.hpp.

} // namespace caf_serving::cuda
