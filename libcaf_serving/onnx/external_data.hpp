#pragma once
/// Tensors whose bytes live outside model.onnx: exporters write a large
/// model's weights to `model.onnx.data` (or one file per tensor) next to it,
/// and each TensorProto names its file, offset and length.
///
/// Each file is memory-mapped read-only once; every constant read from it
/// views the mapping (tensor_bytes::view), which stays mapped while any graph
/// or plan holds one of those constants. Nothing is copied unless a tensor's
/// offset is not aligned for its element type.
///
/// The locations come from the model file, so they are checked before any
/// file is opened: a location is a relative path inside the model's
/// directory. Absolute paths, '..' components, symbolic links that lead
/// outside the directory and ranges past a file's end are refused.
///
/// Usage:
///
///     external_files files(model_path.parent_path());
///     auto bytes = files.read({"model.onnx.data", 0, 4096}, 4096, 4, "w");
///     if (!bytes) return bytes.error(); // says what is wrong and how to fix it

#include "core/error.hpp"
#include "onnx/ir.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace caf_serving::onnx {

/// One tensor's external_data entries ("location", "offset", "length").
struct external_location {
  std::string location;
  uint64_t offset = 0;
  /// Absent: to the end of the file.
  std::optional<uint64_t> length;
};

/// The external data files of one model directory.
class external_files {
public:
  /// `model_dir` is the directory holding model.onnx; locations resolve
  /// inside it.
  explicit external_files(std::filesystem::path model_dir);

  /// The `bytes` bytes of tensor `tensor` at `where`, which must hold exactly
  /// that many; `align` is the element size (a misaligned range is copied).
  /// Errors (bad_request) name the tensor and the location.
  result<tensor_bytes> read(const external_location& where, size_t bytes, size_t align,
                            const std::string& tensor);

private:
  struct mapping;
  result<std::shared_ptr<const mapping>> open(const std::string& location,
                                              const std::string& tensor);

  std::filesystem::path dir_;
  std::map<std::filesystem::path, std::shared_ptr<const mapping>> files_;
};

} // namespace caf_serving::onnx
