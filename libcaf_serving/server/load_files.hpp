#pragma once
/// Model files sent with a load request (Triton's `file:<path>` load
/// parameters, base64) written into a fresh directory of their own, from which
/// the model then loads instead of from the repository.
///
/// The request decides only names below that directory: a path is relative,
/// has no "." or ".." component, and every directory and file on it is created
/// here (never followed through a link), so nothing outside the directory is
/// ever written. The total size is bounded (load_files_config).
///
/// Usage:
///
///     load_files_config cfg;                      // the system temp dir, 256 MiB
///     auto dir = write_load_files({{"1/model.onnx", base64_text}}, cfg);
///     if (!dir) fail(dir.error());                // says which file and why
///     load_from((*dir)->path());                  // removed with the last owner

#include "core/error.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace caf_serving::server {

struct load_files_config {
  /// Where each load's directory is made; empty: the system's temp directory
  /// (TMPDIR, else /tmp).
  std::filesystem::path parent;
  /// Most decoded bytes that one load request may write (--model-load-max-file-bytes).
  uint64_t max_total_bytes = uint64_t{256} << 20;
};

/// One `file:<path>` parameter as it came: the path after "file:" and the
/// base64 text.
struct load_file {
  std::string path;
  std::string base64;
};

/// A directory made for one load, removed with everything in it when the last
/// owner (a served pipeline, or the load itself) lets it go.
class load_directory {
public:
  explicit load_directory(std::filesystem::path path) : path_(std::move(path)) {}
  ~load_directory();
  load_directory(const load_directory&) = delete;
  load_directory& operator=(const load_directory&) = delete;
  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

/// Why `path` may not name a file of a load, or nothing when it may.
std::optional<std::string> check_load_file_path(std::string_view path);

/// Standard base64 (RFC 4648, '=' padding optional), or a bad_request saying
/// where it stops being base64.
result<std::string> decode_base64(std::string_view text);

/// Makes a fresh directory under cfg.parent and writes every file into it.
/// Errors: bad_request for text that is not base64, payload_too_large past
/// cfg.max_total_bytes, internal for a path that is refused or cannot be
/// written (Triton's class for them; the message says which).
result<std::shared_ptr<const load_directory>>
write_load_files(const std::vector<load_file>& files, const load_files_config& cfg);

} // namespace caf_serving::server
