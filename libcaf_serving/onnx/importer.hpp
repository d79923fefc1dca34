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
/// 28 is the newest opset of onnx 1.23.2; op_registry.cpp lists every operator's
/// versions up to it.
inline constexpr int64_t max_opset = 28;

/// Every ONNX operator the engine can run at some opset, sorted (op_registry.hpp
/// has their versions).
const std::vector<std::string>& supported_operators();

/// Parses `path`. Fails (bad_request) for a missing, truncated or non-ONNX file,
/// an opset outside [min_opset, max_opset], an operator that the registry
/// (op_registry.hpp) has no version of at the model's opset, a non-default
/// operator domain, or a node whose attributes the selected operator version
/// does not define as the engine runs it (check_node_version()).
result<graph> import_model(const std::filesystem::path& path);

/// The same, from bytes in memory; `origin` names them in errors.
result<graph> import_model_bytes(const std::string& bytes, const std::string& origin);

} // namespace caf_serving::onnx
