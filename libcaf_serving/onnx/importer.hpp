#pragma once
/// Reads an ONNX file (protobuf ModelProto, via Debian's libonnx) into the graph IR.
///
/// Usage:
///
///     auto g = onnx::import_model("/models/resnet/1/model.onnx");
///     if (!g) log(g.error().message); // names the file, and the node, operator and
///                                      // opset that cannot be served
///
/// The generated protobuf types stay inside importer.cpp.

#include "core/error.hpp"
#include "onnx/ir.hpp"

#include <filesystem>
#include <string>
#include <vector>

namespace caf_serving::onnx {

/// The default-domain opsets the engine implements.
inline constexpr int64_t min_opset = 13;
inline constexpr int64_t max_opset = 17;

/// Every ONNX operator the engine can run, sorted.
const std::vector<std::string>& supported_operators();

/// Parses `path`. Fails (bad_request) for a missing, truncated or non-ONNX file,
/// an opset outside [min_opset, max_opset], an operator outside
/// supported_operators(), or a non-default operator domain.
result<graph> import_model(const std::filesystem::path& path);

/// The same, from bytes in memory; `origin` names them in errors.
result<graph> import_model_bytes(const std::string& bytes, const std::string& origin);

} // namespace caf_serving::onnx
