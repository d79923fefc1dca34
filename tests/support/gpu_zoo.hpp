#pragma once
/// The GPU executor's target models as CI fixtures (tests/gpu/zoo, written by
/// tools/gpu_target_models.py): ResNet-18/50, MobileNetV2/V3, EfficientNet-B0,
/// ViT-B/16, BERT-base, DistilBERT, MiniLM and GPT-2 at their real sizes, with
/// the weights stripped. Each fixture commits config.pbtxt, 1/model.onnx (every
/// initializer above 64 KiB is external data in 1/weights.bin) and weights.size
/// (that file's length) and weights.stats (each external tensor's offset,
/// length, mean and standard deviation); the weights' bytes are not committed.
///
/// stage_gpu_zoo_model() copies a fixture into a test's directory and creates
/// 1/weights.bin there, by default as a sparse file of the recorded length: all
/// zeros, no disk blocks, and the importer memory-maps it like real weights.
/// Zeros are fine for planning and for every pass: a plan is decided by the
/// operators and the shapes, which the model file holds in full, and the
/// constants whose values a pass reads (shape tensors, axes, scalars, masks'
/// constants, LayerNorm's epsilon) stay inline with their real values. Only
/// the numbers a plan computes are meaningless. For a run that computes (the
/// CUDA backend against the CPU backend on a device), zoo_weights::
/// pseudo_random writes each tensor as deterministic uniform values with the
/// real weights' mean and deviation, so activations keep realistic magnitudes
/// and both backends see the same model; comparing with ONNX Runtime's
/// references needs the real weights.bin (tools/gpu_target_models.py --out).
///
/// Usage (no Python at test time):
///
///     for (const auto& name : gpu_zoo_models()) {
///       auto dir = stage_gpu_zoo_model(name, fs::current_path() / "zoo");
///       if (!dir) FAIL(dir.error().message);
///       load(*dir / "config.pbtxt", *dir / "1/model.onnx");
///     }

#include "core/error.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace caf_serving::testing {

/// The committed fixtures: $CAF_SERVING_GPU_ZOO_DIR, else tests/gpu/zoo in the
/// source tree this was built from.
std::filesystem::path gpu_zoo_dir();

/// The fixtures' names (directories of gpu_zoo_dir() holding a config.pbtxt),
/// sorted.
std::vector<std::string> gpu_zoo_models();

/// What stage_gpu_zoo_model() writes into 1/weights.bin.
enum class zoo_weights {
  /// A sparse file (a hole): zeros, no disk blocks, instant. For planning.
  zeros,
  /// Every tensor of weights.stats as uniform values with its mean and
  /// standard deviation, the same for the same seed (writes the whole file:
  /// GPT-2's is 652 MB).
  pseudo_random,
};

struct gpu_zoo_stage_config {
  zoo_weights weights = zoo_weights::zeros;
  /// pseudo_random only.
  uint64_t seed = 20;
};

/// Copies fixture `name` to `dest_root`/`name` (config.pbtxt, 1/model.onnx;
/// whatever was there is replaced) and creates 1/weights.bin there, of
/// weights.size bytes, as `cfg` says; returns that model directory. Errors
/// (bad_request) name the fixture and what is missing or malformed.
result<std::filesystem::path> stage_gpu_zoo_model(const std::string& name,
                                                  const std::filesystem::path& dest_root,
                                                  const gpu_zoo_stage_config& cfg = {});

/// One line of weights.stats: an external tensor of the real model.
struct zoo_tensor_stats {
  std::string name;
  /// ONNX's element type name; the tool writes FLOAT only.
  std::string type;
  uint64_t offset = 0;
  uint64_t length = 0;
  double mean = 0;
  double stddev = 0;
};

/// Fixture `name`'s weights.stats, in file order.
result<std::vector<zoo_tensor_stats>> gpu_zoo_weights_stats(const std::string& name);

/// The length weights.size records for fixture `name`.
result<uint64_t> gpu_zoo_weights_size(const std::string& name);

} // namespace caf_serving::testing
