#pragma once
/// A model's configuration as the engine sees it: plain C++, no protobuf.
///
/// The repository loader fills it from Triton's config.pbtxt (repository/); the
/// scheduler, executors and ingress read it. Field meanings follow Triton's
/// model_config.proto unless a comment says otherwise.

#include "core/datatype.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace caf_serving {

/// Triton's ModelInput.Format: how an image input's three dims are laid out.
/// The engine checks it (three dims) and shows it; the model decides what the
/// dims mean, as in Triton.
enum class tensor_format { none, nhwc, nchw };

/// One input or output. `dims` excludes the batch dimension when the model's
/// max_batch_size > 0 (as in Triton); -1 marks a variable dimension.
struct tensor_config {
  std::string name;
  datatype dtype = datatype::fp32;
  /// The shape requests send and responses carry.
  std::vector<int64_t> dims;
  /// Triton's `reshape`: the shape the model itself takes or computes, with
  /// the same elements in the same order (the batch dimension, when there is
  /// one, stays in front). Empty optional: the model sees `dims`. An empty
  /// vector is a scalar per batch row (Triton's `reshape: { shape: [] }`).
  std::optional<std::vector<int64_t>> reshape;
  /// Inputs only.
  tensor_format format = tensor_format::none;
  /// Inputs only: a request may leave it out (Triton's `optional`).
  bool optional = false;

  /// The shape the model sees: `reshape` when there is one, else `dims`.
  const std::vector<int64_t>& model_dims() const { return reshape ? *reshape : dims; }
};

enum class timeout_action { reject, delay };

/// Triton's ModelQueuePolicy.
struct queue_policy {
  timeout_action action = timeout_action::reject;
  /// 0: requests never time out unless they set their own `timeout` parameter.
  uint64_t default_timeout_us = 0;
  /// Whether a request's `timeout` parameter may replace default_timeout_us.
  bool allow_timeout_override = false;
  /// 0 in config.pbtxt means "no limit" in Triton; the engine never runs unbounded,
  /// so 0 is replaced by the server's --max-queue-size when the model loads.
  uint32_t max_queue_size = 0;
};

/// Triton's ModelDynamicBatching.
struct dynamic_batching_config {
  std::vector<int> preferred_batch_sizes;
  uint64_t max_queue_delay_us = 0;
  bool preserve_ordering = false;
  /// 0: one level. Otherwise levels 1..priority_levels, 1 is the highest.
  uint32_t priority_levels = 0;
  /// Level of a request that names none (0 only when priority_levels is 0).
  uint32_t default_priority_level = 0;
  queue_policy default_queue_policy;
  /// Per-level overrides of default_queue_policy, keyed by level.
  std::map<uint32_t, queue_policy> priority_queue_policy;
};

enum class instance_kind { automatic, cpu, gpu, model };

/// Triton's ModelInstanceGroup.
struct instance_group_config {
  std::string name;
  int count = 1;
  instance_kind kind = instance_kind::automatic;
  std::vector<int> gpus;
};

/// Where a warmup input's data comes from (Triton's ModelWarmup.Input oneof).
enum class warmup_data { zero, random, file };

/// One input of a warmup sample. `dims` excludes the batch dimension, as the
/// model's inputs do.
struct warmup_input {
  std::string name;
  datatype dtype = datatype::fp32;
  std::vector<int64_t> dims;
  warmup_data data = warmup_data::zero;
  /// With warmup_data::file: raw tensor bytes (all batch_size rows), read from
  /// the model directory's warmup/ folder as Triton does.
  std::string file;
};

/// Triton's ModelWarmup: a request of `batch_size` rows run `count` times
/// while the model loads, before it is marked ready.
struct warmup_sample {
  std::string name;
  uint32_t batch_size = 1;
  std::vector<warmup_input> inputs;
  /// Runs of the sample; Triton's 0 ("not set") is read as 1.
  uint32_t count = 1;
};

struct model_config {
  std::string name;
  /// Triton's `platform` ("onnxruntime_onnx") and `backend` ("onnxruntime", or the
  /// engine's own "builtin"); the loader picks the backend from these.
  std::string platform;
  std::string backend;
  /// 0: the model takes no batch dimension and the scheduler never batches.
  int max_batch_size = 0;
  std::vector<tensor_config> inputs;
  std::vector<tensor_config> outputs;
  /// Whether config.pbtxt had a dynamic_batching block at all.
  bool dynamic_batching_enabled = false;
  dynamic_batching_config dynamic_batching;
  std::vector<instance_group_config> instance_groups;
  /// Triton's `parameters { key: ... value: { string_value: ... } }`.
  std::map<std::string, std::string> parameters;
  /// Triton's version_policy, reduced to what the engine supports: serve the
  /// newest version (latest { num_versions: 1 }) unless `specific` lists others.
  std::vector<int64_t> specific_versions;
  /// Triton's model_warmup, in config order.
  std::vector<warmup_sample> warmup;
  /// Triton's default_model_filename: the file in each version directory that
  /// holds the model. Empty: the backend's default ("model.onnx").
  std::string default_model_filename;
  /// Triton's `response_cache { enable: true }`: this model's successful
  /// responses may be answered from the server's response cache (used only
  /// when the server has one: --cache-config local,size=N).
  bool response_cache_enabled = false;
  /// Triton's `model_transaction_policy { decoupled: true }`: any number of
  /// responses per request. Served for generative decoders (issue 34), which
  /// stream their tokens; a load error for any other model.
  bool decoupled = false;
};

} // namespace caf_serving
