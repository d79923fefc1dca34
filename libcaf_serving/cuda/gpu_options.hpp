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

#include "core/error.hpp"
#include "core/model_config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace caf_serving::cuda {

/// Compute precision of GEMMs and convolutions. Tensors between steps stay fp32
/// in every mode; fp16 and bf16 let cuBLASLt and cuDNN run tensor cores on inputs
/// rounded to that type with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16F/16BF,
/// CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION), and attention runs in that type.
enum class precision { fp32, fp16, bf16 };

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
