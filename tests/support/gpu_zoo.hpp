#pragma once
/// The GPU executor's target models as CI fixtures (tests/gpu/zoo, written by
/// tools/gpu_target_models.py): ResNet-18/50, MobileNetV2/V3, EfficientNet-B0,
/// ViT-B/16, BERT-base, DistilBERT, MiniLM and GPT-2 at their real sizes, with
/// the weights stripped. Each fixture commits config.pbtxt, 1/model.onnx (every
/// initializer above 64 KiB is external data in 1/weights.bin) and weights.size
/// (that file's length); the weights' bytes are not committed.
///
/// stage_gpu_zoo_model() copies a fixture into a test's directory and creates
/// 1/weights.bin as a sparse file of the recorded length: all zeros, no disk
/// blocks, and the importer memory-maps it like real weights. Zeros are fine
/// for planning and for every pass: a plan is decided by the operators and the
/// shapes, which the model file holds in full, and the constants whose values
/// a pass reads (shape tensors, axes, scalars, masks' constants, LayerNorm's
/// epsilon) are under 64 KiB, so they stay inline with their real values. Only
/// the numbers a plan computes are meaningless; a run that compares outputs
/// needs the real weights.bin, which the tool writes next to its references.
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

/// The committed fixtures (tests/gpu/zoo in the source tree).
std::filesystem::path gpu_zoo_dir();

/// The fixtures' names (directories of gpu_zoo_dir() holding a config.pbtxt),
/// sorted.
std::vector<std::string> gpu_zoo_models();

/// Copies fixture `name` to `dest_root`/`name` (config.pbtxt, 1/model.onnx;
/// whatever was there is replaced) and creates 1/weights.bin there as a sparse
/// file of weights.size bytes; returns that model directory. Errors
/// (bad_request) name the fixture and what is missing or malformed.
result<std::filesystem::path> stage_gpu_zoo_model(const std::string& name,
                                                  const std::filesystem::path& dest_root);

/// The length weights.size records for fixture `name`.
result<uint64_t> gpu_zoo_weights_size(const std::string& name);

} // namespace caf_serving::testing
