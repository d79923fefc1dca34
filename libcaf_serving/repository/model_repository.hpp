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

// -- model control (load parameters, polling) ----------------------------------

/// One model from `model_dir` with a configuration given by the caller (a load
/// request's "config" parameter) instead of the directory's config.pbtxt. The
/// versions and label files are checked as for config.pbtxt.
model_entry load_model_with_config(const std::filesystem::path& model_dir,
                                   std::string_view name, parsed_model_config config);

/// The plain model directory names in `repo`, sorted (what scan_repository
/// would load), without reading any of them; empty when `repo` is unreadable.
std::vector<std::string> list_model_names(const std::filesystem::path& repo);

/// A digest of everything under `model_dir` (each file's and directory's
/// relative path, type, size and modification time): it changes when a file
/// or version is added, removed, rewritten or touched. Polling compares it to
/// tell which models changed. 0 when `model_dir` is no directory.
uint64_t model_fingerprint(const std::filesystem::path& model_dir);

} // namespace caf_serving::repository
