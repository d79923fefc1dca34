#pragma once
/// Scans a model repository in Triton's layout:
///
///     <repo>/<model>/config.pbtxt
///     <repo>/<model>/<version>/model.onnx     (version: a decimal number)
///
/// and tells, per model, which versions to serve (per its version_policy) and
/// its configuration, or why it cannot load. A broken model never stops the
/// others: its entry carries the error instead of a config.
///
/// Usage:
///
///     auto models = repository::scan_repository("/models", {});
///     if (!models) fail(models.error().message);   // no such repository
///     for (auto& m : *models)
///       if (m.config) start(m); else log(m.config.error().message);
///
///     auto again = repository::load_model_config("/models", "resnet", {});

#include "core/error.hpp"
#include "repository/config_parser.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::repository {

/// How the repository is read.
struct scan_config {
  /// Passed on to parse_context::allow_missing_io. When set, a model directory
  /// without config.pbtxt loads as if the file were empty, for loaders that
  /// complete the configuration from the model file.
  bool allow_missing_io = false;
};

/// One model directory and what became of it.
struct model_entry {
  /// The directory name, which is the model's name.
  std::string name;
  std::filesystem::path model_dir;
  /// The versions to serve, ascending, and their directories (same order).
  /// Empty when the model failed to load.
  std::vector<int64_t> versions;
  std::vector<std::filesystem::path> version_dirs;
  /// The configuration, or the reason the model cannot load (a bad config, a
  /// missing version directory or label file, ...).
  result<parsed_model_config> config;
};

/// Every model directory in `repo` (hidden directories and plain files are
/// skipped), sorted by name. Fails only when `repo` itself cannot be read.
result<std::vector<model_entry>>
scan_repository(const std::filesystem::path& repo, const scan_config& cfg);

/// One model, for a load or reload request. The entry's config is
/// `not_found` when `repo/name` is no directory, and `bad_request` when
/// `name` is not a plain directory name (contains '/', "..", ...).
model_entry load_model_config(const std::filesystem::path& repo,
                              std::string_view name, const scan_config& cfg);

/// The numeric subdirectories of a model directory, ascending. Other entries
/// are ignored, as Triton ignores them.
std::vector<int64_t> list_versions(const std::filesystem::path& model_dir);

/// The versions that `policy` selects from `available` (ascending), or an
/// error naming the versions that `specific` asks for and that do not exist.
/// `model` names the model in that message.
result<std::vector<int64_t>>
select_versions(const version_policy& policy,
                const std::vector<int64_t>& available, std::string_view model);

} // namespace caf_serving::repository
