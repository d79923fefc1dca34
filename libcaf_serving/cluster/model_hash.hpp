#pragma once
/// What a server and its workers compare before a worker serves a model: a hash
/// of the model's directory (config.pbtxt, version directories, model files,
/// labels), and the model files shipped to a worker that has no copy.

#include "cluster/protocol.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace caf_serving::cluster {

/// SHA-256 (hex) over every regular file under `dir`, in the order of their
/// relative paths: each path, its size and its bytes. Two directories hash the
/// same exactly when they hold the same files with the same contents, wherever
/// they are and whatever their timestamps. A model loaded with a "config" load
/// parameter (model_pipeline::config_override; empty: none) runs that
/// configuration, not its config.pbtxt alone, so the override is hashed after
/// the files: a config-only load changes the hash although no file changed.
/// Fails when `dir` cannot be read.
result<std::string> hash_model_dir(const std::filesystem::path& dir,
                                   const std::string& config_override = {});

/// Every regular file under `dir` with its path relative to it. Fails when
/// they add up to more than `max_bytes` (the error names the flag to raise).
result<std::vector<model_file>> read_model_files(const std::filesystem::path& dir,
                                                 uint64_t max_bytes);

/// Writes `files` as the directory `dir`, replacing what was there: into a
/// sibling directory first, renamed over `dir` once complete, so that a load
/// never sees half a model. A path that is absolute, holds "..", or is empty
/// is refused.
result<std::filesystem::path> write_model_files(const std::filesystem::path& dir,
                                                const std::vector<model_file>& files);

} // namespace caf_serving::cluster
