#pragma once
/// The bodies of Triton's model control requests, read into what the model
/// manager takes:
///
///     POST /v2/repository/models/{m}/load
///       {"parameters": {"config": "<ModelConfig as JSON>",
///                       "file:1/model.onnx": "<base64>", ...}}
///     POST /v2/repository/models/{m}/unload
///       {"parameters": {"unload_dependents": true}}
///
/// An empty body asks for a plain load or unload. Every load parameter is a
/// JSON string; a name other than "config" and "file:<path>" is refused with
/// Triton's "Unrecognized load parameter" message. Unload parameters other than
/// unload_dependents are ignored, as Triton ignores them. Only the JSON is
/// read here (on the event loop): the files are decoded and written, and the
/// config checked, on the model manager's loader thread.

#include "core/error.hpp"
#include "server/model_directory.hpp"

#include <string_view>

namespace caf_serving::ingress {

result<server::load_parameters> parse_load_request(std::string_view body);

result<server::unload_parameters> parse_unload_request(std::string_view body);

} // namespace caf_serving::ingress
